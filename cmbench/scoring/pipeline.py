"""The scoring protocol (paper.md): detect -> segment -> embed -> max cosine over frames.

Reference: the target's annotated box in its reference frame, segmented by the segmenter; the masked
crop is embedded. Generated frames: the detector's best candidate above threshold, its mask, the
masked crop's embedding, and the cosine to the reference embedding (the best over references when a
task has several). Task score = max over frames; 0 when the target is never detected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cmbench.data import Task
from cmbench.scoring.boxes import box_mask, boxes_valid, clip_boxes, denormalize_box, masked_crop, normalize_box
from cmbench.scoring.feature_cache import FeatureCache, FrameFeatures
from cmbench.hashing import array_hash, json_digest
from cmbench.scoring.stages import Detector, Embedder, ReferenceView, Segmenter, Target


@dataclass(frozen=True)
class TaskScore:
    """The scorer's record of one task (one line of ``records.jsonl``).

    Attributes
    ----------
    task_id, source, task_type : str
    score : float
        Max over frames of the cosine similarity; 0.0 when the target is never detected.
    similarities : list of float or None
        Per generated frame; None where the target was not detected.
    detection_rate : float
        Fraction of frames with a detection (above threshold, valid box, non-empty mask).
    boxes : list of [x0, y0, x1, y1] or None
        Per frame, the chosen (clipped) detector box, normalised to [0, 1]; None where not detected.
    detection_scores : list of float or None
        Per frame, the best candidate's detector score (also below threshold); None without one.
    detection_threshold : float
    reference_mask_fallback : list of bool
        Per reference, True when its segmentation was empty and the annotated box was used instead.
    n_frames : int
    scorer : str
        Scorer config name.
    scorer_config_hash : str
    """

    task_id: str
    source: str
    task_type: str
    score: float
    similarities: list[float | None]
    detection_rate: float
    boxes: list[list[float] | None]
    detection_scores: list[float | None]
    detection_threshold: float
    reference_mask_fallback: list[bool]
    n_frames: int
    scorer: str
    scorer_config_hash: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict."""
        return asdict(self)


