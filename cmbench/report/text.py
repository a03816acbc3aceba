"""Text that comes from run folders (labels, metric names), made safe for the pages CMBench writes."""

from __future__ import annotations

MARKDOWN_ESCAPES = {"\\": "\\\\", "|": "\\|", "`": "\\`", "*": "\\*", "&": "&amp;", "<": "&lt;", ">": "&gt;"}


def markdown_text(text: object) -> str:
    """A label as markdown text: table pipes, emphasis, code and HTML escaped (labels come from run folders)."""
    return "".join(MARKDOWN_ESCAPES.get(c, c) for c in str(text))
