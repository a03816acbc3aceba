"""Scorer benchmarks (``scripts/bench_scorer.py`` is the command line).

- :func:`pipeline_fps`: frames per second of a whole scorer (light, or the deep pipeline on tiny or
  released-shape random models) with every frame detected and segmented (worst case).
- :func:`preprocessing_timings`: milliseconds per frame of the preprocessing alone, at one frame size,
  three ways in the same rounds: the scorer's code before the device path (``old``: OWL-ViT's
  transformers processor, OpenCV resize for SAM 2 and for DINOv2's padded square), the transformers /
  PIL processors one image at a time (``reference``: what the new path must match numerically), and
  the batched device path (``new``); best of several rounds.
- :func:`peak_rss_one_task`: peak resident memory of a fresh process that scores one task whose
  reference is near the end of a long context video (e.g. one minute of 720p), measured by the
  parent from the child's resource usage.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from cmbench.benchmarks.process_memory import peak_rss_mb, rss_mb
from cmbench.data import Reference, Task, write_video
from cmbench.data.video import VideoReader
from cmbench.scoring import build_scorer
from cmbench.scoring.host_preprocess import dino_pixels, processor_pixels, sam2_pixels
from cmbench.scoring.dino import Dinov2Embedder
from cmbench.scoring.imagenet import imagenet_normalize
from cmbench.scoring.owl import OwlVitDetector
from cmbench.scoring.pipeline import Scorer
from cmbench.data.references import TaskReferences
from cmbench.scoring.sam2_hf import Sam2Segmenter
from cmbench.scoring.tiny_models import byte_tokenizer, tiny_deep_scorer_config


def bench_task(label: str, box: Sequence[float], video: str = "v.mp4", frame_index: int | None = None) -> Task:
    """A one-reference task (reference at ``frame_index``, or t = 0) for benchmarks."""
    x0, y0, x1, y1 = (float(v) for v in box)
    ref = Reference(0.0, (x0, y0, x1, y1), frame_index=frame_index)
    return Task("bench", "synthetic", "s", video, ("p",) * 6, "c", "reappear", label, (), (ref,))


def time_stages(scorer: Scorer) -> dict[str, float]:
    """Wrap the scorer's three stage calls with wall-clock accumulators (seconds per stage name,
    filled as the scorer runs; CUDA work is synchronised at each stage's end, where it is read back)."""
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


def pipeline_fps(scorer: Scorer, task: Task, frames: np.ndarray, reference: np.ndarray, repeats: int) -> dict:
    """Frames per second of ``scorer.score_task`` (and of each stage) over ``repeats`` calls."""
    scorer.score_task(task, frames[:2], [reference])  # warm-up (lazy inits, CUDA kernels)
    seconds = time_stages(scorer)
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


