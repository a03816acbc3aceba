"""Write the methods table (generated from the method classes) into README.md and docs/methods.md.

    python scripts/update_method_tables.py

The section between ``<!-- methods -->`` and ``<!-- /methods -->`` of each file is replaced by
:func:`cmbench.methods.catalog.markdown_table`; ``tests/test_methods_registry.py`` fails when a file
is out of date.
"""

from __future__ import annotations

from pathlib import Path

from cmbench.methods.catalog import with_table

ROOT = Path(__file__).resolve().parent.parent
FILES = (ROOT / "README.md", ROOT / "docs" / "methods.md")


def main() -> int:
    for path in FILES:
        path.write_text(with_table(path.read_text(), str(path)))
        print(f"{path.relative_to(ROOT)}: methods table written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
