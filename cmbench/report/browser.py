"""Headless Chromium for the HTML report: a driven page (for its browser test) and screenshots.

Only Debian's ``chromium`` and ``chromium-driver``, driven by selenium from PyPI (the ``browser``
and ``test`` extras), are used; nothing is downloaded. Every start uses a fresh profile and the flags in
:data:`CHROMIUM_FLAGS`, which turn off first-run screens, background networking, component
updates and sync, so the browser itself fetches nothing either.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cmbench.errors import CMBenchError

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")
INSTALL_HINT = "install Debian's browser: apt-get install -y chromium chromium-driver"
# true once every image that intersects the window has loaded (lazy images outside it are not waited for)
VISIBLE_IMAGES_LOADED = """return document.readyState === "complete" && Array.from(document.images).every(i => {
  const r = i.getBoundingClientRect();
  return r.bottom <= 0 || r.top >= window.innerHeight || r.width === 0 || i.complete;
});"""


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
               timeout: float = 60.0) -> Path:
    """Open ``page`` (a local HTML file) in headless Chromium and save what the window shows as PNG.

    ``view`` is the URL fragment to open (the report reads ``method=X&source=Y&type=Z`` from it and
    scrolls to the gallery so filtered). The screenshot is taken once every image in the window has
    loaded.
    """
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with driven_page(page, width, height, view=view) as driver:
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(driver, timeout).until(lambda d: d.execute_script(VISIBLE_IMAGES_LOADED))
        if not driver.save_screenshot(str(out)):
            raise BrowserError(f"chromium could not screenshot {page}")
    return out


@contextmanager
def driven_page(page: Path, width: int = 1400, height: int = 1000, offline: bool = True, view: str = "") -> Iterator[Any]:
    """A selenium ``webdriver.Chrome`` on ``page`` with console and network logging on.

    Parameters
    ----------
    page : a local HTML file
    offline : emulate a disconnected network before the page loads
    view : URL fragment to open the page at

    Yields
    ------
    The driver, after the page's load event; ``driver.get_log("browser")`` holds console messages and
    ``driver.get_log("performance")`` the DevTools network events.
    """
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as err:
        raise BrowserError("driving chromium needs selenium: pip install 'cmbench[browser]'") from err

    with tempfile.TemporaryDirectory(prefix="cmbench-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium()
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "--hide-scrollbars"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver()), options=options)
        try:
            if offline:
                driver.execute_cdp_cmd("Network.enable", {})
                driver.execute_cdp_cmd("Network.emulateNetworkConditions", {
                    "offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
            driver.get(Path(page).resolve().as_uri() + (f"#{view}" if view else ""))
            yield driver
        finally:
            driver.quit()
