"""The tiny model's training recipe (scripts/train_tiny_backbone.py is its command line).

- :func:`random_frame_positions`: the temporal RoPE positions of one training sequence (random
  piecewise strides), optionally limited to a maximum temporal span, the way real video models only
  ever see the temporal offsets of their short training clips;
- :func:`clip_frame_positions`: true time instead (stride 1 from a random offset), as a real model
  sees the frames of one short clip;
- :func:`load_initial_dit` and :func:`learning_rate`: start training from saved weights at a step of
  the schedule, with a fresh optimiser state (the script's ``--init-weights``, ``--start-step``);
- the data (:class:`DataRecipe`, :func:`sample_sequence`, :func:`make_batch`: teacher-forced MiniWorld
  batches whose token columns are labelled recent / retrieval / novel), the loss
  (:func:`noisy_predictions`, :func:`weighted_loss`, :func:`per_category_mse`) and the memory
  validation (:func:`validation_cases`, :func:`retrieval_psnr`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from cmbench.backbones.dit import BlockCausalAttention, CausalWanDiT
from cmbench.backbones.tiny import TOKEN_PX, TinyConfig, TinyWorldModel, space_to_depth
from cmbench.errors import ConfigError
from cmbench.miniworld import render_video, sample_camera_path, sample_scene

MIN_STRIDE = 0.05  # frames of position per frame: the RoPE re-index squeezes 184 frames into 9
MAX_STRIDE = 8.0
SCHEDULE = (0.999, 0.957, 0.899, 0.702)  # the sampler's noise levels (timesteps / 1000)


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


# ------------------------------------------------------------------------------------- data
@dataclass
class Sequence:
    """One training sequence: frames, cameras, temporal positions."""

    latents: torch.Tensor  # [12, F, 16, 16]
    camera_x: np.ndarray  # int [F]
    frame_positions: np.ndarray  # float [F]


def token_columns(camera_x: np.ndarray, world_tokens: int, cols: int = 8) -> np.ndarray:
    """World column of every token column of every frame, ``int [F, cols]``."""
    return (np.asarray(camera_x)[:, None] // TOKEN_PX + np.arange(cols)[None, :]) % world_tokens


def chunk_categories(camera_x: np.ndarray, chunk: int, chunk_frames: int, world_tokens: int) -> np.ndarray:
    """Category of each token column of a chunk's frames, ``int [chunk_frames, 8]``.

    0 = recent (seen in the previous chunk), 1 = retrieval (seen in an older chunk only),
    2 = novel (never seen in an earlier chunk).
    """
    cols = token_columns(camera_x, world_tokens)
    start = chunk * chunk_frames
    recent = set(cols[max(0, start - chunk_frames) : start].ravel().tolist())
    older = set(cols[: max(0, start - chunk_frames)].ravel().tolist())
    cur = cols[start : start + chunk_frames]
    cat = np.full(cur.shape, 2)
    cat[np.isin(cur, list(older))] = 1
    cat[np.isin(cur, list(recent))] = 0
    return cat


@dataclass(frozen=True)
class DataRecipe:
    """What a training sequence is made of.

    ``dynamic``: scenes with movers and lighting (:mod:`cmbench.miniworld.dynamics`) or static ones;
    ``positions``: ``"true"`` (stride 1, as a real model sees one clip) or ``"random-stride"``
    (:func:`random_frame_positions`, with ``max_span``).
    """

    p_real: float = 0.25
    dynamic: bool = False
    positions: str = "random-stride"
    max_span: float | None = None


def sample_sequence(rng: np.random.Generator, n_frames: int, cfg: TinyConfig, recipe: DataRecipe) -> Sequence:
    """Render one random training sequence."""
    source = "real" if rng.random() < recipe.p_real else "synthetic"
    scene = sample_scene(rng, source, cfg.world_width, recipe.dynamic)
    cams = sample_camera_path(rng, n_frames, cfg.world_width, revisit_gap=6, p_dwell=0.2, p_revisit=0.7)
    frames = render_video(scene, cams, first_frame=int(rng.integers(0, 1000)))
    if recipe.positions == "true":
        positions = clip_frame_positions(rng, n_frames)
    else:
        positions = random_frame_positions(rng, n_frames, cfg.chunk_frames, recipe.max_span)
    return Sequence(space_to_depth(torch.from_numpy(frames))[0], cams, positions)


def sample_noise_level(rng: np.random.Generator) -> float:
    """Half the time one of the sampler's levels, otherwise uniform in (0, 1)."""
    return float(rng.choice(SCHEDULE)) if rng.random() < 0.5 else float(rng.uniform(0.02, 1.0))


