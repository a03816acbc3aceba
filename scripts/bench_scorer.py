"""Frames per second of each scorer backend on this machine (CPU, and CUDA when present).

- ``light``: the CPU scorer (configs/scorer/light.yaml) on MiniWorld 32x32 continuations that show
  the target in every frame (so every stage runs on every frame).
- ``deep``: the OWL-ViT -> SAM 2 -> DINOv2 pipeline. By default on TINY RANDOM models (built from
  configs, saved and loaded with from_pretrained): this measures the pipeline's plumbing
  (preprocessing, batching, post-processing, cropping), NOT the real models' cost. ``--full-size``
  builds random-weight models with the released shapes (OWL-ViT B/32 at 768 px, SAM 2 Hiera-L at
  1024 px, DINOv2-B at 224 px) for a realistic compute cost without downloading weights. Detection
  and mask thresholds are opened so every frame is detected and segmented (worst case).

    python scripts/bench_scorer.py                        # light + tiny deep, CPU (+ CUDA)
    python scripts/bench_scorer.py --full-size --frames 4 --devices cuda
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from cmbench.config_paths import CONFIG_DIR  # noqa: E402
from cmbench.data import Reference, Task  # noqa: E402
from cmbench.miniworld import object_boxes, render_video, scene_from_seed  # noqa: E402
from cmbench.scoring import build_scorer  # noqa: E402
from cmbench.scoring.tiny_models import tiny_deep_scorer_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _timed(scorer) -> dict[str, float]:
    """Wrap the scorer's three stage calls with wall-clock accumulators."""
    seconds: dict[str, float] = defaultdict(float)
    for stage, method in ((scorer.detector, "detect"), (scorer.segmenter, "segment"), (scorer.embedder, "embed")):
        inner = getattr(stage, method)

        @functools.wraps(inner)
        def wrapper(*args, _inner=inner, _name=method, **kwargs):
            start = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                seconds[_name] += time.perf_counter() - start

        setattr(stage, method, wrapper)
    return seconds


def _task(label: str, box) -> Task:
    return Task("bench", "synthetic", "s", "v.mp4", ("p",) * 6, "c", "reappear", label, (), (Reference(0.0, tuple(box)),))


def _run(scorer, task, frames, reference, repeats: int) -> dict:
    scorer.score_task(task, frames[:2], [reference])  # warm-up (lazy inits, CUDA kernels)
    seconds = _timed(scorer)
    start = time.perf_counter()
    for _ in range(repeats):
        record = scorer.score_task(task, frames, [reference])
    total = time.perf_counter() - start
    n = repeats * len(frames)
    return {
        "frames": n,
        "detection_rate": record.detection_rate,
        "fps": n / total,
        "stage_fps": {name: n / max(s, 1e-9) for name, s in seconds.items()},
    }


def bench_light(n_frames: int, repeats: int) -> dict:
    scene = scene_from_seed(5, "real")
    obj = scene.objects[0]
    cams = (scene.place_offset(obj.place) + np.resize([0, 4, 0, -4], n_frames)) % scene.width
    frames = render_video(scene, cams, first_frame=100)
    box = object_boxes(scene, cams[:1], obj.object_id)[0]
    scorer = build_scorer(OmegaConf.load(CONFIG_DIR / "scorer" / "light.yaml"), cache_dir="")
    return _run(scorer, _task(obj.category, box), frames, render_video(scene, cams[:1])[0], repeats)


def _full_size_config(folder: Path) -> dict:
    """Random-weight models with the released shapes, saved for from_pretrained."""
    import transformers

    from cmbench.scoring.tiny_models import _byte_tokenizer

    owl = transformers.OwlViTForObjectDetection(
        transformers.OwlViTConfig(text_config=dict(bos_token_id=512, eos_token_id=513, pad_token_id=513))
    )  # defaults: B/32, 768 px
    owl.save_pretrained(folder / "owl")
    size = {"height": 768, "width": 768}
    transformers.OwlViTProcessor(
        image_processor=transformers.OwlViTImageProcessorPil(size=size, crop_size=size), tokenizer=_byte_tokenizer()
    ).save_pretrained(folder / "owl")
    del owl
    backbone = transformers.Sam2HieraDetConfig(
        hidden_size=144, blocks_per_stage=[2, 6, 36, 4], embed_dim_per_stage=[144, 288, 576, 1152],
        num_attention_heads_per_stage=[2, 4, 8, 16], global_attention_blocks=[23, 33, 43], window_size_per_stage=[8, 4, 16, 8],
    )  # Hiera-L, 1024 px
    vision = transformers.Sam2VisionConfig(backbone_config=backbone, backbone_channel_list=[1152, 576, 288, 144])
    transformers.Sam2Model(transformers.Sam2Config(vision_config=vision)).save_pretrained(folder / "sam2")
    transformers.Dinov2Model(transformers.Dinov2Config()).save_pretrained(folder / "dinov2")  # defaults: ViT-B/14
    return {
        "name": "full_size_random",
        "detector": {"backend": "owlvit", "model": str(folder / "owl"), "query_template": "a {}", "score_threshold": 0.0},
        "segmenter": {"backend": "sam2", "model": str(folder / "sam2"), "mask_threshold": -1e9},
        "embedder": {"backend": "dinov2", "model": str(folder / "dinov2"), "image_size": 224},
    }


def bench_deep(cfg: dict, device: str, half: bool, n_frames: int, height: int, width: int, repeats: int, batch: int) -> dict:
    # any box and full masks: every frame goes through every stage (random detectors give degenerate boxes)
    cfg = dict(cfg, device=device, half=half, batch_size=batch, cache_dir=None, min_box_size=0.0)
    cfg["segmenter"] = dict(cfg["segmenter"], mask_threshold=-1e9)
    scorer = build_scorer(cfg)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (n_frames, height, width, 3), dtype=np.uint8)
    return _run(scorer, _task("vase", (0.3, 0.3, 0.6, 0.7)), frames, frames[0], repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=16, help="frames per scored video")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--size", default="480x832", help="HxW of the deep pipeline's frames")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--full-size", action="store_true", help="random models with the released shapes")
    parser.add_argument("--devices", nargs="*", default=None, help="cpu and/or cuda (default: all present)")
    parser.add_argument("--skip-light", action="store_true")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    height, width = (int(v) for v in args.size.split("x"))
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, CUDA: "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    results = []
    if not args.skip_light:
        row = {"backend": "light", "models": "hand-crafted", "device": "cpu", "precision": "-", "frame": "32x32",
               **bench_light(args.frames, args.repeats)}
        results.append(row)
    with tempfile.TemporaryDirectory() as tmp:
        kind = "full-size random weights (released shapes)" if args.full_size else "TINY RANDOM models (plumbing speed only)"
        cfg = _full_size_config(Path(tmp)) if args.full_size else tiny_deep_scorer_config(tmp)
        for device in devices:
            for half in ([False, True] if device.startswith("cuda") else [False]):
                stats = bench_deep(cfg, device, half, args.frames, height, width, args.repeats, args.batch)
                results.append({"backend": "owlvit->sam2->dinov2", "models": kind, "device": device,
                                "precision": "fp16" if half else "fp32", "frame": args.size, **stats})
    for r in results:
        stages = ", ".join(f"{k} {v:.3g}" for k, v in r["stage_fps"].items())
        print(f"{r['backend']:<20} {r['device']:<5} {r['precision']:<4} {r['frame']:>8}  {r['fps']:8.3g} frames/s  "
              f"(per stage, frames/s: {stages}; detection rate {r['detection_rate']:.2f})  [{r['models']}]")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
