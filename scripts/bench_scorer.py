"""Scorer benchmarks: whole-pipeline speed, preprocessing old vs new, peak memory of one task.

Sections (cmbench/benchmarks/scorer.py holds the code):

- pipeline speed (default on; ``--skip-fps`` turns it off): frames per second of the ``light``
  scorer on MiniWorld 32x32 continuations, and of the OWL-ViT -> SAM 2 -> DINOv2 pipeline on TINY
  RANDOM models (plumbing speed, NOT the real models' cost; ``--full-size`` builds random models with
  the released shapes). Every frame is detected and segmented (worst case).
- ``--preprocess``: preprocessing milliseconds per frame of ``--size`` with the tiny models, at
  their own preprocessing sizes and at the released models' (the models do not run: the sizes are
  what costs), the scorer's previous host path (``old``) vs transformers' / PIL's processors one
  image at a time (``reference``) vs the batched device path (``new``), best of the same rounds;
  on a CPU the time is CPU time (robust to other jobs on a shared machine), on a GPU wall time.
- ``--memory``: peak RSS of a fresh process that scores one task whose reference is near the end of
  a generated context video (one minute and ten seconds of 720p at 24 fps by default), tiny models,
  its RSS before the task, what decoding the whole context took before (computed), and where the
  peak goes (runtime, models, continuation, reference, scoring).

    python scripts/bench_scorer.py --threads 1                                   # pipeline speed
    python scripts/bench_scorer.py --threads 1 --skip-fps --preprocess --memory --csv results/bench_scorer.csv
    python scripts/bench_scorer.py --full-size --frames 4 --devices cuda
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from cmbench.benchmarks.scorer import (  # noqa: E402
    BREAKDOWN,
    bench_task,
    continuation_video,
    full_size_config,
    memory_breakdown,
    peak_rss_one_task,
    pipeline_fps,
    timing_clock,
    tiny_preprocessing_timings,
    worst_case_scorer,
    write_context_video,
)
from cmbench.config_paths import CONFIG_DIR  # noqa: E402
from cmbench.miniworld import object_boxes, render_video, scene_from_seed  # noqa: E402
from cmbench.scoring import build_scorer  # noqa: E402
from cmbench.scoring.tiny_models import tiny_deep_scorer_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def bench_light(n_frames: int, repeats: int) -> dict:
    scene = scene_from_seed(5, "real")
    obj = scene.objects[0]
    cams = (scene.place_offset(obj.place) + np.resize([0, 4, 0, -4], n_frames)) % scene.width
    frames = render_video(scene, cams, first_frame=100)
    box = object_boxes(scene, cams[:1], obj.object_id)[0]
    scorer = build_scorer(OmegaConf.load(CONFIG_DIR / "scorer" / "light.yaml"), cache_dir="")
    return pipeline_fps(scorer, bench_task(obj.category, box), frames, render_video(scene, cams[:1])[0], repeats)


def fps_rows(args, height: int, width: int, tmp: Path) -> list[dict]:
    rows = []
    if not args.skip_light:
        rows.append({"backend": "light", "models": "hand-crafted", "device": "cpu", "precision": "-", "frame": "32x32",
                     **bench_light(args.frames, args.repeats)})
    kind = "full-size random weights (released shapes)" if args.full_size else "TINY RANDOM models (plumbing speed only)"
    cfg = full_size_config(tmp) if args.full_size else tiny_deep_scorer_config(tmp)
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (args.frames, height, width, 3), dtype=np.uint8)
    for device in devices:
        for precision in (["fp32", "bf16"] if device.startswith("cuda") else ["fp32"]):
            scorer = worst_case_scorer(cfg, device, precision, args.batch)
            stats = pipeline_fps(scorer, bench_task("vase", (0.3, 0.3, 0.6, 0.7)), frames, frames[0], args.repeats)
            rows.append({"backend": "owlvit->sam2->dinov2", "models": kind, "device": device, "precision": precision,
                         "frame": args.size, **stats})
    for r in rows:
        stages = ", ".join(f"{k} {v:.3g}" for k, v in r["stage_fps"].items())
        print(f"{r['backend']:<20} {r['device']:<5} {r['precision']:<4} {r['frame']:>8}  {r['fps']:8.3g} frames/s  "
              f"(per stage, frames/s: {stages}; detection rate {r['detection_rate']:.2f})  [{r['models']}]")
    return rows


def preprocess_rows(args, height: int, width: int, tmp: Path) -> list[dict]:
    device = (args.devices or ["cpu"])[0]
    rows = []
    for released in (False, True):
        sizes = ("released sizes: OWL-ViT 768, OWLv2 960, SAM 2 1024, DINOv2 256/224" if released
                 else "tiny models' sizes: OWL 64, SAM 2 128, DINOv2 64/56")
        timings = tiny_preprocessing_timings(tmp / str(released), height, width, args.preprocess_frames, args.rounds,
                                             device=device, released=released)
        clock = timing_clock(device)
        print(f"\npreprocessing, ms of {clock} per frame of {args.size}, {sizes}; {device}, {torch.get_num_threads()} thread(s), "
              f"best of {args.rounds} rounds of {args.preprocess_frames} frames (one object crop per frame for DINOv2):")
        print(f"{'stage':<14} {'old':>8} {'reference':>10} {'new':>8} {'old/new':>8}")
        for r in timings:
            print(f"{r['stage']:<14} {r['old_ms']:8.3f} {r['reference_ms']:10.3f} {r['new_ms']:8.3f} {r['old_over_new']:7.1f}x")
        setting = f"{args.size} frames; {'released' if released else 'tiny'} preprocessing sizes; {device} threads={torch.get_num_threads()}"
        rows += [{"section": "preprocess", "item": r["stage"], "old": round(r["old_ms"], 4),
                  "reference": round(r["reference_ms"], 4), "new": round(r["new_ms"], 4),
                  "ratio": round(r["old_over_new"], 2), "unit": f"ms/frame ({clock})", "setting": setting} for r in timings]
    print("total = owl + sam2 + dinov2 (the default scorer, OWL-ViT, every frame detected: SAM 2 preprocesses the batch as one "
          "array; sam2_scattered: detections with gaps, frame by frame); old: previous host code (OWL-ViT processor, OpenCV "
          "resize without antialiasing for SAM 2, OpenCV padded square for DINOv2); reference: transformers / PIL processors")
    return rows


def memory_rows(args, tmp: Path) -> list[dict]:
    ctx_h, ctx_w = (int(v) for v in args.context_size.split("x"))
    height, width = (int(v) for v in args.size.split("x"))
    cache = Path(args.video_cache)
    continuation = continuation_video(cache / f"continuation_{height}x{width}_{args.continuation_frames}.mp4",
                                      args.continuation_frames, height, width)
    cfg = dict(tiny_deep_scorer_config(tmp / "memory"), cache_dir=None)
    print(f"\nmemory: one task, reference one second before the end of a generated {ctx_h}x{ctx_w} {args.context_fps:g} fps "
          f"context, {args.continuation_frames} continuation frames of {args.size} (streamed a batch at a time as `score` does), tiny "
          "models, 1 thread, a fresh process per row:")
    print(f"{'context':>8} {'mp4 MB':>7} {'peak RSS':>9} {'RSS before task':>16} {'task adds':>10} {'whole context decoded (before)':>32}")
    rows = []
    breakdown = []
    for seconds in args.context_seconds:
        context = write_context_video(cache / f"context_{ctx_h}x{ctx_w}_{seconds:g}s_{args.context_fps:g}fps.mp4",
                                      seconds, args.context_fps, ctx_h, ctx_w)
        n_context = int(round(seconds * args.context_fps))
        peak_mb, out = peak_rss_one_task(cfg, continuation, context, max(0, n_context - 1 - int(args.context_fps)))
        before, whole = out["rss_before_task_mb"], n_context * ctx_h * ctx_w * 3 / 2**20
        print(f"{seconds:7g}s {context.stat().st_size / 2**20:7.0f} {peak_mb:8.0f}M {before:15.0f}M {peak_mb - before:9.0f}M "
              f"{whole:12.0f}M of frames, {2 * whole:.0f}M with np.stack")
        setting = f"context {ctx_h}x{ctx_w} {seconds:g}s {args.context_fps:g}fps; continuation {args.continuation_frames}x{args.size}"
        rows += [
            {"section": "memory", "item": "peak_rss_score_one_task", "old": round(2 * whole, 1), "reference": "",
             "new": round(peak_mb, 1), "ratio": round(2 * whole / peak_mb, 1), "unit": "MB",
             "setting": setting + "; old = the whole context decoded (frames x H x W x 3, list + np.stack), computed"},
            {"section": "memory", "item": "rss_before_task", "old": "", "reference": "", "new": round(before, 1),
             "ratio": "", "unit": "MB", "setting": setting + "; runtime + tiny models, scorer built"},
            {"section": "memory", "item": "task_adds", "old": "", "reference": "", "new": round(peak_mb - before, 1),
             "ratio": "", "unit": "MB", "setting": setting + "; peak RSS - RSS before the task"},
        ]
        breakdown.append((seconds, setting, memory_breakdown(out)))
    print("peak RSS: the whole process; task adds: what scoring the task costs on top of a built scorer, the "
          "continuation's frames included")
    print("\nwhere the peak goes (MB; each step's RSS minus the previous one's):")
    print(f"{'context':>8} " + " ".join(f"{name:>13}" for name in BREAKDOWN))
    for seconds, setting, parts in breakdown:
        print(f"{seconds:7g}s " + " ".join(f"{parts[name]:13.1f}" for name in BREAKDOWN))
        rows += [{"section": "memory_breakdown", "item": name, "old": "", "reference": "", "new": round(parts[name], 1),
                  "ratio": "", "unit": "MB", "setting": f"{setting}; {BREAKDOWN[name]}"} for name in BREAKDOWN]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=16, help="frames per scored video (pipeline speed)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--size", default="480x832", help="HxW of generated frames")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--full-size", action="store_true", help="random models with the released shapes")
    parser.add_argument("--devices", nargs="*", default=None, help="cpu and/or cuda (default: all present)")
    parser.add_argument("--skip-light", action="store_true")
    parser.add_argument("--skip-fps", action="store_true", help="skip the pipeline-speed section")
    parser.add_argument("--preprocess", action="store_true", help="preprocessing old vs new")
    parser.add_argument("--preprocess-frames", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15, help="preprocessing rounds (the best round is reported)")
    parser.add_argument("--memory", action="store_true", help="peak RSS of scoring one task (long context)")
    parser.add_argument("--context-size", default="720x1280")
    parser.add_argument("--context-seconds", type=float, nargs="+", default=[60.0, 10.0],
                        help="context lengths, one fresh process each (equal peaks: memory does not grow with the context)")
    parser.add_argument("--context-fps", type=float, default=24.0)
    parser.add_argument("--continuation-frames", type=int, default=64)
    parser.add_argument("--video-cache", default=str(ROOT / ".cache" / "bench_scorer"),
                        help="where the generated context and continuation videos are kept between runs")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", help="write the pipeline-speed rows here")
    parser.add_argument("--csv", help="write the preprocessing and memory rows here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    height, width = (int(v) for v in args.size.split("x"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, CUDA: "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_fps:
            fps = fps_rows(args, height, width, Path(tmp))
            if args.json:
                Path(args.json).write_text(json.dumps(fps, indent=2) + "\n")
        if args.preprocess:
            rows += preprocess_rows(args, height, width, Path(tmp))
        if args.memory:
            rows += memory_rows(args, Path(tmp))
    if args.csv and rows:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
