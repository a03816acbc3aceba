"""How much the leaderboard's ranking moves between the mean and the max of the references' best scores.

    python scripts/reference_aggregation_ranking.py RUN_DIR [RUN_DIR ...] [--allow-mixed]

Reads the runs as ``python -m cmbench leaderboard`` does, once with ``leaderboard.reference_aggregation=
mean`` and once with ``max``, and prints each method's score and rank under both and a summary line
(methods whose rank moved, the largest move, Kendall's tau between the rankings, and how many tasks
have more than one reference: with one reference the two aggregations are the same number).
"""

from __future__ import annotations

import argparse
import sys

from cmbench.benchmarks.reference_aggregation import ranking_shift
from cmbench.errors import CMBenchError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (or score output folders)")
    parser.add_argument("--allow-mixed", action="store_true", help="report runs of different task sets together")
    args = parser.parse_args(argv)
    try:
        table, summary = ranking_shift(args.runs, args.allow_mixed)
    except CMBenchError as err:
        print(f"reference_aggregation_ranking: error: {err}", file=sys.stderr)
        return 1
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"\n{summary['methods']} methods, {summary['tasks']} scored tasks of which {summary['multi_reference_tasks']} "
          f"have more than one reference; {summary['moved']} method(s) change rank (largest move "
          f"{summary['max_rank_change']}); Kendall tau {summary['kendall_tau']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