@dataclass
class Batch:
    """A teacher-forced training batch (:func:`make_batch`): clean chunks, then noisy copies of them."""

    x: torch.Tensor  # [B, 12, F_total, 16, 16]
    t: torch.Tensor  # [B, F_total]
    x0: torch.Tensor  # [B, 12, F_noisy, 16, 16] targets of the noisy copies
    camera_x: np.ndarray  # [B, F_total]
    frame_positions: np.ndarray  # [B, F_total]
    segments: list  # the shared segment layout
    categories: np.ndarray  # [B, F_noisy, 8] token-column category of the noisy frames


def make_batch(rng: np.random.Generator, cfg: TinyConfig, batch: int, n_chunks: int, recipe: DataRecipe,
               gen: torch.Generator) -> Batch:
    """Teacher-forced batch: ``n_chunks`` clean chunks, then a noisy copy of each of chunks 1..n-1.

    Every noisy copy has its own noise level (:func:`sample_noise_level`).
    """
    cf = cfg.chunk_frames
    world_tokens = cfg.world_width // TOKEN_PX
    noisy = list(range(1, n_chunks))
    frames = np.arange(cf, n_chunks * cf)
    xs, ts, x0s, cams, poss, cats = [], [], [], [], [], []
    for _ in range(batch):
        seq = sample_sequence(rng, n_chunks * cf, cfg, recipe)
        x0 = seq.latents[:, frames]
        levels = np.repeat([sample_noise_level(rng) for _ in noisy], cf)
        lv = torch.tensor(levels, dtype=torch.float32)[None, :, None, None]
        eps = torch.randn(x0.shape, generator=gen)
        xs.append(torch.cat([seq.latents, (1 - lv) * x0 + lv * eps], dim=1))
        ts.append(torch.cat([torch.zeros(n_chunks * cf), torch.tensor(levels, dtype=torch.float32)]))
        x0s.append(x0)
        cams.append(np.concatenate([seq.camera_x, seq.camera_x[frames]]))
        poss.append(np.concatenate([seq.frame_positions, seq.frame_positions[frames]]))
        cats.append(np.concatenate([chunk_categories(seq.camera_x, j, cf, world_tokens) for j in noisy]))
    segments = [(i, False) for i in range(n_chunks)] + [(j, True) for j in noisy]
    return Batch(torch.stack(xs), torch.stack(ts), torch.stack(x0s), np.stack(cams), np.stack(poss), segments,
                 np.stack(cats))


def noisy_predictions(model: TinyWorldModel, b: Batch) -> torch.Tensor:
    """x0 predictions of the noisy copies, ``[B, 12, F_noisy, 16, 16]``."""
    tpc = model.geometry.tokens_per_chunk
    out = model.predict(b.x, b.t, b.camera_x, b.frame_positions, BlockCausalAttention(b.segments, tpc))
    return out[:, :, -b.x0.shape[2] :]


