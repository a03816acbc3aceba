"""Images of the HTML report's task gallery: reference frames, continuations, best frames.

Frames smaller than :data:`MIN_SIDE` pixels (MiniWorld's 32x32) are upscaled by a whole factor with
nearest-neighbour, so every source pixel stays a sharp square; frames larger than :data:`MAX_SIDE`
are shrunk with area averaging. Boxes are drawn after scaling, so they stay thin. Animations of small
frames are stored at their own size, losslessly, and upscaled by the page (CSS ``image-rendering:
pixelated`` at the display width): the same squares on screen for half the bytes of a stored upscale
(generated frames are noisy, so a lossless upscale compresses poorly).

What a record does not carry is derived here:

- the best frame of a continuation is the argmax of the record's per-frame ``similarities``
  (frames without a detection, ``None``, never win; the first of equal maxima wins), so its
  similarity is the task's score;
- its box is ``boxes[best]`` of the record, normalised ``(x0, y0, x1, y1)`` in [0, 1] of the frame
  (see :class:`cmbench.scoring.pipeline.TaskScore`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

MIN_SIDE = 128  # smaller frames are upscaled (nearest-neighbour, whole factor) to at least this
MAX_SIDE = 256  # larger frames are shrunk (area) to at most this
MAX_ANIMATION_FRAMES = 48  # longer continuations are subsampled evenly for the animated image
REFERENCE_COLOUR = (0, 230, 64)  # RGB: the annotated target box
DETECTION_COLOUR = (255, 200, 0)  # RGB: the scorer's detected box


def display_size(height: int, width: int) -> tuple[int, int]:
    """``(height, width)`` a frame is shown at in the gallery.

    A whole nearest-neighbour factor for frames whose longer side is below :data:`MIN_SIDE`, a
    shrink to :data:`MAX_SIDE` for frames whose longer side is above it, the frame's own size otherwise.
    """
    side = max(height, width)
    if side < MIN_SIDE:
        factor = math.ceil(MIN_SIDE / side)
        return height * factor, width * factor
    if side > MAX_SIDE:
        scale = MAX_SIDE / side
        return max(1, round(height * scale)), max(1, round(width * scale))
    return height, width


def fit_frames(frames: np.ndarray) -> np.ndarray:
    """Resize frames to their :func:`display_size`.

    Parameters
    ----------
    frames : ndarray, ``uint8 [F, H, W, 3]``

    Returns
    -------
    ndarray, ``uint8 [F, H', W', 3]``
    """
    height, width = frames.shape[1:3]
    new_h, new_w = display_size(height, width)
    if (new_h, new_w) == (height, width):
        return np.ascontiguousarray(frames)
    if new_h > height:
        factor = new_h // height
        return np.repeat(np.repeat(frames, factor, axis=1), factor, axis=2)
    return np.stack([cv2.resize(f, (new_w, new_h), interpolation=cv2.INTER_AREA) for f in frames])


def shrink(frame: np.ndarray) -> np.ndarray:
    """A frame (``uint8 [H, W, 3]``) shrunk to its :func:`display_size` when larger, else as it is."""
    height, width = frame.shape[:2]
    new_h, new_w = display_size(height, width)
    return frame if new_h >= height else cv2.resize(frame, (new_w, new_h), interpolation=cv2.INTER_AREA)


def draw_box(frame: np.ndarray, box: Sequence[float], colour: tuple[int, int, int]) -> np.ndarray:
    """A copy of ``frame`` (``uint8 [H, W, 3]``, RGB) with a normalised ``(x0, y0, x1, y1)`` box drawn.

    The outline is 2 px inside the box's pixel edges, with a 1 px dark rim so it shows on any colour.
    """
    out = np.ascontiguousarray(frame).copy()
    height, width = out.shape[:2]
    x0, y0, x1, y1 = (float(v) for v in box)
    left = int(np.clip(round(x0 * width), 0, width - 1))
    top = int(np.clip(round(y0 * height), 0, height - 1))
    right = int(np.clip(round(x1 * width) - 1, left, width - 1))
    bottom = int(np.clip(round(y1 * height) - 1, top, height - 1))
    cv2.rectangle(out, (left, top), (right, bottom), (0, 0, 0), 4)
    cv2.rectangle(out, (left, top), (right, bottom), colour, 2)
    return out


def best_frame(similarities: Sequence[float | None]) -> int | None:
    """Index of the frame with the highest similarity; None when no frame has a detection."""
    values = np.array([np.nan if s is None else float(s) for s in similarities], dtype=np.float64)
    if values.size == 0 or np.isnan(values).all():
        return None
    return int(np.nanargmax(values))


def write_png(path: Path, frame: np.ndarray) -> Path:
    """Write an RGB frame ``uint8 [H, W, 3]`` as PNG (parent folders are created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(frame).save(path, format="PNG", optimize=False, compress_level=6)
    return path


def write_animation(path: Path, frames: np.ndarray, fps: float, lossless: bool) -> Path:
    """Write frames as an animated WebP that loops forever.

    Parameters
    ----------
    frames : ndarray, ``uint8 [F, H, W, 3]``, at display size, or small frames at their own size
        (the page upscales them). More than :data:`MAX_ANIMATION_FRAMES` are subsampled evenly (each shown longer).
    fps : float
        Frame rate of ``frames``.
    lossless : bool
        Lossless suits upscaled pixel art (few colours, large flat squares); lossy suits natural frames.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    stride = max(1, math.ceil(len(frames) / MAX_ANIMATION_FRAMES))
    images = [Image.fromarray(f) for f in frames[::stride]]
    duration = max(20, round(1000 * stride / fps))
    options = {"lossless": True, "quality": 50, "method": 0} if lossless else {"quality": 80, "method": 2}
    images[0].save(path, format="WEBP", save_all=True, append_images=images[1:], duration=duration, loop=0,
                   **options)
    return path


def reference_image(path: Path, frame: np.ndarray, box: Sequence[float]) -> Path:
    """The reference frame (``uint8 [H, W, 3]``) at display size with the annotated target box."""
    return write_png(path, draw_box(fit_frames(frame[None])[0], box, REFERENCE_COLOUR))


def continuation_images(
    animation: Path, best: Path, frames: np.ndarray, fps: float, best_frame: np.ndarray, box: Sequence[float] | None
) -> tuple[Path, Path]:
    """The continuation as an animated image, and its best frame with the detected box.

    Parameters
    ----------
    frames : ndarray, ``uint8 [F, H, W, 3]``
        The frames of the continuation shown (at its own size, or already shrunk by :func:`shrink`).
    fps : float
        Their frame rate.
    best_frame : ndarray, ``uint8 [H, W, 3]``
        The best frame (:func:`best_frame`; the last one when never detected), at the frames' size.
    box : normalised ``(x0, y0, x1, y1)`` or None
        The detected box in the best frame (None: drawn unboxed).
    """
    shown = fit_frames(frames)
    small = shown.shape[1] > frames.shape[1]  # upscaled for display: the page upscales the animation
    write_animation(animation, frames if small else shown, fps, lossless=small)
    frame = fit_frames(best_frame[None])[0]
    write_png(best, frame if box is None else draw_box(frame, box, DETECTION_COLOUR))
    return animation, best
