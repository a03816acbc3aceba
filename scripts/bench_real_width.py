"""Real width on the CPU: Wan2.1-T2V-1.3B's DiT (Self-Forcing) with random weights at a few layers, each phase's
measured memory beside `plan`'s (cmbench/benchmarks/real_width.py).

    python scripts/bench_real_width.py                         # 1, 2, 4 layers x FullKV, DeCoPrune, KIVI-4
    python scripts/bench_real_width.py --layers 1 --arms FullKV --out /tmp/rw.md

Writes a markdown table (each case as it finishes) with the `plan` command of every case, then a fit of the
measured parts against the layer count and its extrapolation to 30 layers, stated as such. A case whose DiT
does not fit this machine's available memory is refused in one line before anything is built.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

from cmbench.benchmarks import real_width
from cmbench.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--arms", nargs="+", default=list(real_width.ARMS), choices=list(real_width.ARMS))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/real_width.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cases = [real_width.Case(n, arm, dtype=args.dtype) for n in args.layers for arm in args.arms]
    try:
        plans = {c: real_width.plan_of(c) for c in cases}
        for plan in plans.values():
            real_width.refuse_if_too_big(plan)
        extrapolated = {arm: real_width.plan_of(replace(next(c for c in cases if c.arm == arm),
                                                        layers=real_width.EXTRAPOLATE_LAYERS)) for arm in args.arms}
        lingbot = real_width.Case(40, args.arms[0], context_frames=4, dtype=args.dtype, device="cuda", seconds=0.75,
                                  backbone="lingbot_world_v2_14b")  # planned for its GPU, not built
        lingbot_plan = (lingbot, real_width.plan_of(lingbot))
    except ConfigError as err:
        print(f"bench_real_width: {err}", file=sys.stderr)
        return 2
    rows: list[real_width.Row] = []
    measured = []
    for layers in args.layers:
        backbone = real_width.build_backbone(next(c for c in cases if c.layers == layers))
        for case in (c for c in cases if c.layers == layers):
            m = real_width.measure(case, backbone)
            measured.append(m)
            rows += real_width.compare(m, plans[case])
            print(f"{case.layers} layers, {case.arm}: {m.seconds:.0f} s, PR {m.pr:.3f}", flush=True)
            args.out.write_text(real_width.report(rows, measured, args.threads, extrapolated, lingbot_plan))
        del backbone
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
