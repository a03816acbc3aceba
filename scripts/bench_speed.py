#!/usr/bin/env python
"""Continuation speed and memory of every KV-cache method on the tiny backbone, in one process.

Each method's continuation is timed in interleaved rounds beside FullKV's, and reported as a speed-up
against FullKV measured in the same run, next to a measured cost-model bound, the realised pruning
ratio, attention FLOPs, peak stored K/V and RSS; DeCoPrune's keep pattern is replayed as an oracle
mask to isolate what online scoring costs; the retrieval methods (worldkv, key_retrieval) add the bytes
they move host <-> device per generated chunk and a modelled transfer time (PCIe 4.0 x16, 25 GB/s). The measurement lives in :mod:`cmbench.benchmarks.speed`
(its docstring explains each step); docs/speed.md explains the cost model and the targets.

Outputs: a table on stdout, ``results/bench_speed.csv`` (one row per length and method, with the
machine, thread count and weights) and ``results/bench_speed.png`` (speed-up vs context length).

    .venv/bin/python scripts/bench_speed.py                           # 192, 384, 768 frames, 1 thread
    .venv/bin/python scripts/bench_speed.py --threads 1,2 --frames 768 --repeats 3 \\
        --methods fullkv,streaming,decoprune@0.85 --out-csv /tmp/t.csv --plot /tmp/t.png
    .venv/bin/python scripts/bench_speed.py --frames 192 --repeats 2  # a quick look

On a machine shared with other jobs use one thread (the default): a multi-threaded CPU kernel waits
for its second thread whenever another process holds that core, which puts a floor of several
milliseconds under every parallel op and hides what pruning saves (docs/speed.md).
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import numpy as np
import torch

from cmbench.backbones.tiny import DEFAULT_WEIGHTS
from cmbench.benchmarks.speed import (
    METHODS,
    REFERENCE,
    bench_length,
    build_tiny,
    check_targets,
    format_table,
    machine_info,
    markdown_table,
    plot,
    read_csv,
    reset_peak_rss,
    transfer_lines,
    write_csv,
)

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", default="192,384,768", help="context lengths in latent frames (multiples of 4)")
    p.add_argument("--continuation", type=int, default=16, help="latent frames generated per continuation")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (every method once per round)")
    p.add_argument("--threads", default="1",
                   help="torch intra-op threads; a list (1,2) times every thread count in the same rounds")
    p.add_argument("--methods", default=",".join(METHODS), help=f"labels among: {', '.join(METHODS)}")
    p.add_argument("--no-oracle", action="store_true", help="skip the oracle replay of DeCoPrune's keep pattern")
    p.add_argument("--oracle-pairs", type=int, default=10,
                   help="extra back-to-back DeCoPrune / oracle continuation pairs (first thread count)")
    p.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS, help="tiny model weights (random init if missing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-csv", type=Path, default=ROOT / "results" / "bench_speed.csv")
    p.add_argument("--plot", type=Path, default=ROOT / "results" / "bench_speed.png")
    p.add_argument("--from-csv", type=Path, default=None,
                   help="measure nothing: reprint the tables and redraw the plot from a CSV this script wrote")
    args = p.parse_args(argv)
    args.frame_list = [int(f) for f in args.frames.split(",")]
    args.thread_list = [int(t) for t in args.threads.split(",")]
    args.method_list = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(args.method_list) - set(METHODS))
    if unknown:
        p.error(f"unknown method label(s) {unknown}; known: {', '.join(METHODS)}")
    if REFERENCE not in args.method_list:
        args.method_list.insert(0, REFERENCE)
    if any(f <= 0 or f % 4 for f in args.frame_list) or min(args.thread_list) < 1:
        p.error("--frames must be positive multiples of the chunk (4 latent frames) and --threads >= 1")
    return args


def report(rows: list[dict], plot_path: Path) -> None:
    """Print the tables, the targets and the Markdown table; draw the plot."""
    print(format_table(rows))
    print()
    for threads in sorted({r["threads"] for r in rows}):
        for text in check_targets(rows, threads):
            print(text)
    for text in transfer_lines(rows):
        print(text)
    first = rows[0]
    print(f"\nmachine: {first['cpu']}, torch {first['torch']}, weights: {first['weights']}, git {first['git']}\n")
    print(markdown_table(rows))
    plot(rows, plot_path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_csv is not None:
        report(read_csv(args.from_csv), args.plot)
        print(f"\nredrew {args.plot} from {args.from_csv}")
        return 0
    torch.set_num_threads(args.thread_list[0])
    backbone, weights = build_tiny(args.weights, args.seed)
    machine = machine_info(weights)
    print(f"machine: {machine['cpu']}; torch {machine['torch']}; intra-op threads {args.thread_list} "
          f"(set with --threads); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"weights: {weights}")
    print(f"contexts {args.frame_list} latent frames, continuation {args.continuation} frames, "
          f"{args.repeats} interleaved rounds; methods {args.method_list}", flush=True)
    if not reset_peak_rss():
        print("note: /proc/self/clear_refs is not writable; peak RSS is the process peak so far")
    rng = np.random.default_rng(args.seed)
    rows: list[dict] = []
    for frames in args.frame_list:
        rows += bench_length(backbone, frames, methods=args.method_list, continuation=args.continuation,
                             seed=args.seed, thread_counts=args.thread_list, repeats=args.repeats,
                             oracle=not args.no_oracle, oracle_pair_count=args.oracle_pairs, rng=rng,
                             machine=machine)
        gc.collect()
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    write_csv(rows, args.out_csv)
    report(rows, args.plot)
    print(f"\nwrote {args.out_csv} and {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
