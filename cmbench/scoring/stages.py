"""The three swappable stages of a scorer and the values they exchange.

A scorer is ``detector -> segmenter -> embedder`` (paper.md: OWL-ViT -> SAM 2 -> DINOv2). Every
backend implements one of the protocols below; :mod:`cmbench.scoring.registry` builds them from
``configs/scorer/*.yaml`` and :class:`cmbench.scoring.pipeline.Scorer` runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class ReferenceView:
    """The target as annotated in the context video.

    Attributes
    ----------
    frame : ndarray, ``uint8 [H, W, 3]``
        The reference frame.
    box : ndarray, ``float [4]``
        Annotated pixel box ``(x0, y0, x1, y1)``, clipped to the frame.
    mask : ndarray, ``bool [H, W]``
        The segmenter's mask of the target inside ``box`` (the box itself when it came back empty).
    """

    frame: np.ndarray
    box: np.ndarray
    mask: np.ndarray


@dataclass(frozen=True)
class Target:
    """What a detector looks for: text queries (label + aliases) and the reference views."""

    queries: tuple[str, ...]
    references: tuple[ReferenceView, ...]


@dataclass(frozen=True)
class Detections:
    """Each frame's best candidate.

    Attributes
    ----------
    boxes : ndarray, ``float64 [F, 4]``
        Pixel box of the best candidate per frame (NaN where the detector has no candidate at all).
    scores : ndarray, ``float64 [F]``
        Its detector score (NaN where there is no candidate).
    found : ndarray, ``bool [F]``
        Whether the best candidate passes the detector's score threshold.
    """

    boxes: np.ndarray
    scores: np.ndarray
    found: np.ndarray


class Detector(Protocol):
    """Finds the target in frames. ``score_threshold`` is recorded with every result.

    ``needs_reference_views`` says whether :meth:`detect` looks at ``target.references`` (False for
    text-conditioned detectors: then a cached reference embedding spares decoding the context video).
    Backends with model weights also define ``identity() -> dict`` (see
    :func:`cmbench.scoring.runtime.model_identity`), which keys the feature cache; a stage without it
    contributes nothing to the key. The same holds for segmenters and embedders.
    """

    score_threshold: float
    needs_reference_views: bool

    def detect(self, frames: np.ndarray, target: Target) -> Detections:
        """Best candidate per frame of ``frames`` (``uint8 [F, H, W, 3]``)."""
        ...


class Segmenter(Protocol):
    """Segments the object inside a box prompt."""

    def segment(self, frames: np.ndarray | Sequence[np.ndarray], boxes: np.ndarray) -> list[np.ndarray]:
        """Masks ``bool [H_i, W_i]`` for frames ``uint8 [H_i, W_i, 3]`` (a sequence, or an array
        ``uint8 [N, H, W, 3]`` of equal frames) and pixel boxes ``[N, 4]``."""
        ...


class Embedder(Protocol):
    """Embeds masked crops; similarity between embeddings is the cosine."""

    def embed(self, crops: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> np.ndarray:
        """Unit-norm embeddings ``float32 [N, D]`` of crops ``uint8 [h, w, 3]`` with masks ``bool [h, w]``."""
        ...
