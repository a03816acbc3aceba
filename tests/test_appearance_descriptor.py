"""The light scorer's texture block counts gradients inside the mask eroded by one pixel (a 3x3 square), so
the silhouette's edge against the background does not count as the object's texture.

The crops here are grey: a square object of horizontal bands (two rows dark, two rows light) on black.
Inside the object every gradient is vertical (orientation 90 degrees, bin ``bins / 2``); the object's
outline adds horizontal and diagonal gradients on its outermost ring of pixels only, which the erosion
leaves out. With the weights ``(0, 0, 1)`` the descriptor is the texture block alone.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from cmbench.scoring.appearance import AppearanceEmbedder

SIZE, TOP, SIDE = 24, 5, 14  # crop side, the object's first row and column, its side
BINS = 8


def banded_object(dark: int = 70, light: int = 190) -> tuple[np.ndarray, np.ndarray]:
    """A grey crop with a square object of horizontal bands (period 4 rows) on black, and its mask.

    Returns
    -------
    crop : ndarray, ``uint8 [SIZE, SIZE, 3]``
    mask : ndarray, ``bool [SIZE, SIZE]``
        The object's square, away from the crop's border.
    """
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    mask[TOP:TOP + SIDE, TOP:TOP + SIDE] = True
    rows = np.where((np.arange(SIZE) // 2) % 2 == 0, dark, light)
    grey = np.where(mask, rows[:, None], 0).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=2), mask


def eroded(mask: np.ndarray) -> np.ndarray:
    """``mask`` eroded by the 3x3 square: a pixel stays iff its eight neighbours are in the mask too (the
    mask does not touch the crop's border)."""
    out = mask.copy()
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            out &= np.roll(np.roll(mask, dy, 0), dx, 1)
    return out


def texture(crop: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The texture block of the descriptor (the other blocks weighted 0), ``[BINS]``."""
    descriptor = AppearanceEmbedder(orientation_bins=BINS, weights=(0.0, 0.0, 1.0)).describe(crop, mask)
    assert not descriptor[:-BINS].any()
    return descriptor[-BINS:]


def test_the_outline_of_a_banded_object_does_not_count_as_its_texture():
    """Only the bands' vertical gradients count: the block is the unit vector on the 90-degree bin."""
    crop, mask = banded_object()
    assert eroded(mask).sum() == (SIDE - 2) ** 2
    expected = np.zeros(BINS)
    expected[BINS // 2] = 1.0
    np.testing.assert_allclose(texture(crop, mask), expected, atol=1e-5)


def test_the_texture_is_the_same_whatever_lies_outside_the_object():
    """The same banded object on black, on white and on a checkerboard: the outline changes, the object
    does not, and neither does its texture block."""
    crop, mask = banded_object()
    on_black = texture(crop, mask)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    for background in (np.full((SIZE, SIZE), 255), np.where((yy // 3 + xx // 3) % 2 == 0, 20, 235)):
        other = np.where(mask[..., None], crop, background[..., None]).astype(np.uint8)
        np.testing.assert_allclose(texture(other, mask), on_black, atol=1e-5)


def test_the_outline_has_horizontal_gradients_the_interior_lacks():
    """Guard of the tests above: on the left and right columns of the object's outermost ring the
    lightness changes across columns at least half as strongly as the bands change across rows, while
    inside the eroded mask it never does, so counting the ring would move weight out of the 90-degree bin."""
    crop, mask = banded_object()
    lightness = cv2.cvtColor(crop.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)[..., 0]
    gx = np.abs(cv2.Sobel(lightness, cv2.CV_32F, 1, 0, ksize=3))
    gy = np.abs(cv2.Sobel(lightness, cv2.CV_32F, 0, 1, ksize=3))
    interior = eroded(mask)
    sides = gx[TOP:TOP + SIDE, [TOP, TOP + SIDE - 1]]
    assert gx[interior].max() == 0 and gy[interior].min() > 0
    assert sides.min() > 0.5 * gy[interior].max()


@pytest.mark.parametrize("thickness", [1, 2])
def test_a_mask_without_interior_keeps_every_mask_pixel(thickness):
    """A mask too thin to erode (one or two pixels) is described whole rather than not at all: the block
    is not empty."""
    crop, _ = banded_object()
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    mask[TOP:TOP + SIDE, 10:10 + thickness] = True
    assert not eroded(mask).any()
    block = texture(crop, mask)
    assert np.linalg.norm(block) == pytest.approx(1.0)


def test_a_grid_cell_the_mask_leaves_empty_takes_the_objects_mean_colour():
    """The layout block is each grid cell's mean Lab colour minus the object's mean; a cell holding no
    mask pixel takes the object's mean (0 after centring), not black: an object filling the left half
    of its crop is described the same wherever the rest of its box is cut. Here the object is the left
    third of the crop (the 3x3 grid's left column), dark in its top third."""
    crop = np.full((SIZE, SIZE, 3), 150, np.uint8)
    crop[: SIZE // 3] = 60  # two colours inside the object, so its own centred cells are not all 0
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    mask[:, : SIZE // 3] = True
    embedder = AppearanceEmbedder(grid=3)
    lab = cv2.cvtColor(crop, cv2.COLOR_RGB2LAB).astype(np.float64)
    cells = embedder._layout(lab, mask).reshape(3, 3, 3)
    assert np.all(cells[:, 1:] == 0.0)  # empty: the object's mean, centred
    assert np.abs(cells[:, 0]).max() > 1.0  # the object's own cells differ from its mean


def test_a_value_at_the_top_of_the_range_falls_wholly_in_the_last_bin():
    """Soft binning clips at the last bin's centre: a value at ``hi`` (white's lightness, the chroma
    plane's corner) puts its whole weight in the last bin (of each axis), and nothing past it."""
    from cmbench.scoring.appearance import _soft_histogram

    hist = _soft_histogram(np.array([[100.0]]), 0.0, 100.0, 4)
    assert hist.tolist() == [0.0, 0.0, 0.0, 1.0]
    joint = _soft_histogram(np.array([[1.0, 1.0], [0.0, 1.0]]), 0.0, 1.0, 3).reshape(3, 3)
    assert joint[2, 2] == 1.0 and joint[0, 2] == 1.0 and joint.sum() == 2.0


@pytest.mark.parametrize("smooth_sigma", [0.0, 1.0])
def test_one_flat_colour_has_no_layout_and_matches_itself_at_any_size(smooth_sigma):
    """A flat crop's cell means equal its mean: its layout is zero, not float noise normalised into a unit
    vector that differs with the crop's size and would pull the cosine of two identical colours below 1."""
    embedder = AppearanceEmbedder(smooth_sigma=smooth_sigma)
    grid = embedder.chroma_bins**2 + embedder.lightness_bins
    layout = slice(grid, grid + 3 * embedder.grid**2)
    descriptors = []
    for h, w in [(12, 12), (32, 32), (64, 48), (150, 200)]:
        crop = np.empty((h, w, 3), dtype=np.uint8)
        crop[:] = (90, 140, 60)
        mask = np.zeros((h, w), dtype=bool)
        mask[h // 6 : h - h // 6, w // 5 :] = True
        d = embedder.describe(crop, mask)
        assert not d[layout].any() and not d[-embedder.orientation_bins :].any()
        descriptors.append(d)
    for d in descriptors[1:]:
        assert float(d @ descriptors[0]) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_smoothing_is_a_gaussian_blur_of_the_crop_before_it_is_described(sigma):
    crop, mask = banded_object()
    blurred = cv2.GaussianBlur(crop.astype(np.float32) / 255.0, (0, 0), sigma, borderType=cv2.BORDER_REFLECT)
    as_bytes = np.clip(np.rint(blurred * 255.0), 0, 255).astype(np.uint8)
    smoothed = AppearanceEmbedder(smooth_sigma=sigma).describe(crop, mask)
    assert np.abs(smoothed - AppearanceEmbedder().describe(crop, mask)).max() > 1e-3  # smoothing changes it
    assert np.abs(smoothed - AppearanceEmbedder().describe(as_bytes, mask)).max() < 0.02  # into the blurred crop's
