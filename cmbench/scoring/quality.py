"""Video-quality metrics beside the memory score, as VBench defines them (one number per video).

Every metric reads the continuation once, batch after batch in frame order, through an
accumulator (``add(frames)`` per batch, ``value()`` at the end), so a streamed video is never held
whole. The formulas (VBench's code, ``vbench/*.py``; docs/scoring.md, "Quality metrics"):

- **temporal flickering**: ``(255 - mean over consecutive pairs of mean |frame_i - frame_{i+1}|) / 255``
  on the uint8 pixels (:class:`FlickerAccumulator`);
- **subject / background consistency**: per frame ``i >= 1``, the mean of its features' cosine to
  frame ``i - 1`` and to frame 0, each clamped below at 0; averaged over those frames
  (:class:`ConsistencyAccumulator`; the features decide which metric it is);
- **aesthetic / imaging quality**: a per-frame score averaged over frames (:class:`MeanAccumulator`);
- **motion smoothness**: the odd frames dropped, re-interpolated from their even neighbours, and
  ``(255 - mean |interpolated - dropped|) / 255`` (:func:`motion_smoothness_score`).

A metric that cannot run here (its package or weights missing, a video too short) raises
:class:`QualityUnavailable` with the reason; :class:`QualityScorer` records it beside the values, so a
column is absent with its reason, never silently. On a continuation with fewer than 2 frames or whose
frames are all identical (a still or black video), every metric that compares frames
(:data:`~cmbench.scoring.quality_names.TEMPORAL_QUALITY`) is absent as undefined (:class:`QualityPass`):
VBench's formulas would score such a video a perfect 1.0, rewarding a continuation that froze.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from cmbench.errors import CMBenchError
from cmbench.scoring.quality_names import TEMPORAL_QUALITY, UNDEFINED


class QualityUnavailable(CMBenchError):
    """A quality metric cannot be computed here; the message is the reason recorded for its column."""


class QualityAccumulator(Protocol):
    """One video's running state for one metric."""

    def add(self, frames: np.ndarray) -> None:
        """The next consecutive frames, ``uint8 [B, H, W, 3]``."""
        ...

    def value(self) -> float:
        """The metric over every frame added. Raises :class:`QualityUnavailable` when it has none."""
        ...


class QualityMetric(Protocol):
    """A registered quality metric: ``name`` is its record field (VBench's name, or a ``*_light``
    name for CPU stand-ins); ``identity()`` (optional) identifies its loaded models."""

    name: str

    def accumulator(self) -> QualityAccumulator:
        """A fresh accumulator for one video."""
        ...


def _need_two(count: int, name: str) -> None:
    if count < 2:
        raise QualityUnavailable(f"{name} compares consecutive frames: needs at least 2, got {count}")


class FlickerAccumulator:
    """Temporal flickering (VBench ``temporal_flickering.py``): mean absolute difference of
    consecutive frames over all pixels and channels, averaged over pairs, as ``(255 - MAE) / 255``."""

    def __init__(self) -> None:
        self._last: np.ndarray | None = None
        self._mae_sum = 0.0
        self._pairs = 0

    def add(self, frames: np.ndarray) -> None:
        """Parameters: frames ``uint8 [B, H, W, 3]``."""
        seq = frames.astype(np.float32)
        if self._last is not None:
            seq = np.concatenate([self._last[None], seq])
        if len(seq) > 1:
            mae = np.abs(seq[1:] - seq[:-1]).reshape(len(seq) - 1, -1).mean(axis=1, dtype=np.float64)  # [B']
            self._mae_sum += float(mae.sum())
            self._pairs += len(mae)
        self._last = seq[-1]

    def value(self) -> float:
        _need_two(self._pairs + (self._last is not None), "temporal_flickering")
        return (255.0 - self._mae_sum / self._pairs) / 255.0


