"""Does a tiny model use its temporal positions? The probe behind scripts/probe_temporal_positions.py.

:func:`probe` takes fixed teacher-forced batches of held-out clips (:func:`cmbench.backbones.tiny_training.make_batch`)
and measures the x0 MSE of all, recent, retrieval and novel token columns with every clip's temporal
positions replaced by each of :func:`layouts` (true time, a long span, the RoPE re-index's squeezed
stride, reversed, permuted), and the share of the RMS-normed query / key energy in each layer's
temporal rotary channels.
"""

from __future__ import annotations

import numpy as np
import torch

from cmbench.backbones.dit import DiTBlock
from cmbench.backbones.tiny import TinyWorldModel
from cmbench.backbones.tiny_training import DataRecipe, column_errors, make_batch, noisy_predictions

FRAMES = 32  # 8 clean chunks of 4 frames, as in training
COLUMNS = ("all", "recent", "retrieval", "novel")


def layouts(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Temporal positions of the ``FRAMES`` frames of a clip under each probe, ``float [FRAMES]``."""
    base = np.arange(FRAMES, dtype=np.float64)
    return {
        "true (stride 1)": base,
        "stride 6.5 (span 200)": 6.5 * base,
        "squeezed (stride 0.05)": 0.05 * base,
        "reversed": base[::-1].copy(),
        "permuted": rng.permutation(FRAMES).astype(np.float64),
    }


def column_mses(pred: torch.Tensor, target: torch.Tensor, categories: np.ndarray) -> np.ndarray:
    """MSE of all / recent / retrieval / novel token columns, ``float [4]`` (NaN where absent)."""
    err = column_errors(pred, target)
    cat = torch.from_numpy(categories)
    parts = [float(err.mean())]
    parts += [float(err[cat == c].mean()) if bool((cat == c).any()) else float("nan") for c in range(3)]
    return np.array(parts)


@torch.no_grad()
def probe(model: TinyWorldModel, n_batches: int, seed: int, dynamic: bool) -> tuple[dict[str, list[float]], list[tuple[float, float]]]:
    """Per layout the mean MSEs of :data:`COLUMNS`, and the temporal q / k energy share per layer."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    recipe = DataRecipe(dynamic=dynamic, positions="true")
    cf = model.config.chunk_frames
    batches = [make_batch(rng, model.config, 3, FRAMES // cf, recipe, gen) for _ in range(n_batches)]
    out: dict[str, list[float]] = {}
    for name, pos in layouts(np.random.default_rng(seed)).items():
        acc = np.zeros(len(COLUMNS))
        for b in batches:
            b.frame_positions = np.tile(np.concatenate([pos, pos[cf:]]), (len(b.x), 1))
            acc += column_mses(noisy_predictions(model, b), b.x0, b.categories) / n_batches
        out[name] = acc.tolist()
    nt = model.config.rope_spec().t.dim
    heads, head_dim = model.config.dit.num_heads, model.config.dit.head_dim
    record: list[float] = []

    def hook(_mod, _inp, y):
        y = y.reshape(-1, heads, head_dim)
        record.append(float((y[..., :nt].pow(2).sum(-1) / y.pow(2).sum(-1)).mean()))

    attentions = [block.self_attn for block in model.dit.blocks if isinstance(block, DiTBlock)]
    handles = [m.register_forward_hook(hook) for attn in attentions for m in (attn.norm_q, attn.norm_k)]
    noisy_predictions(model, batches[0])
    for h in handles:
        h.remove()
    shares = [(record[2 * i], record[2 * i + 1]) for i in range(len(record) // 2)]
    return out, shares
