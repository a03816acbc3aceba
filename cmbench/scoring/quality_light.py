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


def _soft_histograms(values: np.ndarray, lo: float, hi: float, bins: int) -> np.ndarray:
    """Per frame, the appearance descriptor's linear-interpolation (soft) joint histogram.

    Parameters
    ----------
    values : ndarray, ``float [B, N, K]``

    Returns
    -------
    ndarray, ``float64 [B, bins ** K]`` (``np.bincount`` of the same weights ``np.add.at`` adds in
    :func:`cmbench.scoring.appearance._soft_histogram`)
    """
    b, n, k = values.shape
    pos = np.clip((values - lo) / (hi - lo) * bins - 0.5, 0.0, bins - 1.0)
    low = np.floor(pos).astype(np.int64)
    high = np.minimum(low + 1, bins - 1)
    frac = pos - low
    offsets = (np.arange(b) * bins**k)[:, None]
    hist = np.zeros(b * bins**k)
    for corner in range(2**k):
        index = np.zeros((b, n), dtype=np.int64)
        weight = np.ones((b, n))
        for axis in range(k):
            upper = (corner >> axis) & 1
            index = index * bins + (high[..., axis] if upper else low[..., axis])
            weight = weight * (frac[..., axis] if upper else 1.0 - frac[..., axis])
        hist += np.bincount((index + offsets).ravel(), weights=weight.ravel(), minlength=b * bins**k)
    return hist.reshape(b, bins**k)


def _unit_rows(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)


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
        """Descriptors of whole frames ``uint8 [B, H, W, 3]`` -> ``float64 [B, D]``.

        :meth:`AppearanceEmbedder.describe` with a full mask, computed for the batch at once (the
        descriptor's cost per frame is what the light scorer pays per detected crop; whole frames of
        every task would otherwise cost more than the scoring itself). The same numbers up to the order
        of floating-point sums (``tests/test_scoring_quality.py``).
        """
        e = self.embedder
        count, height, width = frames.shape[:3]
        images = frames.astype(np.float32) / 255.0
        if e.smooth_sigma > 0:
            images = np.stack([cv2.GaussianBlur(im, (0, 0), e.smooth_sigma, borderType=cv2.BORDER_REFLECT)
                               for im in images])
        lab = cv2.cvtColor(images.reshape(count * height, width, 3), cv2.COLOR_RGB2Lab).reshape(count, height, width, 3)
        pixels = lab.reshape(count, -1, 3).astype(np.float64)  # [B, N, 3]
        lightness = pixels[..., 0] / np.maximum(pixels[..., 0].mean(axis=1, keepdims=True), 1e-3)
        colour = np.concatenate([_soft_histograms(pixels[..., 1:], -100.0, 100.0, e.chroma_bins),
                                 _soft_histograms(lightness[..., None], 0.0, 2.0, e.lightness_bins)], axis=1)
        colour = _unit_rows(np.sqrt(colour / colour.sum(axis=1, keepdims=True)))
        # layout: mean Lab per grid cell minus the frame's mean (every cell has pixels when H, W >= grid)
        row_cell = np.arange(height) * e.grid // height
        col_cell = np.arange(width) * e.grid // width
        cell = (row_cell[:, None] * e.grid + col_cell[None, :]).ravel()  # [N]
        offsets = (np.arange(count) * e.grid**2)[:, None]
        index = (cell[None, :] + offsets).ravel()
        sums = np.stack([np.bincount(index, weights=pixels[..., c].ravel(), minlength=count * e.grid**2)
                         for c in range(3)], axis=-1).reshape(count, e.grid**2, 3)
        counts = np.bincount(cell, minlength=e.grid**2)[None, :, None]
        mean = pixels.mean(axis=1, keepdims=True)  # [B, 1, 3]
        cells = np.where(counts > 0, sums / np.maximum(counts, 1), mean)
        layout = _unit_rows((cells - mean).reshape(count, -1))  # float64: a flat frame's is exactly 0
        # texture: gradient orientations over the whole frame (a full mask erodes to itself)
        grads = [(cv2.Sobel(f[..., 0], cv2.CV_32F, 1, 0, ksize=3), cv2.Sobel(f[..., 0], cv2.CV_32F, 0, 1, ksize=3))
                 for f in lab]
        gx = np.stack([g[0] for g in grads]).reshape(count, -1)
        gy = np.stack([g[1] for g in grads]).reshape(count, -1)
        magnitude = np.hypot(gx, gy).astype(np.float64)
        pos = np.mod(np.arctan2(gy, gx), np.pi).astype(np.float64) / np.pi * e.orientation_bins
        low = np.floor(pos).astype(np.int64) % e.orientation_bins
        frac = pos - np.floor(pos)
        offsets = (np.arange(count) * e.orientation_bins)[:, None]
        size = count * e.orientation_bins
        texture = (np.bincount((low + offsets).ravel(), weights=(magnitude * (1 - frac)).ravel(), minlength=size)
                   + np.bincount(((low + 1) % e.orientation_bins + offsets).ravel(), weights=(magnitude * frac).ravel(),
                                 minlength=size)).reshape(count, -1)
        texture = _unit_rows(texture)
        blocks = [w * b for w, b in zip(e.weights, (colour, layout, texture))]
        return _unit_rows(np.concatenate(blocks, axis=1))

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
