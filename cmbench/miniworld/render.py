"""Rendering a MiniWorld scene through a camera, and where its objects are in each frame.

The camera pose of a frame is one integer, the horizontal offset ``x`` of a 32x32 window into the
panorama (wrapping around). A frame is a crop of the panorama, so rendering is a single gather for a
whole camera path; a dynamic scene then gets its movers and lighting at the absolute frame index
(:mod:`cmbench.miniworld.dynamics`). For the ``real`` source, frame ``f`` is then scaled by the exposure drift and gets
its own sensor noise (seeded by ``(scene.noise_seed, f)``), so pass the absolute frame index of the
first frame (``first_frame``) when rendering a later part of a video.

Object masks come from the scene's label map, so they are exact for every source.
"""

from __future__ import annotations

import numpy as np

from cmbench.miniworld.dynamics import draw_dynamics
from cmbench.miniworld.scene import FRAME, Scene

_WINDOW = np.arange(FRAME)


def _camera_array(camera_x) -> np.ndarray:
    cams = np.asarray(camera_x)
    if cams.ndim != 1 or not np.issubdtype(cams.dtype, np.integer):
        raise ValueError(f"camera offsets must be a 1-D integer array, got {cams.dtype} with shape {cams.shape}")
    return cams.astype(np.int64)


def window_columns(scene: Scene, camera_x) -> np.ndarray:
    """Panorama columns seen by each frame, ``int64 [F, 32]``, for offsets ``int [F]``."""
    return (_camera_array(camera_x)[:, None] + _WINDOW) % scene.width


def sensor_effects(scene: Scene, frames: np.ndarray, first_frame: int) -> np.ndarray:
    """Exposure drift and sensor noise of the ``real`` source (identity for ``synthetic``).

    Parameters
    ----------
    frames : ndarray, ``uint8 [F, 32, 32, 3]``
        Clean crops; frame ``i`` is absolute frame ``first_frame + i``.

    Returns
    -------
    ndarray, ``uint8 [F, 32, 32, 3]``
    """
    if scene.noise_std == 0 and scene.exposure_amplitude == 0:
        return frames
    index = first_frame + np.arange(len(frames))
    gain = 1 + scene.exposure_amplitude * np.sin(2 * np.pi * index / scene.exposure_period + scene.exposure_phase)
    shape = frames.shape[1:]
    noise = np.stack([np.random.default_rng([scene.noise_seed, int(f)]).standard_normal(shape, dtype=np.float32) for f in index])
    out = frames.astype(np.float32) * gain[:, None, None, None].astype(np.float32) + scene.noise_std * noise
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def render_video(scene: Scene, camera_x, first_frame: int = 0) -> np.ndarray:
    """Frames seen along a camera path.

    Parameters
    ----------
    scene : Scene
    camera_x : array-like of int, ``[F]``
        Horizontal camera offset of each frame, pixels (taken modulo the panorama width).
    first_frame : int
        Absolute index of the first frame (drives a dynamic scene's movers and lighting and the
        ``real`` source's noise and exposure drift).

    Returns
    -------
    ndarray, ``uint8 [F, 32, 32, 3]`` RGB
    """
    columns = window_columns(scene, camera_x)
    frames = scene.panorama[:, columns].transpose(1, 0, 2, 3)
    if scene.dynamics is not None:
        frames = draw_dynamics(scene.dynamics, scene.labels, frames, columns, first_frame)
    return np.ascontiguousarray(sensor_effects(scene, frames, first_frame))


def render_frame(scene: Scene, camera_x: int, frame_index: int = 0) -> np.ndarray:
    """One frame at offset ``camera_x``: ``uint8 [32, 32, 3]`` (see :func:`render_video`)."""
    return render_video(scene, np.array([camera_x], dtype=np.int64), frame_index)[0]


def object_masks(scene: Scene, camera_x, object_id: int) -> np.ndarray:
    """Pixels of one object in each frame, ``bool [F, 32, 32]``, for offsets ``int [F]``."""
    if not 0 <= object_id < len(scene.objects):
        raise IndexError(f"object_id {object_id} out of range (scene has {len(scene.objects)} objects)")
    return (scene.labels[:, window_columns(scene, camera_x)] == object_id).transpose(1, 0, 2)


def object_mask(scene: Scene, camera_x: int, object_id: int) -> np.ndarray:
    """Pixels of one object in the frame at offset ``camera_x``, ``bool [32, 32]``."""
    return object_masks(scene, np.array([camera_x], dtype=np.int64), object_id)[0]


def visible_pixels(scene: Scene, camera_x) -> np.ndarray:
    """Number of pixels of every object inside each frame.

    Returns
    -------
    ndarray, ``int64 [F, n_objects]``
    """
    per_column = np.stack([(scene.labels == o.object_id).sum(axis=0) for o in scene.objects])  # [n, W]
    return per_column[:, window_columns(scene, camera_x)].sum(axis=2).T


def visible_fraction(scene: Scene, camera_x) -> np.ndarray:
    """Fraction of every object's area inside each frame, ``float [F, n_objects]`` in [0, 1]."""
    areas = np.array([o.area for o in scene.objects], dtype=np.float64)
    return visible_pixels(scene, camera_x) / areas


def object_boxes(scene: Scene, camera_x, object_id: int) -> np.ndarray:
    """Tight box of an object's visible pixels per frame, normalised ``xyxy``.

    Returns
    -------
    ndarray, ``float [F, 4]``
        ``(x0, y0, x1, y1)`` in [0, 1] (pixel edges: a 1-px object at column c spans c/32..(c+1)/32);
        NaN rows where the object is not visible.
    """
    masks = object_masks(scene, camera_x, object_id)
    boxes = np.full((len(masks), 4), np.nan)
    rows, cols = np.any(masks, axis=2), np.any(masks, axis=1)  # [F, 32] each
    seen = np.any(rows, axis=1)
    for f in np.flatnonzero(seen):
        r, c = np.flatnonzero(rows[f]), np.flatnonzero(cols[f])
        boxes[f] = (c[0] / FRAME, r[0] / FRAME, (c[-1] + 1) / FRAME, (r[-1] + 1) / FRAME)
    return boxes