class ConsistencyAccumulator:
    """Subject / background consistency (VBench ``subject_consistency.py``,
    ``background_consistency.py``) on the features ``features(frames) -> float [B, D]``.

    Per frame ``i >= 1``: ``(max(0, cos(f_i, f_{i-1})) + max(0, cos(f_i, f_0))) / 2``; the value is the
    mean over those frames. Features are L2-normalised here (VBench normalises before the cosine);
    a zero feature vector (a featureless frame, for a centred descriptor) agrees only with another.
    """

    def __init__(self, name: str, features: Callable[[np.ndarray], np.ndarray]):
        self.name = name
        self._features = features
        self._first: np.ndarray | None = None
        self._previous: np.ndarray | None = None
        self._sum = 0.0
        self._count = 0

    def add(self, frames: np.ndarray) -> None:
        """Parameters: frames ``uint8 [B, H, W, 3]``."""
        feats = np.asarray(self._features(frames), dtype=np.float64)  # [B, D]
        norms = np.linalg.norm(feats, axis=1, keepdims=True)
        feats = feats / np.where(norms > 0, norms, 1.0)  # a zero vector stays zero
        if self._first is None:
            self._first = feats[0]
            self._previous = feats[0]
            feats = feats[1:]
        first, previous = self._first, self._previous
        assert first is not None and previous is not None
        for f in feats:
            to_previous = max(0.0, _cosine(f, previous))
            to_first = max(0.0, _cosine(f, first))
            self._sum += (to_previous + to_first) / 2.0
            self._count += 1
            previous = f
        self._previous = previous

    def value(self) -> float:
        _need_two(self._count + (self._first is not None), self.name)
        return self._sum / self._count


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two unit-or-zero vectors, in [-1, 1] (rounding of a unit vector's dot product with itself
    can exceed 1); two zero vectors (e.g. featureless flat frames) agree (1), a zero and a non-zero
    vector do not (0)."""
    a_zero, b_zero = not a.any(), not b.any()
    if a_zero or b_zero:
        return 1.0 if a_zero and b_zero else 0.0
    return min(1.0, max(-1.0, float(a @ b)))


class MeanAccumulator:
    """The mean over frames of a per-frame score ``scores(frames) -> float [B]`` (VBench's aesthetic
    and imaging quality, already divided by their scale)."""

    def __init__(self, name: str, scores: Callable[[np.ndarray], np.ndarray]):
        self.name = name
        self._scores = scores
        self._sum = 0.0
        self._count = 0

    def add(self, frames: np.ndarray) -> None:
        """Parameters: frames ``uint8 [B, H, W, 3]``."""
        values = np.asarray(self._scores(frames), dtype=np.float64).reshape(-1)
        self._sum += float(values.sum())
        self._count += len(values)

    def value(self) -> float:
        if not self._count:
            raise QualityUnavailable(f"{self.name}: no frames")
        return self._sum / self._count


def motion_smoothness_score(
    frames: np.ndarray, interpolate: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> float:
    """VBench's motion smoothness: keep the even frames, predict each odd frame between its even
    neighbours with ``interpolate``, and score ``(255 - mean |prediction - odd frame|) / 255``.

    Parameters
    ----------
    frames : ndarray, ``uint8 [F, H, W, 3]``, F >= 3
    interpolate : callable
        ``(before uint8 [N, H, W, 3], after uint8 [N, H, W, 3]) -> uint8 [N, H, W, 3]``: the frames
        half-way between (AMT-S in VBench).
    """
    if len(frames) < 3:
        raise QualityUnavailable(f"motion_smoothness needs at least 3 frames, got {len(frames)}")
    evens = frames[0::2]
    pairs = min(len(evens) - 1, len(frames[1::2]))
    predicted = np.asarray(interpolate(evens[:pairs], evens[1 : pairs + 1]))
    dropped = frames[1::2][:pairs]
    mae = np.abs(predicted.astype(np.float32) - dropped.astype(np.float32)).reshape(pairs, -1).mean(axis=1)
    return float((255.0 - mae.mean(dtype=np.float64)) / 255.0)


class WholeVideoAccumulator:
    """Collects the frames and applies ``score(frames) -> float`` at the end (motion smoothness needs
    frames two apart; a continuation is short)."""

    def __init__(self, score: Callable[[np.ndarray], float]):
        self._score = score
        self._batches: list[np.ndarray] = []

    def add(self, frames: np.ndarray) -> None:
        """Parameters: frames ``uint8 [B, H, W, 3]``."""
        self._batches.append(np.array(frames, copy=True))

    def value(self) -> float:
        if not self._batches:
            raise QualityUnavailable("no frames")
        return self._score(np.concatenate(self._batches))


class TemporalFlickering:
    """``temporal_flickering``: no model (:class:`FlickerAccumulator`)."""

    name = "temporal_flickering"

    def accumulator(self) -> FlickerAccumulator:
        return FlickerAccumulator()


@dataclass(frozen=True)
class QualityScores:
    """One video's quality metrics.

    Attributes
    ----------
    values : dict name -> float
        Every metric that ran.
    absent : dict name -> str
        Every selected metric that did not, with the reason.
    """

    values: dict[str, float] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)


class QualityScorer:
    """Runs the selected metrics over one continuation in a single pass.

    Parameters
    ----------
    metrics : sequence of QualityMetric
        The metrics that can run here.
    unavailable : dict name -> reason
        Selected metrics that could not be built here (package or weights missing): recorded as
        absent in every result.
    config_hash : str
        Identity of the quality config (:func:`cmbench.scoring.registry.quality_hash`).
    """

    def __init__(self, metrics: Sequence[QualityMetric], unavailable: dict[str, str], config_hash: str):
        self.metrics = list(metrics)
        self.unavailable = dict(unavailable)
        self.config_hash = config_hash

    @property
    def names(self) -> list[str]:
        """Every selected metric, running or absent."""
        return [m.name for m in self.metrics] + list(self.unavailable)

    def identity(self) -> dict[str, object]:
        """The loaded models' identities (metrics without models contribute nothing)."""
        return {m.name: m.identity() for m in self.metrics if hasattr(m, "identity")}

    def start(self) -> "QualityPass":
        """A pass over one video: feed its batches in order with ``add``, then read ``result``."""
        return QualityPass(self)

    def score(self, batches: Iterable[np.ndarray]) -> QualityScores:
        """Every metric over consecutive batches ``uint8 [B, H, W, 3]`` of one video."""
        quality = self.start()
        for batch in batches:
            quality.add(batch)
        return quality.result()


