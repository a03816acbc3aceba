"""Pieces of the tiny model's training recipe that tests check (scripts/train_tiny_backbone.py).

- :func:`random_frame_positions`: the temporal RoPE positions of one training sequence (random
  piecewise strides), optionally limited to a maximum temporal span, the way real video models only
  ever see the temporal offsets of their short training clips;
- :func:`clip_frame_positions`: true time instead (stride 1 from a random offset), as a real model
  sees the frames of one short clip;
- :func:`load_initial_dit` and :func:`learning_rate`: start training from saved weights at a step of
  the schedule, with a fresh optimiser state (the script's ``--init-weights``, ``--start-step``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.torch import load_file

from cmbench.backbones.dit import CausalWanDiT
from cmbench.backbones.tiny import TinyConfig
from cmbench.errors import ConfigError

MIN_STRIDE = 0.05  # frames of position per frame: the RoPE re-index squeezes 184 frames into 9
MAX_STRIDE = 8.0


def random_frame_positions(
    rng: np.random.Generator, n_frames: int, chunk_frames: int, max_span: float | None = None
) -> np.ndarray:
    """Temporal positions of one sequence: 1-3 pieces of random stride from a random offset.

    Each piece's stride (position units per frame) is log-uniform in ``[MIN_STRIDE, hi]`` with
    ``hi = MAX_STRIDE`` (so offsets of 200+ frames occur), or, with ``max_span``,
    ``hi = min(MAX_STRIDE, max_span / (n_frames - 1))``: then no two frames of the sequence are more
    than ``max_span`` positions apart, whatever the pieces. Pieces change at chunk boundaries; the
    first position is a random offset in ``[0, 200)`` (RoPE only sees differences).

    Parameters
    ----------
    rng : numpy Generator
    n_frames : int
        A multiple of ``chunk_frames``.
    chunk_frames : int
    max_span : float, optional
        Largest temporal offset (``positions[-1] - positions[0]``) allowed; must admit at least
        the smallest stride.

    Returns
    -------
    ndarray ``float [n_frames]``, increasing.
    """
    hi = MAX_STRIDE
    if max_span is not None:
        hi = min(MAX_STRIDE, max_span / max(1, n_frames - 1))
        if hi < MIN_STRIDE:
            raise ValueError(f"max_span {max_span} is below {MIN_STRIDE} per frame over {n_frames} frames")
    n_chunks = n_frames // chunk_frames
    cuts = sorted(rng.choice(np.arange(1, n_chunks), size=min(int(rng.integers(0, 3)), n_chunks - 1), replace=False))
    bounds = [0, *[c * chunk_frames for c in cuts], n_frames]
    steps = np.empty(n_frames)
    for a, b in zip(bounds[:-1], bounds[1:]):
        steps[a:b] = math.exp(rng.uniform(math.log(MIN_STRIDE), math.log(hi)))
    steps[0] = rng.uniform(0, 200)
    return np.cumsum(steps)


def clip_frame_positions(rng: np.random.Generator, n_frames: int) -> np.ndarray:
    """Temporal positions of a short clip in true time: ``offset + [0, 1, ..., n_frames - 1]``.

    The offset is uniform in ``[0, 200)`` (RoPE only sees differences). Returns ``float [n_frames]``.
    """
    return rng.uniform(0, 200) + np.arange(n_frames, dtype=np.float64)


def learning_rate(step: int, total: int, base: float, warmup: int, start: int = 0, rewarmup: int = 0) -> float:
    """Learning rate at ``step``: linear warm-up, then cosine from ``base`` to 5% of it at ``total``.

    A run that starts at schedule step ``start`` with a fresh optimiser state (``--init-weights``)
    ramps it again linearly over its first ``rewarmup`` steps.
    """
    if step < warmup:
        lr = base * (step + 1) / warmup
    else:
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        lr = base * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
    if rewarmup > 0:
        lr *= min(1.0, (step - start + 1) / rewarmup)
    return lr


def load_initial_dit(path: str | Path, config: TinyConfig, new_rope: bool = False) -> CausalWanDiT:
    """A transformer of ``config`` holding the weights saved at ``path`` (``.safetensors``).

    The config saved beside the weights must describe the same network (``dit``, ``rope``, ``world_width``,
    ``chunk_frames``, ``keys``); its ``training`` record may differ. With ``new_rope`` the rotary
    frequencies may differ (they have no parameters: the weights then start training under the new ones).

    Raises
    ------
    ConfigError
        Missing files, a different architecture, or keys that do not match.
    """
    path = Path(path)
    config_path = path.with_suffix(".json")
    if not path.is_file() or not config_path.is_file():
        raise ConfigError(f"initial weights need {path} and {config_path}")
    saved = json.loads(config_path.read_text())
    wanted = json.loads(json.dumps(config.to_dict()))  # tuples as JSON lists, like the saved file
    saved.setdefault("keys", "world")  # weights saved before the keys field existed used world keys
    fields = ("dit", "world_width", "chunk_frames", "keys") if new_rope else ("dit", "rope", "world_width", "chunk_frames", "keys")
    if any(saved.get(k) != wanted[k] for k in fields):
        raise ConfigError(f"{path}: its network ({' / '.join(fields)} config) differs from the one being trained")
    dit = CausalWanDiT(config.dit, config.rope_spec())
    missing, unexpected = dit.load_state_dict(load_file(str(path), device="cpu"), strict=False)
    if missing or unexpected:
        raise ConfigError(f"{path}: missing keys {sorted(missing)}, unexpected keys {sorted(unexpected)}")
    return dit
