"""Appearances of MiniWorld objects and backgrounds, for the two sources.

``synthetic``: objects are filled with two named colours in a pattern (stripes, checks, ...), the
background is a smooth periodic colour field. ``real``: objects are filled with a patch of one of the
photographs that ship inside scikit-image's wheel (loaded offline by ``skimage.data``), the
background is a tinted photographic texture (brick, grass, gravel), made seamless for wrap-around.

Every function takes a ``numpy.random.Generator`` and is deterministic given its state.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np

# saturated colours for object fills, with the names used in prompts
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (245, 140, 20),
    "yellow": (245, 225, 40),
    "green": (40, 190, 60),
    "cyan": (40, 215, 230),
    "blue": (30, 70, 225),
    "purple": (140, 50, 200),
    "pink": (250, 120, 190),
    "white": (250, 250, 250),
    "black": (15, 15, 15),
}

PATTERNS = ("striped", "banded", "diagonal-striped", "checkered", "spotted", "half-and-half", "ringed", "bordered")

# photographs bundled in scikit-image's wheel: object fills (colour) and background textures (grey)
OBJECT_PHOTOS: dict[str, str] = {
    "astronaut": "astronaut-photo",
    "coffee": "coffee-cup-photo",
    "chelsea": "cat-fur",
    "rocket": "rocket-photo",
    "immunohistochemistry": "stained-tissue",
    "hubble_deep_field": "night-sky",
    "retina": "retina-photo",
}
BACKGROUND_PHOTOS: dict[str, str] = {"brick": "a brick wall", "grass": "grass", "gravel": "gravel"}
BACKGROUND_TINTS: dict[str, tuple[float, float, float]] = {  # tint name -> RGB gain
    "warm": (1.0, 0.85, 0.7),
    "cool": (0.75, 0.85, 1.0),
    "green": (0.8, 1.0, 0.75),
    "neutral": (0.92, 0.92, 0.92),
}


@dataclass(frozen=True)
class Appearance:
    """How one object looks.

    Attributes
    ----------
    fill : ndarray, ``uint8 [size, size, 3]``
        Colours of the object's bounding square (only pixels under the shape mask are drawn).
    description : str
        Words for prompts, e.g. ``"red and white checkered"`` or ``"cat-fur textured"``.
    key : tuple
        What makes two appearances different (colours and pattern, or photo name).
    """

    fill: np.ndarray
    description: str
    key: tuple


def pattern_mask(pattern: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """Two-colour pattern over a square: True where the second colour goes.

    Parameters
    ----------
    pattern : str
        One of :data:`PATTERNS`.
    size : int
    rng : numpy.random.Generator
        Draws the pattern's phase and period.

    Returns
    -------
    ndarray, ``bool [size, size]``
    """
    i, j = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    period = int(rng.integers(3, 5))
    phase = int(rng.integers(0, period))
    centre = (size - 1) / 2
    if pattern == "striped":
        return (i + phase) % period < period / 2
    if pattern == "banded":
        return (j + phase) % period < period / 2
    if pattern == "diagonal-striped":
        return (i + j + phase) % (2 * period) < period
    if pattern == "checkered":
        return ((i // 3) + (j // 3)) % 2 == 1
    if pattern == "spotted":
        return ((i + phase) % 4 < 2) & ((j + phase) % 4 < 2)  # 2x2 dots every 4 px
    if pattern == "half-and-half":
        return j >= size // 2
    if pattern == "ringed":
        return np.hypot(i - centre, j - centre).astype(int) % 4 >= 2
    if pattern == "bordered":
        return np.minimum(np.minimum(i, j), np.minimum(size - 1 - i, size - 1 - j)) >= 2
    raise KeyError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")


def synthetic_appearance(size: int, rng: np.random.Generator, avoid: tuple = ()) -> Appearance:
    """Two named colours in a pattern.

    Parameters
    ----------
    size : int
    rng : numpy.random.Generator
    avoid : tuple of Appearance keys
        Appearances this one must differ from: no shared colour and no shared pattern (a distractor
        of the same category must look clearly different).

    Returns
    -------
    Appearance
    """
    used_colours = {c for key in avoid for c in key[:2]}
    used_patterns = {key[2] for key in avoid}
    colours = [c for c in PALETTE if c not in used_colours]
    patterns = [p for p in PATTERNS if p not in used_patterns]
    first, second = rng.choice(len(colours), size=2, replace=False)
    c1, c2 = colours[first], colours[second]
    pattern = patterns[int(rng.integers(len(patterns)))]
    second_colour = pattern_mask(pattern, size, rng)
    fill = np.where(second_colour[..., None], PALETTE[c2], PALETTE[c1]).astype(np.uint8)
    return Appearance(fill, f"{c1} and {c2} {pattern}", (c1, c2, pattern))


@lru_cache(maxsize=None)
def load_photo(name: str) -> np.ndarray:
    """A photograph from scikit-image's bundled data, as ``uint8 [H, W, 3]`` RGB (read-only).

    Raises
    ------
    RuntimeError
        When the installed scikit-image lacks the image (it would otherwise try to download it).
    """
    import skimage.data

    loader = getattr(skimage.data, name, None)
    if loader is None:
        raise RuntimeError(f"scikit-image has no bundled image {name!r}")
    try:
        image = loader()
    except (ModuleNotFoundError, OSError) as err:  # pooch download path of non-bundled images
        raise RuntimeError(f"scikit-image image {name!r} is not bundled in the installed wheel: {err}") from err
    image = np.asarray(image)
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=2)
    image = np.ascontiguousarray(image[..., :3]).astype(np.uint8)
    image.setflags(write=False)
    return image


def photo_appearance(size: int, rng: np.random.Generator, avoid: tuple = ()) -> Appearance:
    """A square patch of a bundled colour photograph, shrunk to ``size``.

    Parameters
    ----------
    size : int
    rng : numpy.random.Generator
    avoid : tuple of Appearance keys
        Photos already used by objects this one must differ from.

    Returns
    -------
    Appearance
    """
    used = {key[0] for key in avoid}
    names = [n for n in OBJECT_PHOTOS if n not in used]
    name = names[int(rng.integers(len(names)))]
    photo = load_photo(name)
    side = int(rng.integers(48, min(photo.shape[:2]) // 2))
    y = int(rng.integers(0, photo.shape[0] - side + 1))
    x = int(rng.integers(0, photo.shape[1] - side + 1))
    patch = cv2.resize(photo[y : y + side, x : x + side], (size, size), interpolation=cv2.INTER_AREA)
    # stretch the patch's contrast so that a 12-px thumbnail keeps some structure
    lo, hi = np.percentile(patch, (2, 98))
    patch = np.clip((patch.astype(np.float32) - lo) * (255.0 / max(hi - lo, 1.0)), 0, 255).astype(np.uint8)
    return Appearance(patch, f"{OBJECT_PHOTOS[name]} textured", (name,))


def synthetic_background(height: int, width: int, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """A smooth, muted colour field, exactly periodic along x (integer harmonics of ``width``).

    Returns
    -------
    background : ndarray, ``uint8 [height, width, 3]``
    description : str
        E.g. ``"blue-grey waves"``.
    """
    x = np.arange(width) / width * 2 * np.pi
    y = np.arange(height)[:, None, None] / height
    base = rng.uniform(70, 170, size=3)
    field = np.broadcast_to(base, (height, width, 3)).astype(np.float64).copy()
    for _ in range(3):
        harmonic = int(rng.integers(1, 6))
        amplitude = rng.uniform(15, 35, size=3)
        phase = rng.uniform(0, 2 * np.pi, size=3)
        tilt = rng.uniform(-1.5, 1.5)
        field += amplitude * np.sin(harmonic * x[None, :, None] + phase + tilt * y)
    field += rng.uniform(-25, 25) * (y - 0.5)  # a soft vertical gradient, like a horizon
    hue = ("red", "green", "blue")[int(np.argmax(base))]
    return np.clip(field, 0, 255).astype(np.uint8), f"{hue}-tinted waves"


def photo_background(height: int, width: int, rng: np.random.Generator, seam: int = 32) -> tuple[np.ndarray, str]:
    """A band of a bundled texture photograph, tinted, contrast-reduced and made seamless.

    The band is resized to ``[height, width + seam]``; its last ``seam`` columns are cross-faded
    into the first ones, so that column ``width - 1`` continues smoothly into column 0.

    Returns
    -------
    background : ndarray, ``uint8 [height, width, 3]``
    description : str
        E.g. ``"a brick wall in warm light"``.
    """
    name = list(BACKGROUND_PHOTOS)[int(rng.integers(len(BACKGROUND_PHOTOS)))]
    tint_name = list(BACKGROUND_TINTS)[int(rng.integers(len(BACKGROUND_TINTS)))]
    photo = load_photo(name)
    band_h = max(height, photo.shape[1] * height // (width + seam))
    y = int(rng.integers(0, photo.shape[0] - band_h + 1))
    band = cv2.resize(photo[y : y + band_h], (width + seam, height), interpolation=cv2.INTER_AREA).astype(np.float32)
    alpha = (np.arange(seam) / seam)[None, :, None]
    out = band[:, :width].copy()
    out[:, :seam] = alpha * band[:, :seam] + (1 - alpha) * band[:, width:]
    out = 0.6 * out + 0.4 * out.mean()
    out = out * np.asarray(BACKGROUND_TINTS[tint_name], dtype=np.float32)
    return np.clip(out, 0, 255).astype(np.uint8), f"{BACKGROUND_PHOTOS[name]} in {tint_name} light"