def _optional(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def frame_similarities(features: FrameFeatures) -> np.ndarray:
    """Cosine of each detected frame's embedding to the closest reference, ``float64 [F]`` (NaN
    where not detected)."""
    sims = np.full(len(features.detected), np.nan)
    if features.detected.any():
        frames = features.embeddings[features.detected].astype(np.float64)  # [F_detected, D]
        references = features.reference_embeddings.astype(np.float64)  # [R, D]
        sims[features.detected] = (frames @ references.T).max(axis=1)
    return sims


class Scorer:
    """Runs a detector, a segmenter and an embedder over frames held in memory.

    Parameters
    ----------
    detector, segmenter, embedder
        Backends implementing :mod:`cmbench.scoring.stages`.
    name : str
        Scorer config name, written into records.
    config_hash : str
        Identity of the config (:func:`cmbench.scoring.registry.scorer_hash`).
    cache : FeatureCache or None
        Where per-frame features are kept between calls; None disables caching.
    min_box_size : float
        A clipped detector box narrower or lower than this many pixels is no detection.

    Attributes
    ----------
    cache_hits, cache_misses : int
        Counters over this scorer's lifetime.
    """

    def __init__(
        self,
        detector: Detector,
        segmenter: Segmenter,
        embedder: Embedder,
        *,
        name: str,
        config_hash: str,
        cache: FeatureCache | None = None,
        min_box_size: float = 1.0,
    ):
        self.detector = detector
        self.segmenter = segmenter
        self.embedder = embedder
        self.name = name
        self.config_hash = config_hash
        self.cache = cache
        self.min_box_size = float(min_box_size)
        self.cache_hits = 0
        self.cache_misses = 0

    def score_task(self, task: Task, frames: np.ndarray, reference_frames: Sequence[np.ndarray]) -> TaskScore:
        """Score one task's generated frames.

        Parameters
        ----------
        task : Task
            Gives the queries (``task.queries``) and the reference boxes.
        frames : ndarray, ``uint8 [F, H, W, 3]``
            The generated continuation.
        reference_frames : sequence of ``uint8 [H', W', 3]``
            One per ``task.references`` (see :func:`cmbench.scoring.references.reference_frames`).

        Returns
        -------
        TaskScore
        """
        boxes = [r.bbox_xyxy_normalized for r in task.references]
        features = self.features(frames, task.queries, reference_frames, boxes)
        sims = frame_similarities(features)
        detected = features.detected
        height, width = (int(v) for v in features.frame_size)
        return TaskScore(
            task_id=task.task_id,
            source=task.source,
            task_type=task.task_type,
            score=float(np.nanmax(sims)) if detected.any() else 0.0,
            similarities=[_optional(s) for s in sims],
            detection_rate=float(detected.mean()),
            boxes=[normalize_box(b, height, width) if d else None for b, d in zip(features.boxes, detected)],
            detection_scores=[_optional(s) for s in features.scores],
            detection_threshold=float(self.detector.score_threshold),
            reference_mask_fallback=[bool(v) for v in features.reference_mask_fallback],
            n_frames=len(detected),
            scorer=self.name,
            scorer_config_hash=self.config_hash,
        )

    def features(
        self,
        frames: np.ndarray,
        queries: Sequence[str],
        reference_frames: Sequence[np.ndarray],
        reference_boxes: Sequence[Sequence[float]],
    ) -> FrameFeatures:
        """Per-frame features, from the cache when present.

        Parameters
        ----------
        frames : ndarray, ``uint8 [F, H, W, 3]``
        queries : sequence of str
            Target label and aliases.
        reference_frames : sequence of ``uint8 [H', W', 3]``
        reference_boxes : sequence of normalised ``(x0, y0, x1, y1)``, one per reference frame
        """
        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or len(frames) == 0:
            raise ValueError(f"frames must be non-empty uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
        if not queries:
            raise ValueError("the target needs at least one text query")
        if len(reference_frames) == 0 or len(reference_frames) != len(reference_boxes):
            raise ValueError(
                f"need one reference frame per reference box, got {len(reference_frames)} frames "
                f"and {len(reference_boxes)} boxes"
            )
        for ref in reference_frames:
            if ref.ndim != 3 or ref.shape[-1] != 3 or ref.dtype != np.uint8:
                raise ValueError(f"reference frames must be uint8 [H, W, 3], got {ref.dtype} {ref.shape}")
        video_hash = array_hash([frames])
        target_hash = json_digest(
            {
                "queries": list(queries),
                "frames": array_hash(reference_frames),
                "boxes": [[float(v) for v in b] for b in reference_boxes],
            }
        )
        if self.cache is not None:
            cached = self.cache.load(video_hash, target_hash)
            if cached is not None:
                self.cache_hits += 1
                return cached
        self.cache_misses += 1
        features = self._compute(frames, tuple(queries), reference_frames, reference_boxes)
        if self.cache is not None:
            self.cache.store(video_hash, target_hash, features)
        return features

    def _reference_views(
        self, reference_frames: Sequence[np.ndarray], reference_boxes: Sequence[Sequence[float]]
    ) -> tuple[list[ReferenceView], np.ndarray]:
        boxes = np.concatenate(
            [
                clip_boxes(denormalize_box(box, *frame.shape[:2]), *frame.shape[:2])
                for frame, box in zip(reference_frames, reference_boxes)
            ]
        )
        masks = self.segmenter.segment(list(reference_frames), boxes)
        views, fallback = [], []
        for frame, box, mask in zip(reference_frames, boxes, masks):
            empty = not mask.any()
            fallback.append(empty)
            views.append(ReferenceView(frame=frame, box=box, mask=box_mask(box, *frame.shape[:2]) if empty else mask))
        return views, np.array(fallback, dtype=bool)

    def _compute(
        self,
        frames: np.ndarray,
        queries: tuple[str, ...],
        reference_frames: Sequence[np.ndarray],
        reference_boxes: Sequence[Sequence[float]],
    ) -> FrameFeatures:
        n_frames, height, width = frames.shape[:3]
        views, fallback = self._reference_views(reference_frames, reference_boxes)
        detections = self.detector.detect(frames, Target(queries=queries, references=tuple(views)))
        boxes = clip_boxes(detections.boxes, height, width)
        boxes[~np.isfinite(detections.boxes).all(axis=1)] = np.nan
        candidates = np.flatnonzero(detections.found & boxes_valid(boxes, self.min_box_size))
        masks = self.segmenter.segment([frames[i] for i in candidates], boxes[candidates])
        kept = [(i, m) for i, m in zip(candidates, masks) if m.any()]
        crops = [masked_crop(v.frame, v.mask) for v in views] + [masked_crop(frames[i], m) for i, m in kept]
        embeddings = self.embedder.embed([c for c, _ in crops], [m for _, m in crops])
        detected = np.zeros(n_frames, dtype=bool)
        frame_embeddings = np.zeros((n_frames, embeddings.shape[1]), dtype=np.float32)
        for row, (i, _) in enumerate(kept):
            detected[i] = True
            frame_embeddings[i] = embeddings[len(views) + row]
        return FrameFeatures(
            reference_embeddings=embeddings[: len(views)].astype(np.float32),
            reference_mask_fallback=fallback,
            boxes=boxes,
            scores=np.asarray(detections.scores, dtype=np.float64),
            detected=detected,
            embeddings=frame_embeddings,
            frame_size=np.array([height, width], dtype=np.int64),
        )
