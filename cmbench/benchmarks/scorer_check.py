"""A short check of the paper's scorer with real weights on a GPU (``scripts/gpu_check_scorer.py``).

It needs no download: the weights are local folders, and the two contexts are photographs bundled
with scikit-image, each placed on a 720x1280 canvas (the reference frame):

- the task: target ``cat`` (scikit-image's ``chelsea``), its annotated box where the photo sits;
- **positive control**: a continuation made of the reference frame shifted by a few offsets and
  resized to the generated size (480x832): the scorer must find the cat and score it high;
- **negative control**: the same made from another context (a cup, ``coffee``): it must score lower.

Both run in fp32 and bf16 (autocast). Every stage's device preprocessing is compared with the host
reference (transformers' / PIL's processors) on the device the scorer runs on, and stages are timed.
With tiny random models (``tiny=True``, the CI path on a CPU) the same code runs; the checks that
need real weights (detection, the controls' order, fp32-vs-bf16 of detections and masks) are
reported and not asserted.

The network quality metrics (VBench's subject / background consistency and aesthetic quality, when the
config selects them) run on the positive control through the scorer (batched, on the device, fp32
and bf16) and are compared with VBench's definition computed here independently: one frame at a time
on the CPU in fp32, the per-frame cosines and means written out as VBench's loops write them
(:func:`vbench_reference_quality`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from cmbench.benchmarks.scorer import deep_stages, object_crops, preprocessing_timings, time_stages
from cmbench.data import Reference, Task
from cmbench.scoring import build_scorer
from cmbench.scoring.host_preprocess import dino_pixels, processor_pixels, sam2_pixels
from cmbench.scoring.pipeline import Scorer, TaskScore
from cmbench.scoring.quality_models import (
    CLIP_MEAN,
    CLIP_STD,
    VBENCH_SIZE,
    AestheticQuality,
    BackgroundConsistency,
    SubjectConsistency,
)
from cmbench.scoring.imagenet import IMAGENET_MEAN, IMAGENET_STD
from cmbench.scoring.quality_models import vbench_input
from cmbench.scoring.registry import build_quality
from cmbench.scoring.runtime import Runtime

REFERENCE_SIZE = (720, 1280)
GENERATED_SIZE = (480, 832)
PLACE = (160, 340, 400, 600)  # top, left, height, width of the photo on the reference canvas
OFFSETS = [(0, 0), (12, -20), (-16, 24), (24, 8), (-8, -28), (30, 30), (-24, 12), (6, -6)]

# bounds that hold for real OWL-ViT / SAM 2 / DINOv2 weights on these controls
POSITIVE_MIN_SCORE = 0.7
POSITIVE_MIN_DETECTION = 0.75
CONTROL_MARGIN = 0.2
BF16_MAX_SCORE_DIFF = 0.05
BF16_MIN_EMBEDDING_COSINE = 0.99
BF16_MIN_MASK_IOU = 0.9
PREPROCESS_MAX_GREY_LEVELS = 2.01
QUALITY_FP32_MAX_DIFF = 1e-4   # the scorer's batched device path vs the one-frame CPU reference, both fp32
QUALITY_BF16_MAX_DIFF = 0.02   # bf16 autocast vs fp32 (asserted with real weights)


def _canvas(photo: np.ndarray, seed: int) -> np.ndarray:
    """The photo on a neutral, slightly noisy 720x1280 canvas at :data:`PLACE`."""
    rng = np.random.default_rng(seed)
    canvas = np.clip(rng.normal(120, 8, (*REFERENCE_SIZE, 3)), 0, 255).astype(np.uint8)
    top, left, height, width = PLACE
    canvas[top : top + height, left : left + width] = cv2.resize(photo, (width, height), interpolation=cv2.INTER_AREA)
    return canvas


def _shifted(frame: np.ndarray, n_frames: int) -> np.ndarray:
    """``n_frames`` continuation frames: ``frame`` translated by :data:`OFFSETS`, at the generated size."""
    out = []
    for dy, dx in (OFFSETS * (n_frames // len(OFFSETS) + 1))[:n_frames]:
        shift = np.array([[1, 0, dx], [0, 1, dy]], dtype=np.float32)
        moved = cv2.warpAffine(frame, shift, frame.shape[1::-1], borderMode=cv2.BORDER_REFLECT)
        out.append(cv2.resize(moved, GENERATED_SIZE[::-1], interpolation=cv2.INTER_AREA))
    return np.stack(out)


def controls(n_frames: int) -> tuple[Task, np.ndarray, np.ndarray, np.ndarray]:
    """The task, its reference frame and the positive / negative continuations.

    Returns
    -------
    task : Task (label ``cat``, one reference at frame 0 with the photo's box)
    reference : ``uint8 [720, 1280, 3]``
    positive, negative : ``uint8 [n_frames, 480, 832, 3]``
    """
    import skimage.data

    reference = _canvas(skimage.data.chelsea(), seed=0)
    other = _canvas(skimage.data.coffee(), seed=1)
    top, left, height, width = PLACE
    box = (left / REFERENCE_SIZE[1], top / REFERENCE_SIZE[0], (left + width) / REFERENCE_SIZE[1], (top + height) / REFERENCE_SIZE[0])
    task = Task("check_cat", "real", "check", "reference.mp4", ("p",) * 6, "c", "reappear", "cat", ("kitten",),
                (Reference(0.0, box, frame_index=0),))
    return task, reference, _shifted(reference, n_frames), _shifted(other, n_frames)


@dataclass
class Check:
    name: str
    value: float
    bound: str
    passed: bool
    asserted: bool


@dataclass
class CheckReport:
    """What :func:`run_check` measured; :meth:`failures` lists the asserted checks that failed."""

    checks: list[Check] = field(default_factory=list)
    scores: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, value: float, bound: str, passed: bool, asserted: bool = True) -> None:
        self.checks.append(Check(name, float(value), bound, bool(passed), asserted))

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.asserted and not c.passed]

    def require_passed(self) -> None:
        """Raise an ``AssertionError`` naming every asserted check that failed (the GPU check's verdict)."""
        failed = self.failures()
        assert not failed, f"scorer check failed: {[dataclasses.asdict(c) for c in failed]}"


def _grey_levels(ours: torch.Tensor, ref: torch.Tensor, std) -> float:
    scale = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    return float(((ours.float().cpu() - ref).abs() * scale).max())


def _preprocess_agreement(report: CheckReport, scorer: Scorer, frames: np.ndarray) -> None:
    """The device path of every stage against the host reference, on the scorer's device."""
    detector, segmenter, embedder = deep_stages(scorer)
    crops, masks = object_crops(frames)
    sam2_reference = sam2_pixels(frames, segmenter.input_size)
    pairs = {
        "detector": (detector.preprocess(frames), processor_pixels(detector.image_processor, frames), detector.spec.std),
        "segmenter": (segmenter.preprocess(frames), sam2_reference, segmenter.spec.std),  # one array
        "segmenter_scattered": (segmenter.preprocess(list(frames)), sam2_reference, segmenter.spec.std),  # frame by frame
        "embedder": (embedder.preprocess(crops, masks),
                     dino_pixels(crops, masks, embedder.background, processor=embedder.image_processor), embedder.spec.std),
    }
    for stage, (ours, ref, std) in pairs.items():
        diff = _grey_levels(ours, ref, std)
        report.add(f"preprocess_{stage}_max_grey_levels", diff, f"<= {PREPROCESS_MAX_GREY_LEVELS}",
                   diff <= PREPROCESS_MAX_GREY_LEVELS)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = (a | b).sum()
    return 1.0 if union == 0 else float((a & b).sum() / union)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def vbench_reference_quality(metric: Any, frames: np.ndarray) -> float:
    """VBench's definition of ``metric``'s value on ``frames`` (``uint8 [F, H, W, 3]``), computed one
    frame at a time on the CPU in fp32 with the metric's own model, as VBench's loops do it.

    Subject / background consistency: for each frame after the first, ``(max(0, cos to previous) +
    max(0, cos to first)) / 2``, summed and divided by ``F - 1``; aesthetic quality: the mean over frames
    of the head on the L2-normalised embedding, divided by 10.
    """
    cpu = torch.device("cpu")
    model = metric.model.to(cpu)
    feats = []
    with torch.inference_mode():
        for frame in frames:
            if isinstance(metric, SubjectConsistency):
                pixels = vbench_input(frame[None], VBENCH_SIZE, "bilinear", False, IMAGENET_MEAN, IMAGENET_STD, cpu)
                out = model(pixel_values=pixels, interpolate_pos_encoding=True).last_hidden_state[:, 0]
            else:
                pixels = vbench_input(frame[None], metric.image_size, "bicubic", True, CLIP_MEAN, CLIP_STD, cpu)
                out = model(pixel_values=pixels).image_embeds
            feats.append(torch.nn.functional.normalize(out.float(), dim=-1, p=2))
        metric.model.to(metric.runtime.device)
        if isinstance(metric, AestheticQuality):
            head = metric.head.to(cpu)
            value = float(np.mean([float(head(f).squeeze()) / 10.0 for f in feats]))
            metric.head.to(metric.runtime.device)
            return value
    total = 0.0
    for i in range(1, len(feats)):
        to_previous = max(0.0, torch.nn.functional.cosine_similarity(feats[i - 1], feats[i]).item())
        to_first = max(0.0, torch.nn.functional.cosine_similarity(feats[0], feats[i]).item())
        total += (to_previous + to_first) / 2
    return total / (len(feats) - 1)


def _quality_check(report: CheckReport, cfg: dict, dev: torch.device, batch: int, frames: np.ndarray, real: bool) -> None:
    """The network quality metrics on ``frames``, fp32 and bf16, against :func:`vbench_reference_quality`."""
    values: dict[str, dict[str, float]] = {}
    for precision in ("fp32", "bf16"):
        quality = build_quality(cfg, Runtime(dev, precision, batch))
        if quality is None:
            return
        networks = [m for m in quality.metrics if isinstance(m, (SubjectConsistency, BackgroundConsistency,
                                                                   AestheticQuality))]
        result = quality.score(iter([frames[: len(frames) // 2], frames[len(frames) // 2 :]]))
        for metric in networks:
            values.setdefault(metric.name, {})[precision] = result.values[metric.name]
            if precision == "fp32":
                values[metric.name]["reference"] = vbench_reference_quality(metric, frames)
        report.scores.setdefault("quality_absent", {}).update(result.absent)
    for name, v in values.items():
        report.scores[f"quality_{name}"] = v
        diff = abs(v["fp32"] - v["reference"])
        report.add(f"quality_{name}_vs_vbench_definition", diff, f"<= {QUALITY_FP32_MAX_DIFF}",
                   diff <= QUALITY_FP32_MAX_DIFF)
        half = abs(v["bf16"] - v["fp32"])
        report.add(f"quality_{name}_fp32_vs_bf16", half, f"<= {QUALITY_BF16_MAX_DIFF}", half <= QUALITY_BF16_MAX_DIFF,
                   asserted=real)


def run_check(cfg: dict, device: str, tiny: bool, n_frames: int = 8, rounds: int = 3) -> CheckReport:
    """Run the controls in fp32 and bf16, the preprocessing agreement and the timings.

    Parameters
    ----------
    cfg : dict
        A deep scorer config (OWL-ViT -> SAM 2 -> DINOv2 with ``crop_mode="processor"``); its device,
        precision and cache are replaced here.
    device : str
    tiny : bool
        Random weights: checks that need real weights are reported, not asserted.
    n_frames : int
        Frames per control continuation.
    rounds : int
        Rounds of the preprocessing timing.
    """
    dev = torch.device(device)
    batch = int(cfg.get("batch_size", 8))
    cfg = dict(cfg, cache_dir=None)
    memory_cfg = dict(cfg, quality="none")  # the quality metrics are checked apart (_quality_check)
    scorers = {p: build_scorer(memory_cfg, runtime=Runtime(dev, p, batch)) for p in ("fp32", "bf16")}
    task, reference, positive, negative = controls(n_frames)
    report = CheckReport()
    records: dict[str, TaskScore] = {}
    for precision, scorer in scorers.items():
        scorer.score_task(task, positive[:2], [reference])  # warm-up (kernels, autotuning)
        seconds = time_stages(scorer)
        for control, frames in (("positive", positive), ("negative", negative)):
            seconds.clear()
            _sync(dev)
            start = time.perf_counter()
            record = scorer.score_task(task, frames, [reference])
            _sync(dev)
            total = time.perf_counter() - start
            records[f"{control}_{precision}"] = record
            report.scores[f"{control}_{precision}"] = {
                "score": record.score, "detection_rate": record.detection_rate,
                "reference_scores": record.reference_scores, "detection_scores": record.detection_scores,
            }
            report.timings[f"{control}_{precision}_ms_per_frame"] = {
                "total": 1000 * total / len(frames), **{k: 1000 * v / len(frames) for k, v in seconds.items()}}
    for name, record in records.items():
        scores = [record.score, *(record.reference_scores or [])]
        finite = bool(record.reference_scores) and bool(np.all(np.isfinite(scores)))
        report.add(f"{name}_finite", float(finite), "== 1", finite)
    pos, neg = records["positive_fp32"], records["negative_fp32"]
    real = not tiny
    report.add("positive_detection_rate", pos.detection_rate, f">= {POSITIVE_MIN_DETECTION}",
               pos.detection_rate >= POSITIVE_MIN_DETECTION, asserted=real)
    report.add("positive_score", pos.score, f">= {POSITIVE_MIN_SCORE}", pos.score >= POSITIVE_MIN_SCORE, asserted=real)
    report.add("positive_minus_negative", pos.score - neg.score, f">= {CONTROL_MARGIN}",
               pos.score - neg.score >= CONTROL_MARGIN, asserted=real)
    for control in ("positive", "negative"):
        diff = abs(records[f"{control}_fp32"].score - records[f"{control}_bf16"].score)
        report.add(f"{control}_score_fp32_vs_bf16", diff, f"<= {BF16_MAX_SCORE_DIFF}", diff <= BF16_MAX_SCORE_DIFF,
                   asserted=real)

    crops, masks = object_crops(positive)
    with torch.inference_mode():
        full = scorers["fp32"].embedder.embed(crops, masks)
        half = scorers["bf16"].embedder.embed(crops, masks)
    cosine = float(np.sum(full * half, axis=1).min())
    report.add("embedding_cosine_fp32_vs_bf16", cosine, f">= {BF16_MIN_EMBEDDING_COSINE}", cosine >= BF16_MIN_EMBEDDING_COSINE)
    top, left, height, width = PLACE
    scale = np.array([GENERATED_SIZE[1] / REFERENCE_SIZE[1], GENERATED_SIZE[0] / REFERENCE_SIZE[0]] * 2)
    boxes = np.tile(np.array([left, top, left + width, top + height], dtype=float) * scale, (len(positive), 1))
    with torch.inference_mode():
        masks32 = scorers["fp32"].segmenter.segment(list(positive), boxes)
        masks16 = scorers["bf16"].segmenter.segment(list(positive), boxes)
    iou = min(_iou(a, b) for a, b in zip(masks32, masks16))
    report.add("mask_iou_fp32_vs_bf16", iou, f">= {BF16_MIN_MASK_IOU}", iou >= BF16_MIN_MASK_IOU, asserted=real)

    _quality_check(report, {k: cfg[k] for k in ("quality", "quality_settings") if k in cfg}, dev, batch, positive, real)
    with torch.inference_mode():
        _preprocess_agreement(report, scorers["fp32"], positive)
    crops, masks = object_crops(positive)
    report.timings["preprocess_ms_per_frame"] = preprocessing_timings(scorers["fp32"], positive, crops, masks, rounds)
    if dev.type == "cuda":
        report.timings["peak_gpu_memory_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    return report


def real_config(owl: str, sam: str, dino: str, batch_size: int = 8,
                quality: dict[str, dict[str, Any]] | None = None) -> dict:
    """``configs/scorer/owl_sam_dino.yaml`` with local model folders; ``quality``: the network quality
    metrics' settings (``scorer.quality_settings``; the check covers those given, the others are
    left out)."""
    from omegaconf import OmegaConf

    from cmbench.config_paths import CONFIG_DIR

    cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "scorer" / "owl_sam_dino.yaml"), resolve=True)
    assert isinstance(cfg, dict)
    cfg["detector"]["model"], cfg["segmenter"]["model"], cfg["embedder"]["model"] = owl, sam, dino
    cfg["batch_size"] = batch_size
    cfg["quality"] = list(quality or {})
    cfg["quality_settings"] = dict(quality or {})
    return cfg


def tiny_config(folder: Path) -> dict:
    """The deep scorer's config with tiny random models saved under ``folder`` (the quality metrics' too): the
    check's CI form, and the scorer part of ``scripts/gpu_check.py`` where no weights were given."""
    from cmbench.scoring.tiny_models import tiny_deep_scorer_config, tiny_quality_settings

    cfg = tiny_deep_scorer_config(folder)
    cfg["quality_settings"] = tiny_quality_settings(folder / "quality")
    cfg["quality"] = list(cfg["quality_settings"])
    return cfg
