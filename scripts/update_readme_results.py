"""Write the README's findings, quality, families, kvpress and retrieval paragraphs from the committed records and CSVs.

    python scripts/update_readme_results.py

Replaces the blocks between ``<!-- findings -->`` / ``<!-- /findings -->``, ``<!-- quality -->`` /
``<!-- /quality -->``, ``<!-- families -->`` / ``<!-- /families -->``, ``<!-- kvpress -->`` / ``<!-- /kvpress -->``
and ``<!-- retrieval -->`` / ``<!-- /retrieval -->``
with :func:`cmbench.paper.readme.blocks` (from the records under results/paper/, the same as
results/paper_findings.md, results/miniworld/quality_vs_memory.csv, results/miniworld/families_bytes*.csv and
results/miniworld/kvpress_*.csv and results/miniworld/retrieval_comparison*.csv, the boards' verdicts read from their verdict CSVs: docs/verdicts.md);
``tests/test_readme_results.py`` fails when README.md is out of date. Rerun it after `scripts/paper_findings.py
--copy-evidence`, new reference curves, `scripts/families_bytes.sh` or `scripts/board_verdicts.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

from cmbench.paper.readme import blocks, committed_page, with_blocks

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    os.chdir(ROOT)  # the records' paths are written relative to the repository
    readme = ROOT / "README.md"
    _, findings, second = committed_page()
    readme.write_text(with_blocks(readme.read_text(), blocks(Path("."), findings, second), "README.md"))
    print("README.md: findings, quality, families, kvpress and retrieval paragraphs written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
