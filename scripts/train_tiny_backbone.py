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

The defaults are the recipe of the committed static-world weights (1300 steps of a 2400-step cosine schedule,
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
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cmbench.backbones.tiny import STATIC_WEIGHTS, TinyConfig, TinyWorldModel, default_config  # noqa: E402
from cmbench.backbones.tiny_training import (  # noqa: E402
    DataRecipe,
    learning_rate,
    load_initial_dit,
    make_batch,
    noisy_predictions,
    per_category_mse,
    retrieval_psnr,
    validation_cases,
    weighted_loss,
)


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
    ap.add_argument("--out", type=Path, default=STATIC_WEIGHTS, help="weights .safetensors (config .json beside)")
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
            res = retrieval_psnr(ema_model, cases, t, seed=args.seed)
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
