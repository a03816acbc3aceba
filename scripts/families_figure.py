"""Score against KV bytes, one curve per family member through its calibrated points, coloured by its family of KV
compression (:mod:`cmbench.report.families`): each entry's score with its 95% CI against its ``kv_bytes_ratio`` (the
device KV bytes it stored over FullKV's, in %: left) and against its device plus host-store bytes (right), in the
board's cache precision; FullKV as a horizontal line with its CI band. With ``--table``, also the board with where
each entry lands and its total memory (:func:`cmbench.report.families.memory_columns`).

    python scripts/families_figure.py runs/families/board/leaderboard.csv results/miniworld/families_bytes.png \
        --table results/miniworld/families_bytes.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cmbench.errors import CMBenchError
from cmbench.report.families import draw, memory_columns, read_board
from cmbench.report.reading import read_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("board", type=Path, help="a leaderboard CSV (results/miniworld/families_bytes.csv)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--title", default=None)
    parser.add_argument("--table", type=Path, default=None,
                        help="also write the board with the landing and memory columns here (a CSV)")
    args = parser.parse_args(argv)
    try:
        board = read_board(args.board)
        table = None if args.table is None else memory_columns(read_table(args.board, (), "leaderboard", "leaderboard"))
    except (OSError, ValueError, CMBenchError) as err:
        print(f"families_figure: {err}", file=sys.stderr)
        return 2
    if table is not None and args.table is not None:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.table, index=False, float_format="%.6g")
        print(f"wrote {args.table}")
    print(board.to_string(index=False, float_format="%.4f"))
    print(f"wrote {draw(board, args.out, args.title)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
