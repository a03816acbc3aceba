"""How much scoring the saved mp4 moves task scores, against scoring the lossless frames.

    python -m cmbench run method=decoprune task_ids=[...] out_dir=runs_frames
    python -m cmbench run method=decoprune task_ids=[...] out_dir=runs_mp4 score_source=mp4
    python scripts/score_source_difference.py runs_frames/miniworld/<run> runs_mp4/miniworld/<run>

Prints, over the tasks both runs finished: each run's mean score, the mean paired difference
(second minus first), the mean and largest absolute difference. The generation is the same in both
runs (same seeds, same code), so every difference comes from the scored frames.
"""

from __future__ import annotations

import argparse
import sys

from cmbench.errors import CMBenchError
from cmbench.report import read_records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", help="run scored from frames (score_source=frames)")
    parser.add_argument("second", help="the same run scored from its mp4 (score_source=mp4)")
    args = parser.parse_args(argv)
    try:
        first, second = (read_records(p).frame for p in (args.first, args.second))
    except CMBenchError as err:
        print(f"score_source_difference: error: {err}", file=sys.stderr)
        return 1
    ok = [f[f["status"] == "ok"].set_index(["task_id", "seed"])["score"] for f in (first, second)]
    a, b = ok[0].align(ok[1], join="inner")
    diff = b - a
    print(f"{len(diff)} tasks: first {a.mean():.4f}, second {b.mean():.4f}; difference {diff.mean():+.4f} "
          f"(mean |difference| {diff.abs().mean():.4f}, largest {diff.abs().max():.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
