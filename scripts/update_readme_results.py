"""Write the README's generated paragraphs and tables: each from a file or records committed in results/.

    python scripts/update_readme_results.py
    python scripts/update_readme_results.py results/miniworld/leaderboard.md --marker miniworld

Without a table: replaces the blocks between ``<!-- findings -->`` / ``<!-- /findings -->``, ``<!-- quality -->`` /
``<!-- /quality -->``, ``<!-- families -->`` / ``<!-- /families -->``, ``<!-- kvpress -->`` / ``<!-- /kvpress -->``
and ``<!-- retrieval -->`` / ``<!-- /retrieval -->``
with :func:`cmbench.paper.readme.blocks` (from the records under results/paper/, the same as
results/paper_findings.md, results/miniworld/quality_vs_memory.csv, results/miniworld/families_bytes*.csv and
results/miniworld/kvpress_*.csv and results/miniworld/retrieval_comparison*.csv, the boards' verdicts read from their verdict CSVs: docs/verdicts.md).
Rerun it after `scripts/paper_findings.py --copy-evidence`, new reference curves, `scripts/families_bytes.sh` or
`scripts/board_verdicts.py`.

With a table: replaces the block between ``<!-- results:MARKER -->`` and ``<!-- /results:MARKER -->`` with the
table (:data:`cmbench.paper.readme.RESULT_TABLES`: the reference leaderboard, the PR at the paper's scale, the
speed benchmark). ``tests/test_readme_results.py`` fails when any block is out of date.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cmbench.paper.readme import RESULT_TABLES, blocks, committed_page, with_blocks, with_table

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", nargs="?", type=Path, help="a markdown table for a <!-- results:MARKER --> block")
    parser.add_argument("--marker", default="miniworld", choices=sorted(RESULT_TABLES),
                        help="the block the table goes into (default miniworld)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)  # the records' paths are written relative to the repository
    readme = ROOT / "README.md"
    if args.table is not None:
        readme.write_text(with_table(readme.read_text(), args.marker, args.table.read_text(), "README.md"))
        print(f"README.md: the {args.marker} results replaced from {args.table}")
        return 0
    _, findings, second = committed_page()
    readme.write_text(with_blocks(readme.read_text(), blocks(Path("."), findings, second), "README.md"))
    print("README.md: findings, quality, families, kvpress and retrieval paragraphs written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
