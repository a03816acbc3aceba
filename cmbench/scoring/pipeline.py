"""The scoring protocol (paper.md): detect -> segment -> embed -> max cosine over frames.

Reference: the target's annotated box in its reference frame, segmented by the segmenter; the masked
crop is embedded. Generated frames: the detector's best candidate above threshold, its mask, the
masked crop's embedding, and its cosine to each reference embedding. Each reference's score is its
best cosine over frames; the task score is their mean (``reference_aggregation="mean"``, the default,
a reading: the authors' official evaluator is not public, see docs/protocol.md) or their max
(``"max"``); 0 when the target is never detected. Records carry both (``reference_aggregates``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from cmbench.config_schema import REFERENCE_AGGREGATIONS
from cmbench.data import Task
from cmbench.hashing import frames_hash, json_digest
from cmbench.scoring.aggregation import aggregate_references
from cmbench.scoring.boxes import box_mask, boxes_valid, clip_boxes, denormalize_box, masked_crop, normalize_box
from cmbench.scoring.feature_cache import FeatureCache, FrameFeatures, ReferenceFeatures
from cmbench.scoring.frame_count import CountedFrames
from cmbench.data.references import TaskReferences
from cmbench.scoring.quality import QualityScorer
from cmbench.scoring.stages import Detector, Embedder, ReferenceView, Segmenter, Target

SEGMENT_CHUNK = 16  # generated frames segmented together; only their full-frame masks are held at once


@dataclass(frozen=True)
class TaskScore:
    """The scorer's record of one task (one line of ``records.jsonl``).

    Attributes
    ----------
    task_id, source, task_type : str
    score : float
        The aggregation (``reference_aggregation``) of ``reference_scores``; 0.0 when the target is
        never detected.
    similarities : list of float or None
        Per generated frame, the cosine to the closest reference; None where not detected.
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
        Frames scored: the first ``frames_defined`` of the continuation (:mod:`cmbench.scoring.frame_count`).
    scorer : str
        Scorer config name.
    scorer_config_hash : str
    reference_scores : list of float
        Per reference, its best cosine similarity over frames (0.0 when never detected).
    reference_best_frames : list of int or None
        Per reference, the frame of that best similarity (None when never detected); its box is
        ``boxes[frame]``.
    reference_aggregation : {"mean", "max"}
    scorer_models_hash : str
        Identity of the loaded models (weight / processor file contents or hub commits, and the
        transformers version).
    quality : dict name -> float or None
        The quality metrics that ran (VBench's names; :mod:`cmbench.scoring.quality`); None without
        quality metrics.
    quality_absent : dict name -> str or None
        The selected quality metrics that did not run, with the reason.
    quality_hash : str or None
        Identity of the quality config.
    frames_received : int or None
        Frames the continuation had (more than ``n_frames`` when it had extra frames, left unscored).

    The scorer fills every field it has; those from ``reference_scores`` on default to None only so
    that a TaskScore can be written by hand without them.
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
    reference_scores: list[float] | None = None
    reference_best_frames: list[int | None] | None = None
    reference_aggregation: str | None = None
    scorer_models_hash: str | None = None
    quality: dict[str, float] | None = None
    quality_absent: dict[str, str] | None = None
    quality_hash: str | None = None
    frames_received: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict."""
        return asdict(self)


class FrameBatches(Protocol):
    """A continuation too large to hold whole, read a batch at a time (e.g.
    :class:`cmbench.data.video.VideoReader`); every call to :meth:`batches` starts a new pass."""

    def batches(self, size: int) -> Iterator[np.ndarray]:
        """The frames in order, ``uint8 [B, H, W, 3]`` with ``B <= size``."""
        ...


def _optional(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def reference_similarities(features: FrameFeatures) -> np.ndarray:
    """Cosine of each detected frame's embedding to each reference, ``float64 [F, R]`` (NaN rows
    where not detected), clamped to [-1, 1] (unit vectors' dot products round past it: 1 + 5e-9 for a frame
    identical to its reference)."""
    sims = np.full((len(features.detected), len(features.reference_embeddings)), np.nan)
    if features.detected.any():
        frames = features.embeddings[features.detected].astype(np.float64)  # [F_detected, D]
        sims[features.detected] = np.clip(frames @ features.reference_embeddings.astype(np.float64).T, -1.0, 1.0)
    return sims


def frame_similarities(features: FrameFeatures) -> np.ndarray:
    """Cosine of each detected frame's embedding to the closest reference, ``float64 [F]`` (NaN
    where not detected)."""
    sims = reference_similarities(features)
    out = np.full(len(sims), np.nan)
    out[features.detected] = sims[features.detected].max(axis=1)
    return out


class Scorer:
    """Runs a detector, a segmenter and an embedder over a continuation.

    Frames held in memory (``uint8 [F, H, W, 3]``) go through the stages together; a
    :class:`FrameBatches` source is streamed ``batch_size`` frames at a time (detection,
    segmentation and embedding of one batch before the next is decoded), so at most one batch of
    decoded frames is alive. Both give the same features and records: the same frames meet the
    same computations, only grouped into other batches for segmentation and embedding (bit for bit
    on a CPU, tested; on a GPU a kernel may pick another reduction order for another batch shape, so
    floats could differ in their last bits).

    Parameters
    ----------
    detector, segmenter, embedder
        Backends implementing :mod:`cmbench.scoring.stages`.
    name : str
        Scorer config name, written into records.
    config_hash : str
        Identity of the config (:func:`cmbench.scoring.registry.scorer_hash`).
    cache_dir : str or Path, optional
        Feature cache folder (:class:`FeatureCache`); None disables caching.
    min_box_size : float
        A clipped detector box narrower or lower than this many pixels is no detection.
    reference_aggregation : {"mean", "max"}
        How the references' best similarities make the task score.
    batch_size : int
        Frames decoded and scored together when streaming a :class:`FrameBatches` source (the
        runtime's batch size, so a streamed batch is one batch of each deep stage).
    quality : QualityScorer, optional
        Quality metrics computed on the same frames, during the pass that hashes them (no extra
        decoding of a streamed video; never cached: they are cheap beside detection, or absent).

    Attributes
    ----------
    models_hash : str
        12 hex digits over the stages' ``identity()`` (model file contents or hub commits, and the
        transformers version; stages without models contribute nothing).
    cache : FeatureCache or None
    cache_hits, cache_misses : int
        Task-entry counters over this scorer's lifetime.
    """

    def __init__(
        self,
        detector: Detector,
        segmenter: Segmenter,
        embedder: Embedder,
        *,
        name: str,
        config_hash: str,
        cache_dir: str | None = None,
        min_box_size: float = 1.0,
        reference_aggregation: str = "mean",
        batch_size: int = 8,
        quality: QualityScorer | None = None,
    ):
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if reference_aggregation not in REFERENCE_AGGREGATIONS:
            raise ValueError(
                f"reference_aggregation must be one of {', '.join(REFERENCE_AGGREGATIONS)}, got {reference_aggregation!r}"
            )
        self.detector = detector
        self.segmenter = segmenter
        self.embedder = embedder
        self.name = name
        self.config_hash = config_hash
        self.min_box_size = float(min_box_size)
        self.reference_aggregation = reference_aggregation
        self.batch_size = int(batch_size)
        self.quality = quality
        stages = {"detector": detector, "segmenter": segmenter, "embedder": embedder}
        self.models_hash = json_digest({k: getattr(s, "identity", dict)() for k, s in stages.items()})[:12]
        self.cache = FeatureCache(cache_dir, config_hash, self.models_hash) if cache_dir else None
        self.cache_hits = 0
        self.cache_misses = 0

    def score_task(
        self,
        task: Task,
        frames: np.ndarray | FrameBatches,
        references: Sequence[np.ndarray] | TaskReferences | None = None,
        frames_defined: int | None = None,
    ) -> TaskScore:
        """Score one task's generated frames: the first ``frames_defined`` of them (the frame-count
        rule, :mod:`cmbench.scoring.frame_count`: frames after them are counted, never scored).

        Parameters
        ----------
        task : Task
            Gives the queries (``task.queries``) and the reference boxes.
        frames : ndarray ``uint8 [F, H, W, 3]``, or FrameBatches
            The generated continuation, in memory or streamed (e.g. a
            :class:`~cmbench.data.video.VideoReader` of the saved video).
        references : TaskReferences, or a sequence of ``uint8 [H', W', 3]``, optional
            One frame per ``task.references``; default :meth:`TaskReferences.from_video` of the
            task's context video (decoded only if the feature cache misses).
        frames_defined : int, optional
            The frames the task defines; None scores every frame.

        Returns
        -------
        TaskScore

        Raises
        ------
        cmbench.scoring.frame_count.TooFewFrames
            The continuation has fewer than ``frames_defined`` frames (nothing is scored: the pass that
            counts them is the one that hashes them, before any detection).
        """
        counted = CountedFrames(frames, frames_defined)
        if references is None:
            references = TaskReferences.from_video(task)
        boxes = [r.bbox_xyxy_normalized for r in task.references]
        quality = self.quality.start() if self.quality is not None else None
        features = self.features(counted.frames, task.queries, references, boxes,
                                 on_read=None if quality is None else quality.add)
        sims = reference_similarities(features)  # [F, R]
        detected = features.detected
        height, width = (int(v) for v in features.frame_size)
        n_refs = sims.shape[1]
        best_frames: list[int | None] = [None] * n_refs
        reference_scores = np.zeros(n_refs)
        if detected.any():
            best = np.argmax(np.where(detected[:, None], sims, -np.inf), axis=0)  # [R]
            best_frames = [int(f) for f in best]
            reference_scores = sims[best, np.arange(n_refs)]
        quality_scores = quality.result() if quality is not None else None
        return TaskScore(
            task_id=task.task_id,
            source=task.source,
            task_type=task.task_type,
            score=aggregate_references(reference_scores, self.reference_aggregation),
            reference_scores=[float(s) for s in reference_scores],
            reference_best_frames=best_frames,
            reference_aggregation=self.reference_aggregation,
            similarities=[_optional(s) for s in frame_similarities(features)],
            detection_rate=float(detected.mean()),
            boxes=[normalize_box(b, height, width) if d else None for b, d in zip(features.boxes, detected)],
            detection_scores=[_optional(s) for s in features.scores],
            detection_threshold=float(self.detector.score_threshold),
            reference_mask_fallback=[bool(v) for v in features.reference_mask_fallback],
            n_frames=len(detected),
            scorer=self.name,
            scorer_config_hash=self.config_hash,
            scorer_models_hash=self.models_hash,
            quality=None if quality_scores is None else quality_scores.values,
            quality_absent=None if quality_scores is None else quality_scores.absent,
            quality_hash=None if self.quality is None else self.quality.config_hash,
            frames_received=counted.received,
        )

    def features(
        self,
        frames: np.ndarray | FrameBatches,
        queries: Sequence[str],
        references: Sequence[np.ndarray] | TaskReferences,
        reference_boxes: Sequence[Sequence[float]],
        on_read: Callable[[np.ndarray], None] | None = None,
    ) -> FrameFeatures:
        """Per-frame features, from the cache when present.

        The cache key names the frames by content (:func:`cmbench.hashing.frames_hash`), so a
        streamed source is read twice on a miss (once to hash it, once to score it) and once on a hit.

        Parameters
        ----------
        frames : ndarray ``uint8 [F, H, W, 3]``, or FrameBatches
        queries : sequence of str
            Target label and aliases.
        references : TaskReferences, or a sequence of ``uint8 [H', W', 3]``
        reference_boxes : sequence of normalised ``(x0, y0, x1, y1)``, one per reference
        on_read : callable, optional
            Given every batch ``uint8 [B, H, W, 3]`` of the hashing pass, in order (the pass made on a
            hit and on a miss alike): the quality metrics ride on it.
        """
        if not hasattr(frames, "batches"):
            frames = np.asarray(frames)
            _check_batch(frames, None)
        if not queries:
            raise ValueError("the target needs at least one text query")
        if not isinstance(references, TaskReferences):
            if len(references) == 0:
                raise ValueError("need one reference frame per reference box, got 0 frames")
            references = TaskReferences.from_arrays(references)
        if len(references.keys) != len(reference_boxes):
            raise ValueError(
                f"need one reference frame per reference box, got {len(references.keys)} frames "
                f"and {len(reference_boxes)} boxes"
            )
        boxes = [[float(v) for v in b] for b in reference_boxes]
        video_hash = frames_hash(self._batches(frames, on_read))
        target_hash = json_digest({"queries": list(queries), "references": list(references.keys), "boxes": boxes})
        if self.cache is not None:
            cached = self.cache.load(video_hash, target_hash)
            if cached is not None:
                self.cache_hits += 1
                return cached
        self.cache_misses += 1
        features = self._compute(frames, tuple(queries), references, boxes)
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

    def _batches(
        self, frames: np.ndarray | FrameBatches, on_read: Callable[[np.ndarray], None] | None = None
    ) -> Iterator[np.ndarray]:
        """Frames in memory as one batch; a streamed source ``batch_size`` frames at a time, each
        batch checked (``uint8 [B, H, W, 3]``, the first batch's frame size) and given to ``on_read``."""
        if isinstance(frames, np.ndarray):
            if on_read is not None:
                on_read(frames)
            yield frames
            return
        size: tuple[int, ...] | None = None
        for batch in frames.batches(self.batch_size):
            _check_batch(batch, size)
            size = batch.shape[1:3]
            if on_read is not None:
                on_read(batch)
            yield batch
            del batch  # released before the next batch is decoded
        if size is None:
            raise ValueError("frames must be non-empty uint8 [F, H, W, 3], got no frames")

    def _compute(
        self,
        frames: np.ndarray | FrameBatches,
        queries: tuple[str, ...],
        references: TaskReferences,
        reference_boxes: list[list[float]],
    ) -> FrameFeatures:
        keys = [json_digest({"reference": k, "box": b}) for k, b in zip(references.keys, reference_boxes)]
        cached = [self.cache.load_reference(k) if self.cache is not None else None for k in keys]
        views: list[ReferenceView] = []
        fallback = np.zeros(0, dtype=bool)
        if getattr(self.detector, "needs_reference_views", True) or any(c is None for c in cached):
            views, fallback = self._reference_views(references.frames(), reference_boxes)
        target = Target(queries=queries, references=tuple(views))
        new_refs = [r for r, c in enumerate(cached) if c is None]
        pending = [masked_crop(views[r].frame, views[r].mask) for r in new_refs]  # embedded with the first batch
        all_boxes: list[np.ndarray] = []
        all_scores: list[np.ndarray] = []
        frame_rows: dict[int, np.ndarray] = {}  # detected frame -> its embedding
        offset = 0
        height = width = 0
        for batch in self._batches(frames):
            height, width = batch.shape[1:3]
            boxes, scores, kept = self._detect_and_segment(batch, target)
            crops = pending + [(crop, mask) for _, crop, mask in kept]
            if crops:  # the batch's crops (and, with the first batch, the new references') together
                embeddings = self.embedder.embed([c for c, _ in crops], [m for _, m in crops])
                for row, r in enumerate(new_refs if pending else []):
                    entry = ReferenceFeatures(
                        embedding=embeddings[row].astype(np.float32), mask_fallback=np.array(fallback[r])
                    )
                    cached[r] = entry
                    if self.cache is not None:
                        self.cache.store_reference(keys[r], entry)
                for row, (i, _, _) in enumerate(kept):
                    frame_rows[offset + i] = embeddings[len(pending) + row]
            all_boxes.append(boxes)
            all_scores.append(scores)
            pending = []
            offset += len(batch)
            del batch, crops, kept  # the batch and its crops are released before the next is decoded
        references_embedded = np.stack([c.embedding for c in cached])  # type: ignore[union-attr]
        detected = np.zeros(offset, dtype=bool)
        frame_embeddings = np.zeros((offset, references_embedded.shape[1]), dtype=np.float32)
        for i, embedding in frame_rows.items():
            detected[i] = True
            frame_embeddings[i] = embedding
        return FrameFeatures(
            reference_embeddings=references_embedded.astype(np.float32),
            reference_mask_fallback=np.array([bool(c.mask_fallback) for c in cached]),  # type: ignore[union-attr]
            boxes=np.concatenate(all_boxes),
            scores=np.concatenate(all_scores),
            detected=detected,
            embeddings=frame_embeddings,
            frame_size=np.array([height, width], dtype=np.int64),
        )

    def _detect_and_segment(
        self, frames: np.ndarray, target: Target
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, np.ndarray, np.ndarray]]]:
        """Detect and segment the target in a batch of frames.

        Parameters
        ----------
        frames : ndarray, ``uint8 [B, H, W, 3]``
        target : Target

        Returns
        -------
        boxes : ndarray, ``float64 [B, 4]``
            Clipped pixel boxes of the best candidates (NaN without one).
        scores : ndarray, ``float64 [B]``
        kept : list of (frame in the batch, crop ``uint8 [h, w, 3]``, crop mask ``bool [h, w]``)
            Frames with a valid detection and a non-empty mask.
        """
        height, width = frames.shape[1:3]
        detections = self.detector.detect(frames, target)
        boxes = clip_boxes(detections.boxes, height, width)
        boxes[~np.isfinite(detections.boxes).all(axis=1)] = np.nan
        candidates = np.flatnonzero(detections.found & boxes_valid(boxes, self.min_box_size))
        kept: list[tuple[int, np.ndarray, np.ndarray]] = []
        for start in range(0, len(candidates), SEGMENT_CHUNK):  # a chunk's full-frame masks at a time
            chunk = candidates[start : start + SEGMENT_CHUNK]
            for i, mask in zip(chunk, self.segmenter.segment(frames_of(frames, chunk), boxes[chunk])):
                if mask.any():
                    crop, crop_mask = masked_crop(frames[i], mask)
                    kept.append((int(i), crop, crop_mask.copy()))
        return boxes, np.asarray(detections.scores, dtype=np.float64), kept


def frames_of(frames: np.ndarray, indices: np.ndarray) -> np.ndarray | list[np.ndarray]:
    """Some frames of a batch without copying them: a view for a run of consecutive indices (every
    frame detected, the common case; a segmenter then preprocesses them as one batch), else a list.

    Parameters
    ----------
    frames : ndarray, ``uint8 [B, H, W, 3]``
    indices : ndarray, ``int [N]``, increasing, N >= 1

    Returns
    -------
    ``uint8 [N, H, W, 3]`` view, or list of N ``uint8 [H, W, 3]`` views
    """
    first, last = int(indices[0]), int(indices[-1])
    if last - first + 1 == len(indices):
        return frames[first : last + 1]
    return [frames[i] for i in indices]


def _check_batch(frames: np.ndarray, size: tuple[int, ...] | None) -> None:
    """Raise ValueError unless ``frames`` is non-empty ``uint8 [B, H, W, 3]`` of frame size ``size``
    (when given)."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or len(frames) == 0:
        raise ValueError(f"frames must be non-empty uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
    if size is not None and frames.shape[1:3] != size:
        raise ValueError(f"frames change size mid-video: {size[0]}x{size[1]} then {frames.shape[1]}x{frames.shape[2]}")