def full_size_config(folder: Path) -> dict:
    """Random-weight models with the released shapes and processors, saved for from_pretrained."""
    import transformers

    owl = transformers.OwlViTForObjectDetection(
        transformers.OwlViTConfig(text_config=dict(bos_token_id=512, eos_token_id=513, pad_token_id=513))
    )  # defaults: B/32, 768 px
    owl.save_pretrained(folder / "owl")
    size = {"height": 768, "width": 768}
    transformers.OwlViTProcessor(
        image_processor=transformers.OwlViTImageProcessorPil(size=size, crop_size=size), tokenizer=byte_tokenizer()
    ).save_pretrained(folder / "owl")
    del owl
    backbone = transformers.Sam2HieraDetConfig(
        hidden_size=144, blocks_per_stage=[2, 6, 36, 4], embed_dim_per_stage=[144, 288, 576, 1152],
        num_attention_heads_per_stage=[2, 4, 8, 16], global_attention_blocks=[23, 33, 43], window_size_per_stage=[8, 4, 16, 8],
    )  # Hiera-L, 1024 px
    vision = transformers.Sam2VisionConfig(backbone_config=backbone, backbone_channel_list=[1152, 576, 288, 144])
    transformers.Sam2Model(transformers.Sam2Config(vision_config=vision)).save_pretrained(folder / "sam2")
    transformers.Dinov2Model(transformers.Dinov2Config()).save_pretrained(folder / "dinov2")  # defaults: ViT-B/14
    transformers.BitImageProcessorPil(  # facebook/dinov2-*'s preprocessor_config.json
        size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, resample=3,
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(folder / "dinov2")
    return {
        "name": "full_size_random",
        "detector": {"backend": "owlvit", "model": str(folder / "owl"), "query_template": "a {}", "score_threshold": 0.0},
        "segmenter": {"backend": "sam2", "model": str(folder / "sam2"), "mask_threshold": -1e9},
        "embedder": {"backend": "dinov2", "model": str(folder / "dinov2")},
    }


def worst_case_scorer(cfg: dict, device: str, precision: str, batch: int) -> Scorer:
    """``cfg`` with every frame detected and fully segmented (random detectors give degenerate boxes)."""
    cfg = dict(cfg, device=device, precision=precision, batch_size=batch, cache_dir=None, min_box_size=0.0)
    cfg["segmenter"] = dict(cfg["segmenter"], mask_threshold=-1e9)
    return build_scorer(cfg)


# ------------------------------------------------------------------------------ preprocessing
def _pre_change_sam2(frames: Sequence[np.ndarray] | np.ndarray, size: int) -> np.ndarray:
    """The scorer's SAM 2 input before the device path: OpenCV bilinear (no antialiasing), on the host."""
    return np.stack([imagenet_normalize(cv2.resize(f, (size, size), interpolation=cv2.INTER_LINEAR)) for f in frames])


def _pre_change_dino(crops: Sequence[np.ndarray], masks: Sequence[np.ndarray], size: int) -> np.ndarray:
    """The scorer's DINOv2 input before the device path: black padded square, OpenCV area / cubic
    resize to ``size`` (the ``pad_square`` mode of then), on the host."""
    out = []
    for crop, mask in zip(crops, masks):
        h, w = mask.shape
        side = max(h, w)
        square = np.zeros((side, side, 3), dtype=np.uint8)
        top, left = (side - h) // 2, (side - w) // 2
        square[top : top + h, left : left + w] = np.where(mask[..., None], crop, np.uint8(0))
        interp = cv2.INTER_AREA if side > size else cv2.INTER_CUBIC
        out.append(imagenet_normalize(cv2.resize(square, (size, size), interpolation=interp)))
    return np.stack(out)


def synthetic_frames(n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth moving colour fields plus noise, ``uint8 [n, height, width, 3]`` (frames a codec and a
    resize treat like video, not like white noise)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    frames = np.empty((n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        phase = 0.05 * i
        base = np.stack([
            128 + 100 * np.sin(xx / 37.0 + phase), 128 + 100 * np.cos(yy / 23.0 - phase),
            128 + 100 * np.sin((xx + yy) / 51.0 + 2 * phase),
        ], axis=-1)
        frames[i] = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    return frames


def object_crops(frames: np.ndarray, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One object-sized masked crop per frame (an ellipse in a box of 15-45 % of the frame side)."""
    rng = np.random.default_rng(seed)
    height, width = frames.shape[1:3]
    crops, masks = [], []
    for frame in frames:
        h, w = (int(s * rng.uniform(0.15, 0.45)) for s in (height, width))
        top, left = int(rng.integers(0, height - h)), int(rng.integers(0, width - w))
        yy, xx = np.mgrid[0:h, 0:w]
        masks.append(((yy - h / 2) / (h / 2)) ** 2 + ((xx - w / 2) / (w / 2)) ** 2 <= 1.0)
        crops.append(frame[top : top + h, left : left + w])
    return crops, masks


def timing_clock(device: str | torch.device) -> str:
    """What :func:`_per_frame_ms` measures on ``device``: ``"wall time"`` on a GPU, else ``"CPU time"``."""
    return "wall time" if torch.device(device).type == "cuda" else "CPU time"


def _per_frame_ms(fn: Callable[[], Any], n_frames: int, device: torch.device) -> float:
    """Milliseconds per frame of ``fn()``: on a CPU, the process's CPU time (the work itself: time
    that other jobs on a shared machine take from it is not counted; with several threads, their sum);
    on a GPU, wall time up to the device's finishing."""
    if timing_clock(device) == "CPU time":
        start = time.process_time()
        fn()
        return (time.process_time() - start) * 1000.0 / n_frames
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1000.0 / n_frames


def deep_stages(scorer: Scorer) -> tuple[OwlVitDetector, Sam2Segmenter, Dinov2Embedder]:
    """The stages of an OWL-ViT / OWLv2 -> SAM 2 -> DINOv2 scorer, checked."""
    stages = (scorer.detector, scorer.segmenter, scorer.embedder)
    for stage, kind in zip(stages, (OwlVitDetector, Sam2Segmenter, Dinov2Embedder)):
        if not isinstance(stage, kind):
            raise TypeError(f"expected a {kind.__name__} stage, got {type(stage).__name__}")
    return stages  # type: ignore[return-value]


def preprocessing_timings(
    scorer: Scorer,
    frames: np.ndarray,
    crops: Sequence[np.ndarray],
    masks: Sequence[np.ndarray],
    rounds: int,
    owlv2: Any = None,
) -> list[dict[str, Any]]:
    """Preprocessing milliseconds per frame of a deep scorer's stages, old / reference / new.

    Each round times every path once on the same frames (one masked object crop per frame for
    DINOv2), timed by :func:`_per_frame_ms` (CPU time on a CPU: wall time on a shared machine swung
    the old / new ratio between 4.5x and 11.6x in identical runs, CPU time by about 10%); the
    best (fastest) round of each path is reported, the round least disturbed by other jobs. The
    ``total`` row is the scorer's three stages with every frame detected (the worst case: SAM 2 gets
    the batch's frames as one array); ``sam2_scattered`` is SAM 2 for detections with gaps (frame by
    frame); an OWLv2 detector, when given, is reported beside them.

    Parameters
    ----------
    scorer : Scorer
        OWL-ViT (or OWLv2) -> SAM 2 -> DINOv2 (``crop_mode="processor"``).
    frames : ndarray, ``uint8 [N, H, W, 3]``
    crops, masks : one masked crop per frame (:func:`object_crops`)
    rounds : int
    owlv2 : Owlv2Detector, optional

    Returns
    -------
    list of dict with ``stage``, ``old_ms``, ``reference_ms``, ``new_ms`` (per frame), ``old_over_new``
    """
    detector, segmenter, embedder = deep_stages(scorer)
    dev = segmenter.runtime.device
    n = len(frames)
    square = (embedder.spec.crop or embedder.spec.size or (224, 224))[0]
    sam2_host = {
        "old": lambda: _pre_change_sam2(frames, segmenter.input_size),
        "reference": lambda: sam2_pixels(frames, segmenter.input_size),
    }
    paths: dict[str, dict[str, Callable[[], Any]]] = {
        "owl": {
            "old": lambda: processor_pixels(detector.image_processor, frames),
            "reference": lambda: processor_pixels(detector.image_processor, frames),
            "new": lambda: detector.preprocess(frames),
        },
        "sam2": {**sam2_host, "new": lambda: segmenter.preprocess(frames)},  # consecutive detections: one array
        "sam2_scattered": {**sam2_host, "new": lambda: segmenter.preprocess(list(frames))},  # with gaps: frame by frame
        "dinov2": {
            "old": lambda: _pre_change_dino(crops, masks, square),
            "reference": lambda: dino_pixels(crops, masks, embedder.background, processor=embedder.image_processor),
            "new": lambda: embedder.preprocess(crops, masks),
        },
    }
    if owlv2 is not None:
        paths["owlv2"] = {
            "old": lambda: processor_pixels(owlv2.image_processor, frames),
            "reference": lambda: processor_pixels(owlv2.image_processor, frames),
            "new": lambda: owlv2.preprocess(frames),
        }
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    with torch.inference_mode():
        for stage in paths.values():  # warm-up
            for fn in stage.values():
                fn()
        for _ in range(rounds):
            for name, stage in paths.items():
                for path, fn in stage.items():
                    times[name, path].append(_per_frame_ms(fn, n, dev))
    rows = []
    for name in (*paths, "total"):
        parts = ("owl", "sam2", "dinov2") if name == "total" else (name,)
        ms = {path: sum(min(times[p, path]) for p in parts) for path in ("old", "reference", "new")}
        rows.append({"stage": name, **{f"{p}_ms": v for p, v in ms.items()}, "old_over_new": ms["old"] / ms["new"]})
    return rows


def tiny_preprocessing_timings(
    folder: Path, height: int, width: int, n_frames: int, rounds: int, device: str = "cpu", released: bool = False
) -> list[dict[str, Any]]:
    """:func:`preprocessing_timings` of the tiny OWL-ViT -> SAM 2 -> DINOv2 scorer (and a tiny OWLv2)
    on ``n_frames`` synthetic frames of ``height x width``; ``released``: with the released models'
    preprocessing sizes (:func:`cmbench.scoring.tiny_models.tiny_deep_scorer_config`)."""
    cfg = tiny_deep_scorer_config(folder / "owlvit", released_preprocessing=released)
    scorer = build_scorer(dict(cfg, device=device, batch_size=n_frames))
    cfg = tiny_deep_scorer_config(folder / "owlv2", detector="owlv2", released_preprocessing=released)
    owlv2 = build_scorer(dict(cfg, device=device)).detector
    frames = synthetic_frames(n_frames, height, width)
    crops, masks = object_crops(frames)
    return preprocessing_timings(scorer, frames, crops, masks, rounds, owlv2=owlv2)


# ------------------------------------------------------------------------------ memory
def write_context_video(path: Path, seconds: float, fps: float, height: int, width: int) -> Path:
    """A long synthetic context video (a textured field panning across the frame), written once.

    Returns
    -------
    Path of the video (reused when it exists with the same name).
    """
    if path.is_file():
        return path
    n_frames = int(round(seconds * fps))
    field = synthetic_frames(1, height, width + n_frames * 2)[0]

    def frames():
        for i in range(n_frames):
            yield field[:, 2 * i : 2 * i + width]

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial.mp4")
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter.fourcc(*"mp4v"), float(fps), (width, height))
    try:
        for frame in frames():
            writer.write(cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_RGB2BGR))
    finally:
        writer.release()
    tmp.replace(path)
    return path


def score_one_task(cfg: dict, continuation: str, context: str, frame_index: int) -> None:
    """Child process body: build the scorer, then score one task whose continuation is streamed from
    its file a batch at a time and whose reference is ``frame_index`` of ``context`` (decoded by
    :class:`TaskReferences`), as ``score`` does on a cache miss; prints, as JSON, its RSS after each
    step (MiB) and its peak.

    Steps: ``rss_runtime_mb`` (Python, torch, OpenCV, CMBench and transformers' model modules, which
    import torch.distributed, torch._dynamo, sympy and scipy), ``rss_before_task_mb`` (the scorer's
    models built), ``rss_continuation_mb`` (the continuation's reader opened; no frame decoded yet),
    ``rss_references_mb`` (the reference frames decoded), ``peak_rss_mb`` (after scoring: one batch of
    decoded frames at a time, the models' first forwards and intermediates included).
    """
    import transformers.modeling_utils  # noqa: F401  (what every model class imports; measured apart)

    torch.set_num_threads(1)
    runtime = rss_mb()
    scorer = build_scorer(cfg)
    before = rss_mb()
    frames = VideoReader(continuation)
    after_continuation = rss_mb()
    task = bench_task("vase", (0.3, 0.3, 0.6, 0.7), video=context, frame_index=frame_index)
    references = TaskReferences.from_video(task, context)
    references.frames()
    after_references = rss_mb()
    record = scorer.score_task(task, frames, references)
    print(json.dumps({"rss_runtime_mb": runtime, "rss_before_task_mb": before, "rss_continuation_mb": after_continuation,
                      "rss_references_mb": after_references, "peak_rss_mb": peak_rss_mb(), "score": record.score,
                      "n_frames": record.n_frames}))


def peak_rss_one_task(cfg: dict, continuation: Path, context: Path, frame_index: int) -> tuple[float, dict]:
    """Run :func:`score_one_task` in a fresh process (so nothing else lives in it) and return its
    peak RSS.

    Returns
    -------
    peak_mb : float
        The child's peak resident set size (MiB; ``VmHWM``, which starts at its ``exec``): the
        Python / torch / transformers runtime, the models, the continuation's frames, the reference
        frames and every intermediate.
    output : dict
        What the child printed (its RSS after each step, :func:`score_one_task`).
    """
    code = "import json, sys; from cmbench.benchmarks.scorer import score_one_task; score_one_task(**json.loads(sys.argv[1]))"
    args = json.dumps({"cfg": cfg, "continuation": str(continuation), "context": str(context), "frame_index": frame_index})
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, env=env)
    if run.returncode:
        raise RuntimeError(f"the scoring child failed ({run.returncode}):\n{run.stderr[-2000:]}")
    output = json.loads(run.stdout.strip().splitlines()[-1])
    return float(output["peak_rss_mb"]), output


BREAKDOWN = {  # step -> what it holds (consecutive RSS differences of the scoring child, summing to its peak)
    "runtime": "RSS with Python, torch, OpenCV, CMBench and transformers' model modules imported",
    "models": "the scorer built (tiny models loaded, their files hashed)",
    "continuation": "the continuation's reader opened (the decoder's libraries; its frames are decoded a batch at a time while scoring)",
    "references": "the reference frame decoded (sequentially up to it, only it kept)",
    "scoring": "peak during scoring (one batch of decoded frames, the models' first forwards, masks, crops) minus the RSS before it",
}


def memory_breakdown(out: dict) -> dict[str, float]:
    """Consecutive RSS differences of the scoring child's steps (:data:`BREAKDOWN`), summing to its peak."""
    steps = [0.0, out["rss_runtime_mb"], out["rss_before_task_mb"], out["rss_continuation_mb"], out["rss_references_mb"],
             out["peak_rss_mb"]]
    return {name: steps[i + 1] - steps[i] for i, name in enumerate(BREAKDOWN)}


def continuation_video(path: Path, n_frames: int, height: int, width: int) -> Path:
    """A generated continuation as the ``score`` command reads it (mp4), written once."""
    if not path.is_file():
        write_video(path, synthetic_frames(n_frames, height, width, seed=1), 16.0)
    return path
