"""Headless Chromium for the HTML report: a screenshot from the command line, a driven page for tests.

Only Debian's ``chromium`` (and, for driving it, ``chromium-driver`` with selenium from PyPI) is
used; nothing is downloaded. Every start uses a fresh profile and the flags in
:data:`CHROMIUM_FLAGS`, which turn off first-run screens, background networking, component
updates and sync, so the browser itself fetches nothing either.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cmbench.errors import CMBenchError

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")
INSTALL_HINT = "install Debian's browser: apt-get install -y chromium chromium-driver"


class BrowserError(CMBenchError):
    """Chromium (or its driver) is missing or failed."""


def chromium() -> str:
    """Path of the ``chromium`` executable."""
    path = shutil.which("chromium")
    if path is None:
        raise BrowserError(f"chromium not found on PATH; {INSTALL_HINT}")
    return path


def chromedriver() -> str:
    """Path of the ``chromedriver`` executable (Debian package ``chromium-driver``)."""
    path = shutil.which("chromedriver")
    if path is None:
        raise BrowserError(f"chromedriver not found on PATH; {INSTALL_HINT}")
    return path


def screenshot(page: Path, out: Path, view: str = "", width: int = 1400, height: int = 1800,
               timeout: float = 120.0) -> Path:
    """Render ``page`` (a local HTML file) in headless Chromium and save the window as PNG.

    ``view`` is the URL fragment to open (the report reads ``method=X&source=Y&type=Z`` from it and
    shows the gallery so filtered). Chromium's ``--screenshot`` waits for the page's load event.
    """
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cmbench-chromium-") as profile:
        cmd = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--hide-scrollbars",
               f"--window-size={width},{height}", f"--screenshot={out}",
               Path(page).resolve().as_uri() + (f"#{view}" if view else "")]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise BrowserError(f"chromium took over {timeout:.0f} s to render {page}") from err
    if done.returncode or not out.is_file():
        raise BrowserError(f"chromium could not screenshot {page} (exit {done.returncode}): {done.stderr[-500:]}")
    return out


@contextmanager
def driven_page(page: Path, width: int = 1400, height: int = 1000, offline: bool = True) -> Iterator[Any]:
    """A selenium ``webdriver.Chrome`` on ``page`` with console and network logging on.

    Parameters
    ----------
    page : a local HTML file
    offline : emulate a disconnected network before the page loads

    Yields
    ------
    The driver, after the page's load event; ``driver.get_log("browser")`` holds console messages and
    ``driver.get_log("performance")`` the DevTools network events.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="cmbench-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium()
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver()), options=options)
        try:
            if offline:
                driver.execute_cdp_cmd("Network.enable", {})
                driver.execute_cdp_cmd("Network.emulateNetworkConditions", {
                    "offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
            driver.get(Path(page).resolve().as_uri())
            yield driver
        finally:
            driver.quit()
