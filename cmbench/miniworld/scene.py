"""A MiniWorld scene: a wrap-around panorama holding one salient object per place.

The panorama is ``FRAME`` (32) px high and ``width`` px wide (a multiple of ``PLACE_WIDTH`` = 32).
It is cut into ``width // 32`` places; place ``p`` covers columns ``[32 p, 32 p + 32)`` and holds one
object of 10-14 px near its centre, so a camera resting at offset ``32 p`` (+- 4 px) shows that
object whole and nothing of its neighbours. Objects come in same-category pairs (twins) with clearly
different appearances: recalling "a star" is not enough, the same star must come back.

The ``real`` source draws object fills and the background from photographs bundled with
scikit-image, blurs the panorama slightly, and adds per-frame sensor noise and a slow exposure drift
at render time (see :mod:`cmbench.miniworld.render`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from cmbench.miniworld.dynamics import Dynamics, sample_dynamics
from cmbench.miniworld.appearance import photo_appearance, photo_background, synthetic_appearance, synthetic_background
from cmbench.miniworld.shapes import CATEGORIES, shape_mask

FRAME = 32  # frame height and width = panorama height, pixels
PLACE_WIDTH = 32  # width of one place of the panorama, pixels
CAMERA_STEP = 4  # camera offsets move in whole steps of this many pixels (one DiT token)
OBJECT_SIZES = (10, 14)  # inclusive range of object sizes, pixels
SOURCES = ("synthetic", "real")


@dataclass(frozen=True, eq=False)
class SceneObject:
    """One object placed in the panorama.

    Attributes
    ----------
    object_id : int
        Index in ``Scene.objects`` and value in ``Scene.labels``.
    category : str
        Detector label (a key of :data:`cmbench.miniworld.shapes.CATEGORIES`).
    place : int
        The place holding the object.
    x, y : int
        Top-left corner of its bounding square in panorama pixels.
    size : int
        Side of the bounding square.
    appearance : str
        Appearance words, e.g. ``"red and white checkered"``.
    appearance_key : tuple
        Identity of the appearance (twins never share one).
    """

    object_id: int
    category: str
    place: int
    x: int
    y: int
    size: int
    appearance: str
    appearance_key: tuple

    @property
    def aliases(self) -> tuple[str, ...]:
        return CATEGORIES[self.category].aliases

    @property
    def description(self) -> str:
        """E.g. ``"red and white checkered star"``."""
        return f"{self.appearance} {self.category}"

    @property
    def mask(self) -> np.ndarray:
        """Silhouette, ``bool [size, size]``."""
        return shape_mask(self.category, self.size)

    @property
    def area(self) -> int:
        return int(self.mask.sum())


@dataclass(frozen=True, eq=False)
class Scene:
    """A rendered panorama and what is in it.

    Attributes
    ----------
    source : {"synthetic", "real"}
    panorama : ndarray, ``uint8 [FRAME, W, 3]``
        Colours before per-frame sensor effects (blur already applied for ``real``).
    labels : ndarray, ``int16 [FRAME, W]``
        Object id per pixel, -1 for background.
    objects : tuple of SceneObject
        One per place, in place order: ``objects[i].object_id == objects[i].place == i``.
    background : str
        Words for the backdrop, e.g. ``"blue-tinted waves"`` or ``"a brick wall in warm light"``.
    noise_std : float
        Standard deviation of per-frame Gaussian sensor noise, in 0-255 levels (0 for synthetic).
    exposure_amplitude, exposure_period, exposure_phase : float
        Frame ``f`` is scaled by ``1 + amplitude * sin(2 pi f / period + phase)`` (amplitude 0 for
        synthetic).
    noise_seed : int
        Seeds the per-frame noise (frame ``f`` uses ``default_rng([noise_seed, f])``).
    dynamics : Dynamics or None
        Movers and lighting that change with time (:mod:`cmbench.miniworld.dynamics`); None for a
        static world.
    """

    source: str
    panorama: np.ndarray
    labels: np.ndarray
    objects: tuple[SceneObject, ...]
    background: str
    noise_std: float
    exposure_amplitude: float
    exposure_period: float
    exposure_phase: float
    noise_seed: int
    dynamics: Dynamics | None = None

    @property
    def width(self) -> int:
        return int(self.panorama.shape[1])

    @property
    def n_places(self) -> int:
        return self.width // PLACE_WIDTH

    def object_at(self, place: int) -> SceneObject:
        """The object of a place (any integer, taken modulo the number of places)."""
        return self.objects[place % self.n_places]

    def twins(self, object_id: int) -> list[int]:
        """Ids of the other objects of the same category (the distractors of ``object_id``)."""
        category = self.objects[object_id].category
        return [o.object_id for o in self.objects if o.category == category and o.object_id != object_id]

    def place_offset(self, place: int) -> int:
        """Camera offset that centres a place in the frame."""
        return (place % self.n_places) * PLACE_WIDTH


def check_width(width: int) -> None:
    """Raise ValueError unless ``width`` is a usable panorama width."""
    max_width = 2 * len(CATEGORIES) * PLACE_WIDTH
    if width % PLACE_WIDTH or not 4 * PLACE_WIDTH <= width <= max_width:
        raise ValueError(
            f"panorama width must be a multiple of {PLACE_WIDTH} in [{4 * PLACE_WIDTH}, {max_width}], got {width}"
        )


def sample_scene(rng: np.random.Generator, source: str = "synthetic", width: int = 256, dynamic: bool = False) -> Scene:
    """Draw a scene: background, one object per place, same-category twins (and, if ``dynamic``,
    movers and lighting that change with time).

    The dynamics are drawn after everything else, so a dynamic scene has exactly the panorama and
    objects of the static scene of the same generator state.

    Parameters
    ----------
    rng : numpy.random.Generator
        The only source of randomness; the same state gives the same scene.
    source : {"synthetic", "real"}
    width : int
        Panorama width in pixels (multiple of 32, at least 128).
    dynamic : bool
        Add :class:`~cmbench.miniworld.dynamics.Dynamics` (moving entities on a schedule, lighting).

    Returns
    -------
    Scene
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    check_width(width)
    n_places = width // PLACE_WIDTH
    labels_pool = list(CATEGORIES)
    chosen = [labels_pool[i] for i in rng.choice(len(labels_pool), size=(n_places + 1) // 2, replace=False)]
    categories = (chosen * 2)[:n_places]
    categories = [categories[i] for i in rng.permutation(n_places)]

    if source == "synthetic":
        background, background_words = synthetic_background(FRAME, width, rng)
        make_appearance = synthetic_appearance
    else:
        background, background_words = photo_background(FRAME, width, rng)
        make_appearance = photo_appearance
    panorama = background.astype(np.float32)
    labels = np.full((FRAME, width), -1, dtype=np.int16)

    objects: list[SceneObject] = []
    for place, category in enumerate(categories):
        size = int(rng.integers(OBJECT_SIZES[0], OBJECT_SIZES[1] + 1))
        margin = (PLACE_WIDTH - size) // 2
        x = place * PLACE_WIDTH + margin + int(rng.integers(-3, 4))
        y = int(np.clip(margin + int(rng.integers(-5, 6)), 1, FRAME - 1 - size))
        avoid = tuple(o.appearance_key for o in objects if o.category == category)
        look = make_appearance(size, rng, avoid)
        mask = shape_mask(category, size)
        fill = look.fill.astype(np.float32)
        if source == "real":  # a dark rim separates a photo-filled object from a photo background
            rim = mask & ~ndimage.binary_erosion(mask)
            fill[rim] *= 0.4
        panorama[y : y + size, x : x + size][mask] = fill[mask]
        labels[y : y + size, x : x + size][mask] = len(objects)
        objects.append(SceneObject(len(objects), category, place, x, y, size, look.description, look.key))

    if source == "real":
        blur = float(rng.uniform(0.5, 0.8))
        panorama = ndimage.gaussian_filter(panorama, sigma=(blur, blur, 0), mode=("nearest", "wrap", "nearest"))
        noise_std = float(rng.uniform(2.0, 4.0))
        exposure = (float(rng.uniform(0.04, 0.08)), float(rng.uniform(96, 256)), float(rng.uniform(0, 2 * np.pi)))
    else:
        noise_std, exposure = 0.0, (0.0, 1.0, 0.0)
    panorama = np.clip(np.rint(panorama), 0, 255).astype(np.uint8)
    panorama.setflags(write=False)
    labels.setflags(write=False)
    noise_seed = int(rng.integers(2**62))
    dynamics = sample_dynamics(rng, FRAME, width) if dynamic else None
    return Scene(source, panorama, labels, tuple(objects), background_words, noise_std, *exposure, noise_seed, dynamics)


def scene_from_seed(seed: int, source: str = "synthetic", width: int = 256, dynamic: bool = False) -> Scene:
    """``sample_scene(numpy.random.default_rng(seed), source, width, dynamic)``: the scene a suite row names."""
    return sample_scene(np.random.default_rng(seed), source, width, dynamic)
