"""What changes with time in a dynamic MiniWorld: moving entities, their schedule, the lighting.

A dynamic scene (``sample_scene(..., dynamic=True)``) keeps its places and objects exactly as a
static one (an object's appearance is its identity, and its pixels stay where the label map says),
and adds, all deterministic from the scene's seed and the absolute frame index:

- **movers**: small coloured bars travelling along the panorama at their own speed (0.25-1.5 px per
  frame, either direction) with a slow vertical bob; each one is present on a periodic schedule
  (it appears, stays for part of its period, leaves). Movers pass *behind* the objects: they are
  drawn on background pixels only, so object masks, boxes and visibility stay exact;
- **lighting**: a slow global gain with a colour-temperature swing,
  ``gain_c(f) = 1 + a sin(2 pi f / T + phi) + b sin(2 pi f / T2 + phi2) * tint_c`` with
  ``tint = (1, 0, -1)`` (warmer / cooler), ``a`` 8-15 %, ``T`` 150-300 frames.

So predicting the next frames needs the order and the spacing of the earlier ones: where a mover
is now follows from where it was and how many frames ago; what a place looks like now follows from
what it looked like and how the light has changed since.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MOVER_HEIGHT = 3  # pixels
MOVER_WIDTHS = (5, 7)  # inclusive range, pixels
SPEEDS = (0.25, 1.5)  # px per frame, magnitude range
TINT = np.array([1.0, 0.0, -1.0], dtype=np.float32)


@dataclass(frozen=True, eq=False)
class Dynamics:
    """Movers and lighting of a dynamic scene (arrays have one entry per mover, ``[M]``).

    Attributes
    ----------
    x0 : ndarray ``float [M]``
        Panorama column of the mover's left edge at frame 0 (pixels).
    speed : ndarray ``float [M]``
        Pixels per frame (signed).
    y0 : ndarray ``int [M]``
        Top row at rest.
    bob_amplitude, bob_period, bob_phase : ndarray ``float [M]``
        Vertical bob ``round(amplitude * sin(2 pi f / period + phase))`` rows.
    width : ndarray ``int [M]``
        Bar width in pixels (height :data:`MOVER_HEIGHT`).
    colour : ndarray ``uint8 [M, 3]``
    period, on_frames, phase : ndarray ``int [M]``
        Schedule: present at frame ``f`` when ``(f + phase) mod period < on_frames``.
    light : tuple of 6 floats
        ``(a, T, phi, b, T2, phi2)`` of the lighting gain.
    """

    x0: np.ndarray
    speed: np.ndarray
    y0: np.ndarray
    bob_amplitude: np.ndarray
    bob_period: np.ndarray
    bob_phase: np.ndarray
    width: np.ndarray
    colour: np.ndarray
    period: np.ndarray
    on_frames: np.ndarray
    phase: np.ndarray
    light: tuple[float, float, float, float, float, float]

    @property
    def n_movers(self) -> int:
        return len(self.x0)

    def present(self, frames: np.ndarray) -> np.ndarray:
        """Whether each mover is in the world at each frame, ``bool [F, M]``."""
        f = np.asarray(frames, dtype=np.int64)[:, None]
        return (f + self.phase[None, :]) % self.period[None, :] < self.on_frames[None, :]

    def positions(self, frames: np.ndarray, panorama_width: int) -> tuple[np.ndarray, np.ndarray]:
        """Left column and top row of each mover at each frame, ``int [F, M]`` each."""
        f = np.asarray(frames, dtype=np.float64)[:, None]
        left = np.floor(self.x0[None, :] + self.speed[None, :] * f).astype(np.int64) % panorama_width
        bob = self.bob_amplitude[None, :] * np.sin(2 * np.pi * f / self.bob_period[None, :] + self.bob_phase[None, :])
        return left, self.y0[None, :] + np.rint(bob).astype(np.int64)

    def gain(self, frames: np.ndarray) -> np.ndarray:
        """Lighting gain per frame and colour channel, ``float32 [F, 3]``."""
        a, t1, p1, b, t2, p2 = self.light
        f = np.asarray(frames, dtype=np.float64)[:, None]
        g = 1 + a * np.sin(2 * np.pi * f / t1 + p1) + b * np.sin(2 * np.pi * f / t2 + p2) * TINT[None, :]
        return g.astype(np.float32)


def sample_dynamics(rng: np.random.Generator, height: int, width: int) -> Dynamics:
    """Draw the movers and the lighting of a ``height x width`` panorama.

    About 1 to 1.5 movers per 32-px place, so a frame usually shows one or two.
    """
    n_places = width // 32
    m = int(rng.integers(n_places, n_places * 3 // 2 + 1))
    speed = rng.uniform(*SPEEDS, size=m) * rng.choice([-1.0, 1.0], size=m)
    bar = rng.integers(MOVER_WIDTHS[0], MOVER_WIDTHS[1] + 1, size=m)
    hue = rng.uniform(0, 1, size=m)
    colour = np.stack([_hue_to_rgb(h, float(v)) for h, v in zip(hue, rng.uniform(0.55, 1.0, size=m))])
    period = rng.integers(64, 193, size=m)
    on_frames = np.rint(period * rng.uniform(0.4, 0.9, size=m)).astype(np.int64)
    light = (
        float(rng.uniform(0.08, 0.15)), float(rng.uniform(150, 300)), float(rng.uniform(0, 2 * np.pi)),
        float(rng.uniform(0.03, 0.06)), float(rng.uniform(200, 400)), float(rng.uniform(0, 2 * np.pi)),
    )
    return Dynamics(
        x0=rng.uniform(0, width, size=m),
        speed=speed,
        y0=rng.integers(3, height - MOVER_HEIGHT - 3, size=m),
        bob_amplitude=rng.uniform(0.0, 2.5, size=m),
        bob_period=rng.uniform(24, 64, size=m),
        bob_phase=rng.uniform(0, 2 * np.pi, size=m),
        width=bar.astype(np.int64),
        colour=colour,
        period=period.astype(np.int64),
        on_frames=on_frames,
        phase=rng.integers(0, 10_000, size=m).astype(np.int64),
        light=light,
    )


def _hue_to_rgb(hue: float, value: float) -> np.ndarray:
    """A saturated colour of the given hue and brightness, ``uint8 [3]``."""
    k = (np.array([5.0, 3.0, 1.0]) + hue * 6) % 6
    rgb = value * (1 - np.clip(np.minimum(k, 4 - k), 0, 1))
    return np.clip(np.rint(rgb * 255), 0, 255).astype(np.uint8)


def draw_dynamics(
    dynamics: Dynamics, labels: np.ndarray, frames: np.ndarray, window_columns: np.ndarray, first_frame: int
) -> np.ndarray:
    """Movers (on background pixels) and lighting applied to clean crops of the panorama.

    Parameters
    ----------
    dynamics : Dynamics
    labels : ndarray ``int16 [H, W]``
        The scene's object id per panorama pixel (-1 = background).
    frames : ndarray ``uint8 [F, H, 32, 3]``
        Crops of the panorama; frame ``i`` is absolute frame ``first_frame + i``.
    window_columns : ndarray ``int [F, 32]``
        Panorama column of every frame column (the first one is the camera offset).
    first_frame : int

    Returns
    -------
    ndarray ``uint8 [F, H, 32, 3]`` (a new array)
    """
    n, height, frame_width = frames.shape[:3]
    width = labels.shape[1]
    index = first_frame + np.arange(n)
    out = frames.copy()
    present = dynamics.present(index)
    left, top = dynamics.positions(index, width)
    cam = window_columns[:, 0]
    for m in range(dynamics.n_movers):
        dy, dx = np.divmod(np.arange(MOVER_HEIGHT * int(dynamics.width[m])), int(dynamics.width[m]))
        px = (left[:, m, None] + dx[None, :]) % width  # [F, P] panorama columns
        py = np.clip(top[:, m, None] + dy[None, :], 0, height - 1)
        local = (px - cam[:, None]) % width
        draw = present[:, m, None] & (local < frame_width) & (labels[py, px] < 0)
        f_idx = np.broadcast_to(np.arange(n)[:, None], draw.shape)
        out[f_idx[draw], py[draw], local[draw]] = dynamics.colour[m]
    lit = out.astype(np.float32) * dynamics.gain(index)[:, None, None, :]
    return np.clip(np.rint(lit), 0, 255).astype(np.uint8)
