"""Put a generated markdown table into the README between its results markers.

    python scripts/update_readme_results.py results/miniworld/leaderboard.md [--marker miniworld]

The README section between ``<!-- results:MARKER -->`` and ``<!-- /results:MARKER -->`` is replaced
by the table, so the README never carries a number that no script produced.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("--marker", default="miniworld")
    args = parser.parse_args()
    text = README.read_text()
    start, end = f"<!-- results:{args.marker} -->", f"<!-- /results:{args.marker} -->"
    if start not in text or end not in text:
        raise SystemExit(f"README.md has no {start} ... {end} section")
    body = args.table.read_text().strip()
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    README.write_text(pattern.sub(lambda _: f"{start}\n{body}\n{end}", text))
    print(f"README.md: {args.marker} results replaced from {args.table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
