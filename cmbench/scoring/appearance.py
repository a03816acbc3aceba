"""Light CPU embedder: a hand-crafted appearance descriptor of a masked crop (not DINO).

Three blocks, each L2-normalised, weighted and concatenated (so the cosine of two descriptors is the
weighted mean of the blocks' cosines):

- ``colour``: soft joint histogram of the masked pixels' CIELAB chroma (a*, b*), ``chroma_bins``
  per axis, plus a lightness histogram of ``lightness_bins``; square-rooted (Hellinger), so
  colour proportions, not raw counts, compare. Lightness is divided by the crop's mean lightness
  first, which removes a global exposure change.
- ``layout``: mean Lab colour of a ``grid x grid`` split of the crop's box (mask-weighted, cells
  without mask pixels take the crop mean), centred per channel: where the colours sit. The means are
  taken in float64, where a flat crop's cells equal its mean exactly: it has no layout (in float32 the
  rounding noise was normalised into a unit layout vector that differed with the crop's size).
- ``texture``: histogram of lightness-gradient orientations (``orientation_bins`` over 180
  degrees, magnitude-weighted, inside the mask eroded by one pixel so the silhouette's edge
  against the background does not count): stripes, bands and checks differ here.

It captures colour, coarse layout and texture of a ~10-50 px object. It has no learned invariances:
it does not know object parts, viewpoint or semantics, and it is no substitute for DINOv2 on real
video; it is meant for MiniWorld's flat-shaded objects (validated by scripts/light_scorer_auc.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np


def _soft_histogram(values: np.ndarray, lo: float, hi: float, bins: int) -> np.ndarray:
    """Linear-interpolation (soft) binning of ``values [N, K]`` on ``bins`` centres per axis.

    Returns
    -------
    ndarray, ``float64 [bins ** K]`` (joint histogram, C order)
    """
    n, k = values.shape
    pos = np.clip((values - lo) / (hi - lo) * bins - 0.5, 0.0, bins - 1.0)
    low = np.floor(pos).astype(np.int64)
    high = np.minimum(low + 1, bins - 1)
    frac = pos - low
    hist = np.zeros(bins**k)
    for corner in range(2**k):
        index = np.zeros(n, dtype=np.int64)
        weight = np.ones(n)
        for axis in range(k):
            upper = (corner >> axis) & 1
            index = index * bins + (high[:, axis] if upper else low[:, axis])
            weight = weight * (frac[:, axis] if upper else 1.0 - frac[:, axis])
        np.add.at(hist, index, weight)
    return hist


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(vector)
    return vector / norm if norm > 0 else vector


class AppearanceEmbedder:
    """Colour + layout + texture descriptor.

    Parameters
    ----------
    chroma_bins : int
        Bins per chroma axis (a*, b* in [-100, 100]).
    lightness_bins : int
        Bins of relative lightness (``L / mean L`` in [0, 2]).
    grid : int
        Layout cells per side.
    orientation_bins : int
        Gradient orientation bins over [0, 180) degrees.
    weights : sequence of 3 float
        Weights of the colour, layout and texture blocks.
    smooth_sigma : float
        Gaussian blur (pixels) of the crop before describing (0 disables it): details a soft
        generated frame cannot keep stop counting against it.
    """

    def __init__(
        self,
        chroma_bins: int = 8,
        lightness_bins: int = 6,
        grid: int = 3,
        orientation_bins: int = 8,
        weights: Sequence[float] = (1.0, 1.0, 1.0),
        smooth_sigma: float = 0.0,
    ):
        if min(chroma_bins, lightness_bins, grid, orientation_bins) < 1:
            raise ValueError("bin counts and grid must be >= 1")
        if len(weights) != 3 or any(w < 0 for w in weights) or not any(weights):
            raise ValueError(f"weights are 3 non-negative numbers, not all zero; got {list(weights)}")
        self.chroma_bins = int(chroma_bins)
        self.lightness_bins = int(lightness_bins)
        self.grid = int(grid)
        self.orientation_bins = int(orientation_bins)
        self.weights = np.asarray(weights, dtype=np.float64)
        self.smooth_sigma = float(smooth_sigma)

    @property
    def dim(self) -> int:
        """Descriptor length D."""
        return self.chroma_bins**2 + self.lightness_bins + 3 * self.grid**2 + self.orientation_bins

    def embed(self, crops: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> np.ndarray:
        """Unit-norm descriptors.

        Parameters
        ----------
        crops : sequence of ``uint8 [h_i, w_i, 3]`` RGB
        masks : sequence of ``bool [h_i, w_i]``, non-empty

        Returns
        -------
        ndarray, ``float32 [N, D]`` with D = :attr:`dim`
        """
        out = np.zeros((len(crops), self.dim), dtype=np.float32)
        for i, (crop, mask) in enumerate(zip(crops, masks)):
            out[i] = self.describe(crop, mask)
        return out

    def describe(self, crop: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Descriptor of one masked crop, ``float64 [D]`` (unit norm)."""
        if not mask.any():
            raise ValueError("cannot describe an empty mask")
        image: np.ndarray = crop.astype(np.float32) / 255.0
        if self.smooth_sigma > 0:
            image = cv2.GaussianBlur(image, (0, 0), self.smooth_sigma, borderType=cv2.BORDER_REFLECT)
        lab = cv2.cvtColor(image, cv2.COLOR_RGB2Lab)  # L in [0,100], a,b ~[-100,100]
        pixels = lab[mask]
        lightness = pixels[:, 0] / max(float(pixels[:, 0].mean()), 1e-3)
        colour = np.concatenate(
            [
                _soft_histogram(pixels[:, 1:], -100.0, 100.0, self.chroma_bins),
                _soft_histogram(lightness[:, None], 0.0, 2.0, self.lightness_bins),
            ]
        )
        blocks = [_unit(np.sqrt(colour / colour.sum())), _unit(self._layout(lab, mask)), _unit(self._texture(lab, mask))]
        return _unit(np.concatenate([w * b for w, b in zip(self.weights, blocks)]))

    def _layout(self, lab: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Mean-centred Lab colour per grid cell, ``[3 * grid ** 2]``."""
        pixels = lab[mask].astype(np.float64)  # exact sums: a flat crop's cells equal its mean
        mean = pixels.mean(axis=0)
        # cell index of every pixel along each axis (a crop smaller than the grid repeats pixels)
        row_cell = np.arange(mask.shape[0]) * self.grid // mask.shape[0]
        col_cell = np.arange(mask.shape[1]) * self.grid // mask.shape[1]
        cell = (row_cell[:, None] * self.grid + col_cell[None, :])[mask]
        sums = np.zeros((self.grid**2, 3))
        np.add.at(sums, cell, pixels)
        counts = np.bincount(cell, minlength=self.grid**2)[:, None]
        cells = np.where(counts > 0, sums / np.maximum(counts, 1), mean)
        return (cells - mean).ravel()

    def _texture(self, lab: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Magnitude-weighted gradient-orientation histogram of the L channel inside the mask."""
        interior = cv2.erode(mask.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
        if interior.any():  # leave out the silhouette's edge against the background
            mask = interior
        gx = cv2.Sobel(lab[..., 0], cv2.CV_32F, 1, 0, ksize=3)
        gy = cv2.Sobel(lab[..., 0], cv2.CV_32F, 0, 1, ksize=3)
        magnitude = np.hypot(gx, gy)[mask]
        angle = np.mod(np.arctan2(gy, gx)[mask], np.pi)
        pos = angle / np.pi * self.orientation_bins
        low = np.floor(pos).astype(np.int64) % self.orientation_bins
        frac = pos - np.floor(pos)
        hist = np.zeros(self.orientation_bins)
        np.add.at(hist, low, magnitude * (1 - frac))
        np.add.at(hist, (low + 1) % self.orientation_bins, magnitude * frac)
        return hist
