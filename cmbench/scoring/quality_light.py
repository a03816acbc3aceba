"""CPU stand-ins for VBench's subject and background consistency (MiniWorld, no weights).

The same formula as VBench (:class:`cmbench.scoring.quality.ConsistencyAccumulator`) on features a
CPU affords for every task of a run, named ``*_light`` so nobody takes them for VBench's numbers:

- ``subject_consistency_light``: the light scorer's appearance descriptor
  (:class:`cmbench.scoring.appearance.AppearanceEmbedder`: colour histogram, 3x3 colour layout,
  gradient orientations) of the whole frame, where VBench uses DINO ViT-B/16's CLS token;
- ``background_consistency_light``: the frame area-averaged to a ``side x side`` colour thumbnail,
  minus its mean (so the cosine compares where colours sit, not overall brightness), where VBench
  uses CLIP ViT-B/32's image embedding.

Neither has learned invariances; both fall when the view changes content, as VBench's do.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from cmbench.scoring.appearance import AppearanceEmbedder
from cmbench.scoring.quality import ConsistencyAccumulator


class SubjectConsistencyLight:
    """``subject_consistency_light``: the appearance descriptor of whole frames.

    Parameters
    ----------
    chroma_bins, lightness_bins, grid, orientation_bins, weights, smooth_sigma
        The descriptor's settings (:class:`AppearanceEmbedder`; defaults: the light scorer's).
    """

    name = "subject_consistency_light"

    def __init__(self, chroma_bins: int = 8, lightness_bins: int = 6, grid: int = 3, orientation_bins: int = 8,
                 weights: Sequence[float] = (1.0, 1.0, 1.0), smooth_sigma: float = 1.0):
        self.embedder = AppearanceEmbedder(chroma_bins, lightness_bins, grid, orientation_bins, weights, smooth_sigma)

    def features(self, frames: np.ndarray) -> np.ndarray:
        """Descriptors of whole frames ``uint8 [B, H, W, 3]`` -> ``float32 [B, D]``."""
        full = np.ones(frames.shape[1:3], dtype=bool)
        return self.embedder.embed(list(frames), [full] * len(frames))

    def accumulator(self) -> ConsistencyAccumulator:
        return ConsistencyAccumulator(self.name, self.features)


class BackgroundConsistencyLight:
    """``background_consistency_light``: mean-centred colour thumbnails.

    Parameters
    ----------
    side : int
        Thumbnail side (area averaging, ``cv2.INTER_AREA``).
    """

    name = "background_consistency_light"

    def __init__(self, side: int = 8):
        if int(side) < 2:
            raise ValueError(f"background_consistency_light side must be >= 2, got {side}")
        self.side = int(side)

    def features(self, frames: np.ndarray) -> np.ndarray:
        """Thumbnails of ``uint8 [B, H, W, 3]`` -> ``float32 [B, side * side * 3]``, each minus its mean."""
        thumbs = np.stack([cv2.resize(f, (self.side, self.side), interpolation=cv2.INTER_AREA) for f in frames])
        flat = thumbs.reshape(len(frames), -1).astype(np.float32) / 255.0
        return flat - flat.mean(axis=1, keepdims=True)

    def accumulator(self) -> ConsistencyAccumulator:
        return ConsistencyAccumulator(self.name, self.features)
