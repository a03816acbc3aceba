"""Score against device KV bytes, one point per leaderboard entry, coloured by its family of KV compression
(:mod:`cmbench.report.families`): each entry's score with its 95% CI against its ``kv_bytes_ratio`` (the device KV
bytes it stored over FullKV's, in %), FullKV as a horizontal line with its CI band.

    python scripts/families_figure.py results/miniworld/families_bytes.csv results/miniworld/families_bytes.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cmbench.errors import CMBenchError
from cmbench.report.families import draw, read_board


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("board", type=Path, help="a leaderboard CSV (results/miniworld/families_bytes.csv)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        board = read_board(args.board)
    except (OSError, ValueError, CMBenchError) as err:
        print(f"families_figure: {err}", file=sys.stderr)
        return 2
    print(board.to_string(index=False, float_format="%.4f"))
    print(f"wrote {draw(board, args.out, args.title)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
