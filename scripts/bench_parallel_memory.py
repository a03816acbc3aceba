"""Memory of a task's fork sharing the prefill, and of one model split over P CPU processes.

    python scripts/bench_parallel_memory.py            # writes results/bench_fork_memory.csv, bench_split_memory.csv
    python scripts/bench_parallel_memory.py --only fork

The fork: per method, the K/V bytes of a whole-copy fork and of a shared fork after a 4-chunk
continuation of a 24-chunk context, against the continuation's own chunks. The split: per method and
P = 2, 4, the largest per-rank peak of stored K/V over the one-process peak (target 1/P within 10%), on
the tiny MiniWorld model with a 16-chunk context (attention arithmetic skipped: bytes count positions).
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

from cmbench.benchmarks.parallel_memory import FORK_FIELDS, SPLIT_FIELDS, fork_rows, split_rows

# data-dependent thresholds see zero attention outputs here, so DeCoPrune runs in budget mode
METHODS = [{"name": "fullkv"}, {"name": "decoprune", "quota_pr": 0.85, "label": "decoprune@0.85"},
           {"name": "streaming"}, {"name": "tempdiff"}]


def write(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
    for row in rows:
        print(", ".join(f"{k}={row[k]}" for k in fields))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("fork", "split"), default=None)
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "fork"):
        write(args.out / "bench_fork_memory.csv", FORK_FIELDS, fork_rows(METHODS))
    if args.only in (None, "split"):
        write(args.out / "bench_split_memory.csv", SPLIT_FIELDS, split_rows(METHODS[:2] + METHODS[3:]))


if __name__ == "__main__":
    main()
