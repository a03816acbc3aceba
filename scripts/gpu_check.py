"""The prepared GPU check: LingBot World v2 1.3B's shape with random weights, one H200, a few minutes, no download.

(a) a one-minute context prefilled and one continuation chunk with FullKV and DeCoPrune at 85% PR, offloads
    chosen by the memory plan; peak allocated memory within 10% of the plan, FPS and speed-up;
(b) a prefilled cache parked in host memory, and a cache wholly in host memory, give the resident output;
(c) bf16 with LingBot's float32 islands against float32 on one chunk.
(d) with --split under torchrun: the model split over the GPUs (Ulysses sequence parallelism) against one
    process: the same continuation, PR and kept tokens; each rank's peak K/V 1/P of one process's.
It asserts (exit 1 listing every failure). See cmbench/benchmarks/gpu_check.py.

    python scripts/gpu_check.py                 # on a GPU
    python scripts/gpu_check.py --tiny          # the same code on the CPU at tiny shapes
    python scripts/gpu_check.py --out check.json
    torchrun --nproc_per_node=4 scripts/gpu_check.py --split          # (d) on 4 GPUs
    torchrun --nproc_per_node=2 scripts/gpu_check.py --split --tiny   # (d) on the CPU (gloo)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from cmbench.benchmarks.gpu_check import run_check, run_split_check


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (what the test runs)")
    parser.add_argument("--out", type=Path, help="write the measured rows and failures as JSON")
    parser.add_argument("--split", action="store_true", help="(d) only, under torchrun: one model over the ranks")
    args = parser.parse_args()
    if not args.tiny and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; this is a GPU check (--tiny runs its code on the CPU)", file=sys.stderr)
        return 2
    torch.set_num_threads(1 if args.tiny else torch.get_num_threads())
    report = (run_split_check if args.split else run_check)("tiny" if args.tiny else "1.3b")
    if args.out:
        args.out.write_text(json.dumps({"rows": report.rows, "failures": report.failures}, indent=1, default=str))
    if report.failures:
        print("gpu_check: FAILED\n  " + "\n  ".join(report.failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