def column_errors(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Squared error per token column of every frame, ``[B, F, 8]`` (mean over rows and values)."""
    err = (pred - target).pow(2).mean(dim=(1, 3))  # [B, F, 16 latent columns]
    return err.reshape(*err.shape[:2], -1, 2).mean(-1)


def weighted_loss(pred: torch.Tensor, target: torch.Tensor, categories: np.ndarray, retrieval_weight: float) -> torch.Tensor:
    """x0 MSE with retrieval token columns weighted by ``retrieval_weight`` (others by 1)."""
    weights = torch.where(torch.from_numpy(categories) == 1, retrieval_weight, 1.0)
    return (column_errors(pred, target) * weights).sum() / weights.sum()


def per_category_mse(pred: torch.Tensor, target: torch.Tensor, categories: np.ndarray) -> list[float]:
    """MSE of recent / retrieval / novel token columns (NaN where a category is absent)."""
    err = column_errors(pred, target)
    cat = torch.from_numpy(categories)
    return [float(err[cat == c].mean()) if bool((cat == c).any()) else float("nan") for c in range(3)]


# ------------------------------------------------------------------------------------- validation
@dataclass
class ValCase:
    """A validation sequence and the chunk whose retrieval token columns are predicted."""

    seq: Sequence
    chunk: int  # the chunk to predict
    mask: np.ndarray  # bool [chunk_frames, 8]: retrieval token columns of that chunk


def validation_cases(cfg: TinyConfig, n: int, seed: int, context_chunks: int = 24, gap_frames: int = 32,
                     dynamic: bool = False) -> list[ValCase]:
    """Fixed long sequences, each with a chunk that revisits places last seen >= ``gap_frames`` ago.

    The chosen chunk (at or after ``context_chunks // 2``) shows, for at least half of its token
    columns, places seen earlier but neither in the first (sink) chunk nor in the preceding
    ``gap_frames`` frames: only a cache that keeps the middle of the history holds them.
    """
    rng = np.random.default_rng(seed)
    cf, world_tokens = cfg.chunk_frames, cfg.world_width // TOKEN_PX
    cases: list[ValCase] = []
    while len(cases) < n:
        source = "real" if len(cases) % 4 == 3 else "synthetic"
        scene = sample_scene(rng, source, cfg.world_width, dynamic)
        cams = sample_camera_path(rng, context_chunks * cf, cfg.world_width, revisit_gap=64, p_revisit=0.5)
        cols = token_columns(cams, world_tokens)
        for j in range(context_chunks // 2, context_chunks):
            start = j * cf
            recent = set(cols[start - gap_frames : start].ravel().tolist())
            sink = set(cols[:cf].ravel().tolist())
            older = set(cols[cf : start - gap_frames].ravel().tolist())
            cur = cols[start : start + cf]
            mask = np.isin(cur, list(older)) & ~np.isin(cur, list(recent | sink))
            if mask.mean() >= 0.5:
                frames = render_video(scene, cams[: start + cf])
                latents = space_to_depth(torch.from_numpy(frames))[0]
                seq = Sequence(latents, cams[: start + cf], np.arange(start + cf, dtype=np.float64))
                cases.append(ValCase(seq, j, mask))
                break
    return cases


@torch.no_grad()
def retrieval_psnr(model: TinyWorldModel, cases: list[ValCase], t: float, seed: int) -> dict[str, float]:
    """PSNR (dB, latents in [-1, 1]) of the x0 prediction on retrieval columns of each case's chunk.

    ``full``: every earlier chunk as context; ``sink_recent``: chunk 0 and the previous chunk only;
    ``none``: no context. One model call at noise level ``t`` with teacher-forced context.
    """
    cf = model.config.chunk_frames
    tpc = model.geometry.tokens_per_chunk
    gen = torch.Generator().manual_seed(seed)
    sums = {"full": 0.0, "sink_recent": 0.0, "none": 0.0}
    for case in cases:
        j = case.chunk
        target = case.seq.latents[None, :, j * cf : (j + 1) * cf]
        eps = torch.randn(target.shape, generator=gen)
        noisy = (1 - t) * target + t * eps
        for name, history in (("full", list(range(j))), ("sink_recent", sorted({0, j - 1})), ("none", [])):
            frames = np.concatenate([np.arange(i * cf, (i + 1) * cf) for i in history + [j]])
            x = torch.cat([case.seq.latents[None, :, frames[: len(history) * cf]], noisy], dim=2)
            tt = torch.cat([torch.zeros(1, len(history) * cf), torch.full((1, cf), t)], dim=1)
            segs = [(i, False) for i in history] + [(j, True)]
            pred = model.predict(
                x, tt, case.seq.camera_x[frames], case.seq.frame_positions[frames], BlockCausalAttention(segs, tpc)
            )[:, :, -cf:]
            err = (pred - target).pow(2).mean(dim=(0, 1, 3))  # [F, 16]
            mse = float(err.reshape(cf, 8, 2).mean(-1)[torch.from_numpy(case.mask)].mean())
            sums[name] += 10 * math.log10(4.0 / max(mse, 1e-10))
    return {k: v / len(cases) for k, v in sums.items()}
