#!/usr/bin/env python
"""Does a tiny model use its temporal positions at all? Loss under altered positions, and q/k energy.

For fixed teacher-forced training batches (the training script's ``make_batch``, seeded), the x0 MSE
of recent / retrieval / novel token columns with every sequence's temporal positions set to:
uniform stride 1 (true time), stride 6.5 (a 200-frame span, like a 192-frame context), stride 0.05
(the RoPE re-index's squeezed stride), the frames in reversed order, and a random permutation times
1000. A model that uses time (as real video models do) changes its predictions; one that does not
gives the same numbers in every row. Also printed: the share of the RMS-normed query / key energy in
each layer's temporal rotary channels (uniform share: temporal channels / head dim).

Usage::

    python scripts/probe_temporal_positions.py [WEIGHTS.safetensors ...]   # default: the committed weights
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cmbench.backbones.tiny import TinyWorldModel  # noqa: E402
from train_tiny_backbone import DataRecipe, make_batch, noisy_predictions, per_category_mse  # noqa: E402

FRAMES = 32  # 8 clean chunks of 4 frames, as in training


def layouts(rng: np.random.Generator) -> dict[str, np.ndarray]:
    base = np.arange(FRAMES, dtype=np.float64)
    return {
        "stride 1": base,
        "stride 6.5 (span 200)": 6.5 * base,
        "stride 0.05 (squeezed)": 0.05 * base,
        "reversed": base[::-1].copy(),
        "permuted x1000": rng.permutation(FRAMES) * 1000.0,
    }


@torch.no_grad()
def probe(model: TinyWorldModel, n_batches: int, seed: int) -> tuple[dict[str, list[float]], list[tuple[float, float]]]:
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    batches = [make_batch(rng, model.config, 3, FRAMES // model.config.chunk_frames, DataRecipe(), gen) for _ in range(n_batches)]
    out: dict[str, list[float]] = {}
    for name, pos in layouts(np.random.default_rng(seed)).items():
        acc = np.zeros(3)
        for b in batches:
            b.frame_positions = np.tile(np.concatenate([pos, pos[model.config.chunk_frames:]]), (len(b.x), 1))
            acc += np.array(per_category_mse(noisy_predictions(model, b), b.x0, b.categories)) / n_batches
        out[name] = acc.tolist()
    nt = model.config.rope_spec().t.dim
    heads, head_dim = model.config.dit.num_heads, model.config.dit.head_dim
    shares: list[tuple[float, float]] = []
    record: list[float] = []

    def hook(_mod, _inp, y):
        y = y.reshape(-1, heads, head_dim)
        record.append(float((y[..., :nt].pow(2).sum(-1) / y.pow(2).sum(-1)).mean()))

    handles = [m.register_forward_hook(hook) for blk in model.dit.blocks for m in (blk.self_attn.norm_q, blk.self_attn.norm_k)]
    noisy_predictions(model, batches[0])
    for h in handles:
        h.remove()
    shares = [(record[2 * i], record[2 * i + 1]) for i in range(len(record) // 2)]
    return out, shares


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("weights", nargs="*", type=Path, help="weights files (default: the committed weights)")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--seed", type=int, default=123)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for path in args.weights or [None]:
        model = TinyWorldModel.from_pretrained(path)
        losses, shares = probe(model, args.batches, args.seed)
        print(f"{path or 'committed weights'}\n| temporal positions | MSE recent | retrieval | novel |\n|---|---|---|---|")
        for name, (a, b, c) in losses.items():
            print(f"| {name} | {a:.5f} | {b:.5f} | {c:.5f} |")
        uniform = model.config.rope_spec().t.dim / model.config.dit.head_dim
        print("temporal share of q / k energy per layer: "
              + ", ".join(f"{q:.3f} / {k:.3f}" for q, k in shares) + f" (uniform {uniform:.3f})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
