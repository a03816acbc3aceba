#!/usr/bin/env python
"""Train the tiny MiniWorld world model (diffusion forcing, flow matching, x0 prediction).

Each step draws ``batch`` fresh MiniWorld sequences: a random scene (``synthetic`` or ``real``), a
revisit-heavy camera path (:func:`cmbench.miniworld.sample_camera_path`), the rendered frames.
A sequence of ``chunks`` clean chunks is followed by a noisy copy of each of its chunks but the
first (each at its own noise level); one forward with :class:`~cmbench.backbones.dit.BlockCausalAttention`
gives every noisy copy exactly the context chunk-by-chunk generation would give it (clean earlier
chunks + itself). The loss is the x0 MSE of the noisy copies.

What makes the model use its memory (docs/tiny_model.md):

- the world-column RoPE axis (periodic, exact wrap-around), so a revisited place has the rotary
  phase it had when first seen;
- revisit-heavy camera paths, and a loss that weights "retrieval" tokens (places seen before, but
  not in the previous chunk: rendering them needs the cache) above the others;
- temporal positions with random piecewise strides (0.05 to 8 frames per frame), so temporal
  offsets of 200+ frames and the squeezed positions of a RoPE re-index are in distribution.

Outputs: the weights (safetensors + config JSON), ``<log-dir>/loss.csv`` (every step),
``<log-dir>/eval.csv`` (memory validation), ``<log-dir>/checkpoint.pt`` (resumable).

The defaults are the recipe of the committed weights (1300 steps of a 2400-step cosine schedule,
batch 3, seed 0; 56.9 minutes of wall time and 51.2 CPU minutes with one thread on the shared 2-core
build machine); stop earlier with ``--max-minutes`` (wall) or ``--max-cpu-minutes`` (process CPU
time). Example::

    python scripts/train_tiny_backbone.py --log-dir runs/tiny_train \
        --out cmbench/backbones/weights/tiny_miniworld.safetensors
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cmbench.backbones.dit import BlockCausalAttention  # noqa: E402
from cmbench.backbones.tiny import (  # noqa: E402
    DEFAULT_WEIGHTS,
    TOKEN_PX,
    TinyConfig,
    TinyWorldModel,
    default_config,
    space_to_depth,
)
from cmbench.backbones.tiny_training import (  # noqa: E402
    clip_frame_positions,
    learning_rate,
    load_initial_dit,
    random_frame_positions,
)
from cmbench.miniworld import render_video, sample_camera_path, sample_scene  # noqa: E402

SCHEDULE = (0.999, 0.957, 0.899, 0.702)  # the sampler's noise levels (timesteps / 1000)




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
def evaluate(model: TinyWorldModel, cases: list[ValCase], t: float, seed: int) -> dict[str, float]:
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


# ------------------------------------------------------------------------------------- training
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2400, help="the cosine schedule's length in steps")
    ap.add_argument("--stop-step", type=int, default=1300,
                    help="stop after this many steps (the committed weights: 1300 of a 2400-step schedule)")
    ap.add_argument("--max-minutes", type=float, default=None, help="stop early after this much wall time")
    ap.add_argument("--max-cpu-minutes", type=float, default=100.0,
                    help="stop early after this much process CPU time")
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=8, help="clean chunks per training sequence")
    ap.add_argument("--retrieval-weight", type=float, default=3.0, help="loss weight of retrieval token columns")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--ema", type=float, default=0.998, help="EMA decay of the saved weights")
    ap.add_argument("--p-real", type=float, default=0.25, help="share of scenes from the 'real' source")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 wastes no time in thread barriers on a shared machine)")
    ap.add_argument("--eval-every", type=int, default=300)
    ap.add_argument("--eval-cases", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS, help="weights .safetensors (config .json beside)")
    ap.add_argument("--log-dir", type=Path, default=Path("runs/tiny_train"))
    ap.add_argument("--resume", action="store_true", help="continue from <log-dir>/checkpoint.pt")
    ap.add_argument("--init-weights", type=Path, default=None,
                    help="start from these saved weights (.safetensors + .json; model and EMA both), with a "
                         "fresh optimiser state; use when no checkpoint.pt exists (a checkpoint in <log-dir> "
                         "still wins with --resume)")
    ap.add_argument("--start-step", type=int, default=0,
                    help="with --init-weights: the schedule step to start at (learning rate, EMA warm-up, logs); "
                         "e.g. 1300 to finish the committed weights' 2400-step schedule")
    ap.add_argument("--rewarmup", type=int, default=50,
                    help="with --init-weights: ramp the learning rate linearly over this many steps from the "
                         "start (the fresh Adam moments would otherwise take full-size first steps)")
    ap.add_argument("--max-temporal-span", type=float, default=None,
                    help="largest temporal RoPE offset inside a training sequence (positions); default: "
                         "unlimited strides up to 8 frames per frame (spans of 200+ frames)")
    ap.add_argument("--world", choices=("static", "dynamic"), default="static",
                    help="MiniWorld scenes to train on: static, or with movers and lighting that change with time")
    ap.add_argument("--positions", choices=("random-stride", "true"), default="random-stride",
                    help="temporal positions of a training sequence: random piecewise strides, or true time "
                         "(stride 1, as a real model sees one short clip)")
    ap.add_argument("--keys", choices=("world", "screen"), default="world",
                    help="the w rotary axis: world column (retrieval by position) or screen column "
                         "(the real models' design: retrieval by content, camera only through the camera map)")
    ap.add_argument("--time-theta", type=float, default=10000.0, help="base of the temporal rotary frequencies")
    ap.add_argument("--new-rope", action="store_true",
                    help="with --init-weights: allow initial weights trained under other rotary frequencies")
    args = ap.parse_args(argv)
    if args.start_step and args.init_weights is None:
        ap.error("--start-step needs --init-weights")
    recipe = DataRecipe(args.p_real, args.world == "dynamic", args.positions, args.max_temporal_span)

    torch.set_num_threads(args.threads)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.log_dir / "checkpoint.pt"
    cfg = default_config(keys=args.keys, time_theta=args.time_theta)
    torch.manual_seed(args.seed)
    model = TinyWorldModel(cfg)
    ema = copy.deepcopy(model.dit).requires_grad_(False)
    opt = torch.optim.AdamW(model.dit.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))
    rng = np.random.default_rng(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    step, elapsed_before, cpu_before = 0, 0.0, 0.0
    init_record = None
    if args.init_weights is not None:
        model.dit.load_state_dict(load_initial_dit(args.init_weights, cfg, args.new_rope).state_dict())
        ema.load_state_dict(model.dit.state_dict())
        init_record = json.loads(args.init_weights.with_suffix(".json").read_text()).get("training")
        step = args.start_step
        # fresh data: do not replay the stream the initial weights were trained on
        rng = np.random.default_rng([args.seed, step])
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        print(f"initialised from {args.init_weights} at schedule step {step} (fresh optimiser state)", flush=True)
    first_step = step
    if args.resume and ckpt_path.is_file():
        state = torch.load(ckpt_path, weights_only=False)
        model.dit.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
        gen.set_state(state["gen"])
        step, elapsed_before, cpu_before = state["step"], state["elapsed"], state["cpu"]
        first_step = state.get("first_step", 0)
        print(f"resumed at step {step} ({elapsed_before / 60:.1f} min)", flush=True)
    n_params = sum(p.numel() for p in model.dit.parameters())
    print(f"tiny model: {n_params / 1e6:.3f} M parameters", flush=True)

    cases = validation_cases(cfg, args.eval_cases, seed=10_000 + args.seed, dynamic=recipe.dynamic)
    ema_model = TinyWorldModel(cfg, ema)
    loss_file = (args.log_dir / "loss.csv").open("a", newline="")
    eval_file = (args.log_dir / "eval.csv").open("a", newline="")
    loss_log, eval_log = csv.writer(loss_file), csv.writer(eval_file)
    if (args.log_dir / "loss.csv").stat().st_size == 0:
        loss_log.writerow(["step", "minutes", "cpu_minutes", "lr", "loss", "mse_recent", "mse_retrieval", "mse_novel"])
        eval_log.writerow(["step", "minutes", "t", "psnr_full", "psnr_sink_recent", "psnr_none"])

    def run_eval(at_step: int, minutes: float) -> None:
        ema.eval()
        for t in (0.999, 0.899):
            res = evaluate(ema_model, cases, t, seed=args.seed)
            eval_log.writerow([at_step, f"{minutes:.2f}", t, *(f"{res[k]:.3f}" for k in ("full", "sink_recent", "none"))])
            print(f"  eval step {at_step} t={t}: full {res['full']:.2f} dB, sink+recent {res['sink_recent']:.2f} dB, "
                  f"none {res['none']:.2f} dB", flush=True)
        eval_file.flush()

    def save(at_step: int, minutes: float) -> None:
        trained = TinyConfig.from_dict(
            {**cfg.to_dict(), "training": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                           "steps_done": at_step, "minutes": round(minutes, 2),
                                           "cpu_minutes": round(cpu_minutes(), 2), "params": n_params,
                                           **({"init_training": init_record} if init_record is not None else {})}}
        )
        TinyWorldModel(trained, ema).save_pretrained(args.out)
        torch.save({"model": model.dit.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                    "rng": rng.bit_generator.state, "gen": gen.get_state(), "step": at_step, "first_step": first_step,
                    "elapsed": minutes * 60, "cpu": cpu_minutes() * 60}, ckpt_path)

    t_start = time.time() - elapsed_before
    cpu_start = time.process_time() - cpu_before

    def cpu_minutes() -> float:
        return (time.process_time() - cpu_start) / 60
    if args.init_weights is not None and step == first_step:
        run_eval(step, 0.0)  # the initial weights on the same validation cases
    model.dit.train()
    while step < min(args.steps, args.stop_step):
        minutes = (time.time() - t_start) / 60
        if (args.max_minutes is not None and minutes > args.max_minutes) or cpu_minutes() > args.max_cpu_minutes:
            print(f"time budget reached at step {step} ({minutes:.1f} min, {cpu_minutes():.1f} CPU min)", flush=True)
            break
        lr = learning_rate(step, args.steps, args.lr, args.warmup, first_step,
                           args.rewarmup if args.init_weights is not None else 0)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = make_batch(rng, cfg, args.batch, args.chunks, recipe, gen)
        pred = noisy_predictions(model, batch)
        loss = weighted_loss(pred, batch.x0, batch.categories, args.retrieval_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.dit.parameters(), 1.0)
        opt.step()
        decay = min(args.ema, (1 + step) / (10 + step))  # EMA warm-up: early averages follow the model
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.dit.parameters()):
                pe.lerp_(pm, 1 - decay)
        step += 1
        cats = per_category_mse(pred.detach(), batch.x0, batch.categories)
        loss_log.writerow([step, f"{minutes:.2f}", f"{cpu_minutes():.2f}", f"{lr:.2e}", f"{loss.item():.5f}", *(f"{c:.5f}" for c in cats)])
        if step % 20 == 0:
            loss_file.flush()
            print(f"step {step} {minutes:.1f} min loss {loss.item():.4f} recent {cats[0]:.4f} "
                  f"retrieval {cats[1]:.4f} novel {cats[2]:.4f}", flush=True)
        if step % args.checkpoint_every == 0:
            save(step, (time.time() - t_start) / 60)
        if step % args.eval_every == 0:
            run_eval(step, (time.time() - t_start) / 60)
    minutes = (time.time() - t_start) / 60
    save(step, minutes)
    if step % args.eval_every:
        run_eval(step, minutes)
    loss_file.close()
    eval_file.close()
    print(json.dumps({"steps": step, "minutes": round(minutes, 2), "cpu_minutes": round(cpu_minutes(), 2),
                      "weights": str(args.out)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
