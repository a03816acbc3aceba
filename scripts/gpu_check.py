"""The one GPU check: what a short GPU loan runs whole, judged against what is committed beside this script.

(a) LingBot World v2 1.3B's shape with random weights, a one-minute context prefilled and one chunk generated
    with FullKV and DeCoPrune at 85% PR, offloads chosen by the memory plan; peak allocated memory within 10%
    of the plan, FPS and speed-up;
(b) a prefilled cache parked in host memory, and a cache wholly in host memory, give the resident output;
(c) bf16 with LingBot's float32 islands against float32 on one chunk;
(e) real width: the Self-Forcing DiT (1536 wide) at 1, 2, 4 layers, FullKV, DeCoPrune and KIVI-4, each phase
    metered by the CUDA allocator beside `plan` for CUDA, that plan equal to gpu_check_expected.json's;
(f) KIVI-4 attention time against full precision over LingBot's one-minute history (target 1.3x), and block
    attention on CUDA's fused kernels equal to one SDPA call;
(g) the scorer's self-check (tiny random models; real weights: scripts/gpu_check_scorer.py);
(h) a 2-task MiniWorld run (DeCoPrune, the tiny model) on CUDA equal to the committed CPU records.
(d) with --split under torchrun: the model split over the GPUs against one process (not in the default run).
It prints one table, writes it (gpu_check.md, gpu_check.json) under --out, and exits 1 listing every failure.
See cmbench/benchmarks/gpu_check.py and cmbench/benchmarks/gpu_loan.py.

    python scripts/gpu_check.py --out $OUT                 # on a GPU: every part, a few minutes on one H100
    python scripts/gpu_check.py --out $OUT --parts ef      # only (e) and (f) (a rerun of what failed)
    python scripts/gpu_check.py --tiny --out /tmp/check    # the same code on the CPU at tiny shapes (CI)
    python scripts/gpu_check.py --write-expected           # recompute gpu_check_expected.json (on a CPU)
    torchrun --nproc_per_node=4 scripts/gpu_check.py --split          # (d) on 4 GPUs
    torchrun --nproc_per_node=2 scripts/gpu_check.py --split --tiny   # (d) on the CPU (gloo)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from cmbench.benchmarks.gpu_check import PARTS, run_check, run_split_check
from cmbench.benchmarks.gpu_loan import EXPECTED, write_expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (what the test runs)")
    parser.add_argument("--out", type=Path, help="folder for gpu_check.md and gpu_check.json (and (h)'s run)")
    parser.add_argument("--parts", default=PARTS, help=f"letters of the parts to run (default {PARTS})")
    parser.add_argument("--split", action="store_true", help="(d) only, under torchrun: one model over the ranks")
    parser.add_argument("--write-expected", action="store_true",
                        help=f"recompute {EXPECTED.name} (plans and the CPU MiniWorld records) and exit")
    args = parser.parse_args()
    if args.write_expected:
        torch.set_num_threads(1)  # the tiny check's: a CPU plan's attention workspace counts torch's threads
        write_expected(EXPECTED)
        print(f"gpu_check: wrote {EXPECTED}")
        return 0
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        print(f"gpu_check: --parts {args.parts!r}: no part {unknown[0]!r} (the parts are {PARTS})", file=sys.stderr)
        return 2
    if not args.tiny and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; this is a GPU check (--tiny runs its code on the CPU)", file=sys.stderr)
        return 2
    torch.set_num_threads(1 if args.tiny else torch.get_num_threads())
    name = "tiny" if args.tiny else "1.3b"
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    report = run_split_check(name) if args.split else run_check(name, args.parts, args.out)
    print("\n" + report.markdown())
    if args.out:
        (args.out / "gpu_check.md").write_text(report.markdown())
        (args.out / "gpu_check.json").write_text(json.dumps({"rows": report.rows, "table": report.table,
                                                              "failures": report.failures}, indent=1, default=str))
    if report.failures:
        print("gpu_check: FAILED\n  " + "\n  ".join(report.failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
