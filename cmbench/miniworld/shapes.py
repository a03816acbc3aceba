"""Object categories of MiniWorld: the detector text and the silhouette of each category.

A category is what a text-prompted detector is asked for (``label``, plus ``aliases``); its shape is
a silhouette drawn at 10-14 px. Shapes are defined on the square ``[-1, 1]^2`` (``u`` to the right,
``v`` downwards) and rasterised with 4x4 supersampling: a pixel belongs to the shape when at least
half of its sub-samples do.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from matplotlib.path import Path as PolygonPath

SUPERSAMPLE = 4


@dataclass(frozen=True)
class Category:
    """One object category.

    Attributes
    ----------
    label : str
        The detector query (``target_label`` of a task).
    aliases : tuple of str
        Further queries naming the same category (``target_aliases``).
    """

    label: str
    aliases: tuple[str, ...]


def _star_polygon(points: int, outer: float, inner: float) -> np.ndarray:
    angles = -np.pi / 2 + np.pi * np.arange(2 * points) / points
    radii = np.where(np.arange(2 * points) % 2 == 0, outer, inner)
    return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def _inside(polygon: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    points = np.stack([u.ravel(), v.ravel()], axis=1)
    return PolygonPath(polygon).contains_points(points).reshape(u.shape)


_TRIANGLE = np.array([[0.0, -1.0], [1.0, 0.9], [-1.0, 0.9]])
_ARROW = np.array([[-0.95, -0.3], [0.15, -0.3], [0.15, -0.8], [0.95, 0.0], [0.15, 0.8], [0.15, 0.3], [-0.95, 0.3]])


def _heart(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    x, y = 1.25 * u, -1.25 * v + 0.25
    return (x**2 + y**2 - 1) ** 3 - x**2 * y**3 <= 0


# category label -> (aliases, inside-test on the [-1, 1]^2 square)
_SHAPES = {
    "star": (("star shape", "five-pointed star"), lambda u, v: _inside(_star_polygon(5, 1.08, 0.5) + [0, 0.1], u, v)),
    "ring": (("donut", "hoop"), lambda u, v: (u**2 + v**2 <= 0.97**2) & (u**2 + v**2 >= 0.5**2)),
    "cross": (("plus sign", "plus"), lambda u, v: ((abs(u) <= 0.32) | (abs(v) <= 0.32)) & (np.maximum(abs(u), abs(v)) <= 0.95)),
    "diamond": (("rhombus", "lozenge"), lambda u, v: abs(u) + abs(v) <= 1.0),
    "triangle": (("triangular shape",), lambda u, v: _inside(_TRIANGLE, u, v)),
    "circle": (("disk", "ball", "dot"), lambda u, v: u**2 + v**2 <= 0.92**2),
    "square": (("box", "block"), lambda u, v: (abs(u) <= 0.8) & (abs(v) <= 0.8)),
    "crescent": (("moon", "crescent moon"), lambda u, v: (u**2 + v**2 <= 0.97**2) & ((u - 0.45) ** 2 + (v + 0.2) ** 2 > 0.72**2)),
    "heart": (("heart shape", "love heart"), _heart),
    "arrow": (("arrow sign", "pointer"), lambda u, v: _inside(_ARROW, u, v)),
}

CATEGORIES: dict[str, Category] = {label: Category(label, aliases) for label, (aliases, _) in _SHAPES.items()}


@lru_cache(maxsize=None)
def shape_mask(label: str, size: int) -> np.ndarray:
    """Silhouette of a category.

    Parameters
    ----------
    label : str
        A key of :data:`CATEGORIES`.
    size : int
        Side of the square bounding the shape, in pixels (>= 4).

    Returns
    -------
    ndarray, ``bool [size, size]`` (read-only; cached)
    """
    if label not in _SHAPES:
        raise KeyError(f"unknown MiniWorld category {label!r}; known: {', '.join(_SHAPES)}")
    if size < 4:
        raise ValueError(f"shape size must be >= 4 px, got {size}")
    n = size * SUPERSAMPLE
    centres = (np.arange(n) + 0.5) / n * 2 - 1
    v, u = np.meshgrid(centres, centres, indexing="ij")
    inside = _SHAPES[label][1](u, v).astype(np.float32)
    coverage = inside.reshape(size, SUPERSAMPLE, size, SUPERSAMPLE).mean(axis=(1, 3))
    mask = coverage >= 0.5
    mask.setflags(write=False)
    return mask
