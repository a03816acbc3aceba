"""Camera paths: dwells and pans of a 32-px window around a wrap-around panorama.

A path is ``int64 [F]``, the camera offset of every frame, always a multiple of ``CAMERA_STEP``
(4 px, one DiT token) in ``[0, width)``. The camera either rests (speed 0) or pans at 4 or 8 px per
frame; a pan whose distance is not a multiple of 8 ends with one 4-px step.

:func:`sample_camera_path` draws training paths with dwells, pans to new places and returns to
places seen long before (revisits), the structure MiniWorld contexts are made of.
"""

from __future__ import annotations

import numpy as np

from cmbench.miniworld.scene import CAMERA_STEP, check_width

SPEEDS = (4, 8)  # pixels per frame while panning


def ring_delta(start: int, stop: int, width: int, direction: int) -> int:
    """Distance in pixels from ``start`` to ``stop`` moving in ``direction`` (+1 right, -1 left)."""
    return ((stop - start) * direction) % width


def pan(start: int, stop: int, speed: int, direction: int, width: int) -> np.ndarray:
    """Offsets of the frames of a pan, not including the start, ending exactly at ``stop``.

    Parameters
    ----------
    start, stop : int
        Offsets (multiples of 4).
    speed : int
        4 or 8 px per frame.
    direction : int
        +1 (offsets increase: the camera turns right) or -1.
    width : int
        Panorama width.

    Returns
    -------
    ndarray, ``int64 [ceil(distance / speed)]``
    """
    if speed not in SPEEDS:
        raise ValueError(f"pan speed must be one of {SPEEDS}, got {speed}")
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    if start % CAMERA_STEP or stop % CAMERA_STEP:
        raise ValueError(f"pan ends must be multiples of {CAMERA_STEP}, got {start} -> {stop}")
    distance = ring_delta(start, stop, width, direction)
    travelled = np.minimum(np.arange(1, -(-distance // speed) + 1) * speed, distance)
    return (start + direction * travelled) % width


def shortest_direction(start: int, stop: int, width: int) -> int:
    """+1 or -1, whichever reaches ``stop`` sooner (+1 on a tie)."""
    return 1 if ring_delta(start, stop, width, 1) <= ring_delta(start, stop, width, -1) else -1


def sample_camera_path(
    rng: np.random.Generator,
    n_frames: int,
    width: int = 256,
    dwell_frames: tuple[int, int] = (2, 8),
    revisit_gap: int = 48,
    p_dwell: float = 0.4,
    p_revisit: float = 0.3,
) -> np.ndarray:
    """A random camera path for training: dwells, pans to new offsets, and long-range revisits.

    Each step is one of: rest for ``dwell_frames`` frames; pan (4 or 8 px/frame, random direction)
    to a random offset; or, with probability ``p_revisit`` once the path is long enough, pan by the
    shorter way back to an offset the camera held at least ``revisit_gap`` frames earlier.

    Parameters
    ----------
    rng : numpy.random.Generator
    n_frames : int
        Length of the path.
    width : int
        Panorama width (multiple of 32).
    dwell_frames : (int, int)
        Inclusive range of a dwell's length.
    revisit_gap : int
        Minimum age, in frames, of a revisited offset.
    p_dwell, p_revisit : float
        Probabilities of a dwell and of a revisit step (the rest are pans to new offsets).

    Returns
    -------
    ndarray, ``int64 [n_frames]``, multiples of 4 in ``[0, width)``
    """
    check_width(width)
    if n_frames < 1:
        raise ValueError(f"n_frames must be >= 1, got {n_frames}")
    steps = width // CAMERA_STEP
    path = [int(rng.integers(steps)) * CAMERA_STEP]
    while len(path) < n_frames:
        draw = rng.random()
        if draw < p_dwell:
            path += [path[-1]] * int(rng.integers(dwell_frames[0], dwell_frames[1] + 1))
            continue
        old = path[: max(0, len(path) - revisit_gap)]
        if draw < p_dwell + p_revisit and old:
            stop = old[int(rng.integers(len(old)))]
            direction = shortest_direction(path[-1], stop, width)
        else:
            distance = int(rng.integers(1, steps // 2 + 1)) * CAMERA_STEP
            direction = int(rng.choice((-1, 1)))
            stop = (path[-1] + direction * distance) % width
        if stop != path[-1]:
            path += pan(path[-1], stop, int(rng.choice(SPEEDS)), direction, width).tolist()
    return np.asarray(path[:n_frames], dtype=np.int64)