class QualityPass:
    """Every metric of a :class:`QualityScorer` accumulating over one video, so the quality metrics
    ride on a pass the scorer makes anyway (a streamed video is decoded no extra time for them).

    It also counts the frames and whether all of them equal the first: a video with fewer than 2 frames,
    or a still one (every frame identical, a black video too), has its frame-comparing metrics
    (:data:`TEMPORAL_QUALITY`) recorded as undefined instead of their formula's perfect value.
    """

    def __init__(self, scorer: QualityScorer):
        self.unavailable = dict(scorer.unavailable)
        self.accumulators = {m.name: m.accumulator() for m in scorer.metrics}
        self.frames = 0
        self._first: np.ndarray | None = None
        self._still = True

    def add(self, frames: np.ndarray) -> None:
        """The next consecutive frames, ``uint8 [B, H, W, 3]``."""
        if len(frames) and self._still:
            if self._first is None:
                self._first = np.array(frames[0], copy=True)  # [H, W, 3]
            self._still = bool((frames == self._first).all())
        self.frames += len(frames)
        for acc in self.accumulators.values():
            acc.add(frames)

    def undefined(self) -> str | None:
        """Why the frame-comparing metrics are undefined on the frames added so far, or None."""
        if self.frames < 2:
            return (f"{UNDEFINED}the continuation has {self.frames} frame{'' if self.frames == 1 else 's'}: "
                    "a temporal or consistency metric compares frames")
        if self._still:
            return (f"{UNDEFINED}all {self.frames} frames of the continuation are identical (a still or black "
                    "video): a temporal or consistency metric would call it perfect")
        return None

    def result(self) -> QualityScores:
        """The metrics over every frame added; a metric that cannot be computed is absent with its reason."""
        values: dict[str, float] = {}
        absent = dict(self.unavailable)
        undefined = self.undefined()
        for name, acc in self.accumulators.items():
            if undefined is not None and name in TEMPORAL_QUALITY:
                absent[name] = undefined
                continue
            try:
                values[name] = float(acc.value())
            except QualityUnavailable as err:
                absent[name] = str(err)
        return QualityScores(values=values, absent=absent)
