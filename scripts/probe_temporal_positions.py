#!/usr/bin/env python
"""Does a tiny model use its temporal positions? Held-out clip loss under altered positions, q/k energy.

For fixed teacher-forced batches of held-out clips (the training script's ``make_batch`` on scenes
drawn from ``--seed``, which no training run uses), the x0 MSE of all, recent, retrieval and novel
token columns with every clip's temporal positions set to: true time (stride 1), a 200-frame span
(stride 6.5, like a 192-frame context), the RoPE re-index's squeezed stride (0.05), the frames in
reversed order, and a random permutation of the frames. A model that uses time (as real video
models do) predicts worse when the positions lie; one that does not gives the same numbers in every
row. The factor is each row's MSE over the true-time MSE. Also printed: the share of the RMS-normed
query / key energy in each layer's temporal rotary channels (uniform share: temporal channels / head
dim).

Usage::

    python scripts/probe_temporal_positions.py [WEIGHTS.safetensors ...] [--world dynamic] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cmbench.backbones.tiny import TinyWorldModel  # noqa: E402
from cmbench.backbones.tiny_probe import COLUMNS, probe  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("weights", nargs="*", type=Path, help="weights files (default: the committed default weights)")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=123, help="seeds the held-out clips (training uses 0..)")
    ap.add_argument("--world", choices=("static", "dynamic"), default="dynamic")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    report = {}
    for path in args.weights or [None]:
        model = TinyWorldModel.from_pretrained(path)
        losses, shares = probe(model, args.batches, args.seed, args.world == "dynamic")
        true = np.array(losses["true (stride 1)"])
        print(f"{path or 'default weights'} on {args.batches} batches of 3 held-out {args.world} clips (seed {args.seed})")
        print("| temporal positions | MSE all | recent | retrieval | novel | factor (all) |\n|---|---|---|---|---|---|")
        for name, values in losses.items():
            print(f"| {name} | " + " | ".join(f"{v:.5f}" for v in values) + f" | {values[0] / true[0]:.2f}x |")
        uniform = model.config.rope_spec().t.dim / model.config.dit.head_dim
        print("temporal share of q / k energy per layer: "
              + ", ".join(f"{q:.3f} / {k:.3f}" for q, k in shares) + f" (uniform {uniform:.3f})\n")
        report[str(path or "default")] = {"world": args.world, "seed": args.seed, "batches": args.batches,
                                          "columns": COLUMNS, "mse": losses,
                                          "factor_all": {k: v[0] / true[0] for k, v in losses.items()},
                                          "temporal_qk_share": shares, "uniform_share": uniform}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
