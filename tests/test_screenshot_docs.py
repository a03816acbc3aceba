"""Where ``report.screenshot=`` is documented (the README's report section, docs/report.md's key table), the
page names both things it needs, with the install lines the error messages give: selenium through the
``browser`` extra and Debian's chromium with chromium-driver."""

from __future__ import annotations

from pathlib import Path

from cmbench.report.browser import INSTALL_HINT

ROOT = Path(__file__).resolve().parent.parent
BROWSER_EXTRA = "pip install -e '.[browser]'"
DEBIAN = INSTALL_HINT.split(": ", 1)[1]  # the apt-get line the missing-browser error prints


def screenshot_paragraph(page: Path) -> str:
    """The paragraph (or table row) of ``page`` whose text says ``report.screenshot=`` / ``| `report.screenshot` |``."""
    for paragraph in page.read_text().split("\n\n"):
        for line in paragraph.splitlines():
            if line.startswith("| `report.screenshot` |"):
                return line
        if "`report.screenshot=" in paragraph and "needs" in paragraph:
            return " ".join(paragraph.split())
    return ""


def test_the_readme_and_the_report_page_say_what_a_screenshot_needs():
    for page in (ROOT / "README.md", ROOT / "docs" / "report.md"):
        text = screenshot_paragraph(page)
        assert BROWSER_EXTRA in text and DEBIAN in text, page.name


def test_the_extra_named_is_the_one_that_installs_selenium():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'browser = ["selenium' in pyproject
