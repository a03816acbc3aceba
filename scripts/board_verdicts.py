"""Write a board's verdict CSV beside it: the claims it states, decided as one family (docs/verdicts.md).

    python scripts/board_verdicts.py families results/miniworld/families_bytes.csv \
        results/miniworld/families_bytes_comparisons.csv results/miniworld/families_bytes_verdicts.csv
    python scripts/board_verdicts.py kvpress results/miniworld/kvpress_leaderboard.csv \
        results/miniworld/kvpress_comparisons.csv results/miniworld/kvpress_verdicts.csv
    python scripts/board_verdicts.py --committed      # both committed boards, as above
    python scripts/board_verdicts.py --docs           # rewrite docs/verdicts.md's rules from the code

The claims of each board are :mod:`cmbench.report.board_claims`'; the rule and its correction
:mod:`cmbench.report.verdicts`. ``scripts/families_bytes.sh`` runs the first after it builds the board;
``scripts/update_readme_results.py`` reads the CSVs into the README.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cmbench.errors import CMBenchError
from cmbench.report import verdicts
from cmbench.report.board_claims import BOARDS, COMMITTED, board_verdicts

ROOT = Path(__file__).resolve().parent.parent
def write_one(kind: str, board: Path, pairs: Path, out: Path) -> None:
    decided = board_verdicts(kind, board, pairs)
    verdicts.write(decided, out)
    counts = {v: sum(d.verdict == v for d in decided) for v in (verdicts.HOLDS, verdicts.FAILS, verdicts.INCONCLUSIVE)}
    print(f"wrote {out}: {len(decided)} claims ({verdicts.correction_text(decided)}); "
          + ", ".join(f"{n} {v}" for v, n in counts.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", nargs="?", choices=sorted(BOARDS))
    parser.add_argument("paths", nargs="*", type=Path, metavar="BOARD PAIRS OUT")
    parser.add_argument("--committed", action="store_true", help="write the committed boards' verdict CSVs")
    parser.add_argument("--docs", action="store_true", help="rewrite docs/verdicts.md's rules section and exit")
    args = parser.parse_args(argv)
    if args.docs:
        docs = ROOT / "docs" / "verdicts.md"
        head, rest = docs.read_text().split("<!-- rules -->\n", 1)
        docs.write_text(f"{head}<!-- rules -->\n{verdicts.rules_section()}\n<!-- /rules -->{rest.split('<!-- /rules -->', 1)[1]}")
        print(f"wrote {docs}")
        return 0
    try:
        if args.committed:
            os.chdir(ROOT)
            for kind, (board, pairs, out) in COMMITTED.items():
                write_one(kind, board, pairs, out)
            return 0
        if args.kind is None or len(args.paths) != 3:
            parser.error("give KIND BOARD PAIRS OUT, or --committed")
        write_one(args.kind, *args.paths)
    except CMBenchError as err:
        print(f"board_verdicts: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
