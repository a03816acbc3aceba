"""Box and mask geometry shared by every scorer backend.

Boxes are ``(x0, y0, x1, y1)`` in continuous pixel coordinates: pixel ``(row i, column j)`` spans
``[j, j + 1) x [i, i + 1)``, so a full ``H x W`` frame is the box ``(0, 0, W, H)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def denormalize_box(box: Sequence[float], height: int, width: int) -> np.ndarray:
    """Normalised ``(x0, y0, x1, y1)`` in [0, 1] -> pixel box, ``float64 [4]``."""
    return np.asarray(box, dtype=np.float64) * np.array([width, height, width, height], dtype=np.float64)


def normalize_box(box: np.ndarray, height: int, width: int) -> list[float]:
    """Pixel box ``[4]`` -> normalised ``[x0, y0, x1, y1]`` (plain floats, for JSON records)."""
    scale = np.array([width, height, width, height], dtype=np.float64)
    return [float(v) for v in np.asarray(box, dtype=np.float64) / scale]


def clip_boxes(boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    """Clip pixel boxes to the frame and order their corners.

    Parameters
    ----------
    boxes : ndarray, ``float [N, 4]``
        Possibly outside the frame, possibly with swapped corners (random detectors produce both).

    Returns
    -------
    ndarray, ``float64 [N, 4]`` with ``0 <= x0 <= x1 <= W`` and ``0 <= y0 <= y1 <= H``.
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    x = np.clip(np.sort(boxes[:, [0, 2]], axis=1), 0.0, width)
    y = np.clip(np.sort(boxes[:, [1, 3]], axis=1), 0.0, height)
    return np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1)


def boxes_valid(boxes: np.ndarray, min_size: float = 1.0) -> np.ndarray:
    """Which (clipped) boxes are at least ``min_size`` pixels wide and high, ``bool [N]``.

    NaN boxes (no detection) are invalid.
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    return np.isfinite(boxes).all(axis=1) & (w >= min_size) & (h >= min_size)


def box_pixel_slices(box: np.ndarray, height: int, width: int) -> tuple[slice, slice]:
    """Row and column slices of the pixels a pixel box touches (partially covered pixels included)."""
    x0, y0, x1, y1 = np.asarray(box, dtype=np.float64)
    c0 = int(np.clip(np.floor(x0), 0, width))
    c1 = int(np.clip(np.ceil(x1), c0, width))
    r0 = int(np.clip(np.floor(y0), 0, height))
    r1 = int(np.clip(np.ceil(y1), r0, height))
    return slice(r0, r1), slice(c0, c1)


def box_mask(box: np.ndarray, height: int, width: int) -> np.ndarray:
    """The pixels a box touches as a mask, ``bool [H, W]``."""
    mask = np.zeros((height, width), dtype=bool)
    mask[box_pixel_slices(box, height, width)] = True
    return mask


def mask_bbox(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """Tight pixel box ``(x0, y0, x1, y1)`` (exclusive ends) of a ``bool [H, W]`` mask; None if empty."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def masked_crop(frame: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Crop a frame to the tight box of a mask.

    Parameters
    ----------
    frame : ndarray, ``uint8 [H, W, 3]``
    mask : ndarray, ``bool [H, W]``, non-empty

    Returns
    -------
    crop : ndarray, ``uint8 [h, w, 3]`` (background pixels untouched; embedders decide how to use
        the mask)
    crop_mask : ndarray, ``bool [h, w]``
    """
    bbox = mask_bbox(mask)
    if bbox is None:
        raise ValueError("masked_crop needs a non-empty mask")
    x0, y0, x1, y1 = bbox
    return frame[y0:y1, x0:x1], mask[y0:y1, x0:x1]
