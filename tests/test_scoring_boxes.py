"""Box and mask geometry of the scorer, by hand on small frames.

Every scorer backend goes through these helpers: the reference boxes a manifest gives (normalised) become
pixel boxes, detections are clipped to the frame and kept only when large enough, segmenters work on the
pixels a box touches, and embedders see the crop around a mask. The expected values below are worked out
from the box convention of :mod:`cmbench.scoring.boxes`: pixel ``(row i, column j)`` spans
``[j, j + 1) x [i, i + 1)``.
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from cmbench.scoring.boxes import (
    box_mask,
    box_pixel_slices,
    boxes_valid,
    clip_boxes,
    denormalize_box,
    mask_bbox,
    masked_crop,
    normalize_box,
)

H, W = 6, 8  # a frame wider than high, so a swapped height and width shows


def test_denormalize_box_scales_x_by_width_and_y_by_height():
    """A normalised box becomes pixels as float64, x by the width and y by the height, also from ints."""
    box = denormalize_box((0, 0, 1, 1), H, W)
    assert box.dtype == np.float64 and box.shape == (4,)
    np.testing.assert_array_equal(box, [0.0, 0.0, 8.0, 6.0])
    np.testing.assert_array_equal(denormalize_box((0.125, 0.25, 0.75, 0.75), H, W), [1.0, 1.5, 6.0, 4.5])


@pytest.mark.parametrize("box", [np.array([2, 3, 4, 6]), np.array([2.0, 3.0, 4.0, 6.0])])
def test_normalize_box_gives_plain_floats_for_the_records(box):
    """A pixel box (integer or float) becomes ``[x0 / W, y0 / H, x1 / W, y1 / H]`` as plain Python floats,
    which is what the JSON records store."""
    normalised = normalize_box(box, H, W)
    assert isinstance(normalised, list) and [type(v) for v in normalised] == [float] * 4
    assert normalised == [0.25, 0.5, 0.5, 1.0]


def test_clip_boxes_orders_corners_then_clips_each_axis_to_its_own_side():
    """Corners are sorted per axis, then x is clipped to [0, W] and y to [0, H]; fractional coordinates
    inside the frame are kept as they are, and the result is float64 ``[N, 4]`` even for integer input."""
    boxes = np.array([[10, -3, 2, 7], [0.5, 5.75, 7.5, 0.25], [-1, 2, 3, 4]])
    clipped = clip_boxes(boxes, height=H, width=W)
    assert clipped.dtype == np.float64
    np.testing.assert_array_equal(clipped, [[2, 0, 8, 6], [0.5, 0.25, 7.5, 5.75], [0, 2, 3, 4]])
    single = clip_boxes(np.array([7, 9, 1, 2]), height=H, width=W)  # one box given as [4]
    assert single.dtype == np.float64
    np.testing.assert_array_equal(single, [[1, 2, 7, 6]])


@pytest.mark.parametrize(
    ("box", "min_size", "valid"),
    [
        ([0, 0, 1, 1], None, True),  # exactly the default minimum of one pixel
        ([4, 4, 4.5, 9], None, False),  # half a pixel wide, far from the origin
        ([4, 4, 9, 4.5], None, False),  # half a pixel high
        ([1, 1, 4, 4], 3.0, True),  # exactly the minimum
        ([1, 2, 5, 4], 3.0, False),  # 4 wide, 2 high
        ([2, 1, 4, 5], 3.0, False),  # 2 wide, 4 high
        ([5, 5, 7.9, 9], 3.0, False),  # 2.9 wide
        ([-np.inf, 0, 5, 5], None, False),  # infinitely wide, but not a box
        ([0, 0, 5, np.inf], None, False),
        ([0, 0, 5, np.nan], None, False),  # no detection
    ],
)
def test_boxes_valid_needs_finite_corners_and_min_size_each_way(box, min_size, valid):
    """A box is valid when its four corners are finite and it is at least ``min_size`` pixels (default 1)
    wide and at least as high, the bounds included."""
    kwargs = {} if min_size is None else {"min_size": min_size}
    assert boxes_valid(np.array(box, dtype=float), **kwargs).tolist() == [valid]


def test_boxes_valid_judges_each_box_on_its_own():
    """In a batch, one box's infinite corner or small size does not make the other boxes invalid."""
    boxes = np.array([[0, 0, np.inf, 3], [1, 1, 3, 3], [0, 0, 0.5, 2], [2, 0, 4, 2]])
    assert boxes_valid(boxes).tolist() == [False, True, False, True]


@pytest.mark.parametrize(
    ("box", "rows", "cols"),
    [
        ((2.5, 1.25, 5.0, 3.75), (1, 4), (2, 5)),  # partly covered pixels are touched; an integer end is not
        ((0.5, 0.5, 1.5, 1.5), (0, 2), (0, 2)),  # starts inside the first pixel
        ((0, 0, 8, 6), (0, 6), (0, 8)),  # the whole frame
        ((-2.5, -1.0, 9.5, 7.2), (0, 6), (0, 8)),  # past every edge: clipped to the frame
        ((7.5, 5.5, 8.0, 6.0), (5, 6), (7, 8)),  # the last pixel
        ((9.5, 7.5, 10.0, 9.0), (6, 6), (8, 8)),  # beyond the bottom-right corner: empty, at the edge
        ((5.5, 4.5, 3.0, 2.0), (4, 4), (5, 5)),  # ends before it starts: empty, never backwards
        ((-4.0, -3.0, -1.0, -2.0), (0, 0), (0, 0)),  # beyond the top-left corner
        ((-np.inf, -np.inf, np.inf, np.inf), (0, 6), (0, 8)),  # unbounded: the whole frame
    ],
)
def test_box_pixel_slices_stay_inside_the_frame(box, rows, cols):
    """The rows and columns a box touches, as ``slice(start, stop)`` with ``0 <= start <= stop <= H`` (or
    ``W``): the GrabCut segmenter builds its rectangle from ``start`` and ``stop - start``, so a slice never
    runs past the frame or backwards."""
    row_slice, col_slice = box_pixel_slices(np.array(box), H, W)
    assert (row_slice.start, row_slice.stop) == rows and (col_slice.start, col_slice.stop) == cols
    assert all(type(v) is int for v in (row_slice.start, row_slice.stop, col_slice.start, col_slice.stop))


@pytest.mark.parametrize(
    ("box", "rows", "cols"),
    [
        ([4.5, 3.0, np.inf, np.inf], [3, 4, 5], [4, 5, 6, 7]),  # open to the right and downwards
        ([-np.inf, -np.inf, 2.0, 1.5], [0, 1], [0, 1]),  # open to the left and upwards
    ],
)
def test_box_mask_of_an_unbounded_box_reaches_the_frame_edges(box, rows, cols):
    """A box with infinite corners marks every pixel from its finite corners to the frame's edges."""
    mask = box_mask(np.array(box), H, W)
    expected = np.zeros((H, W), dtype=bool)
    for row in rows:
        expected[row, cols] = True
    np.testing.assert_array_equal(mask, expected)


def test_box_mask_marks_the_touched_pixels():
    """The mask of a box is ``bool [H, W]``, True on every pixel the box touches, partly covered ones
    included (rows 1-3, columns 2-4 here), False elsewhere."""
    mask = box_mask(np.array([2.5, 1.25, 5.0, 3.75]), H, W)
    assert mask.dtype == bool and mask.shape == (H, W)
    expected = np.zeros((H, W), dtype=bool)
    expected[1, 2:5] = expected[2, 2:5] = expected[3, 2:5] = True
    np.testing.assert_array_equal(mask, expected)


@pytest.mark.parametrize(
    ("pixels", "bbox"),
    [
        ([(2, 1), (4, 6), (3, 3)], (1, 2, 7, 5)),  # (row, column) pixels -> (x0, y0, x1, y1), exclusive ends
        ([(0, 0)], (0, 0, 1, 1)),
        ([(5, 2), (5, 3)], (2, 5, 4, 6)),  # a single row, the last one
        ([(1, 7), (3, 7)], (7, 1, 8, 4)),  # a single column, the last one
        ([], None),
    ],
)
def test_mask_bbox_is_the_tight_box_with_exclusive_ends(pixels, bbox):
    """The tight box of a mask ends one past its last row and column, as plain ints; an empty mask has
    none."""
    mask = np.zeros((H, W), dtype=bool)
    for row, col in pixels:
        mask[row, col] = True
    found = mask_bbox(mask)
    assert found == bbox
    assert found is None or all(type(v) is int for v in found)


def test_masked_crop_cuts_frame_and_mask_to_the_masks_box():
    """The crop is the frame's pixels inside the mask's tight box (background kept), beside the mask cut
    the same way."""
    frame = np.arange(H * W * 3, dtype=np.uint8).reshape(H, W, 3)
    mask = np.zeros((H, W), dtype=bool)
    mask[1, 2] = mask[3, 5] = True  # tight box: rows 1-3, columns 2-5
    crop, crop_mask = masked_crop(frame, mask)
    assert crop.shape == (3, 4, 3) and crop_mask.shape == (3, 4)
    np.testing.assert_array_equal(crop[0, 0], frame[1, 2])
    np.testing.assert_array_equal(crop[2, 3], frame[3, 5])
    np.testing.assert_array_equal(crop[1, 1], frame[2, 3])  # a background pixel, untouched
    expected = np.zeros((3, 4), dtype=bool)
    expected[0, 0] = expected[2, 3] = True
    np.testing.assert_array_equal(crop_mask, expected)


def test_masked_crop_refuses_an_empty_mask():
    """There is nothing to embed without a masked pixel: an empty mask is refused, saying so."""
    with pytest.raises(ValueError, match=r"^masked_crop needs a non-empty mask$"):
        masked_crop(np.zeros((H, W, 3), dtype=np.uint8), np.zeros((H, W), dtype=bool))


def _decimals(values):
    return [Decimal(str(v)) for v in values]


# x1 has more digits than a float64 keeps: as a float (json's default) it is 5.0, an integer pixel edge
_LONG_DECIMAL_BOX = [Decimal("2.5"), Decimal("1.25"), Decimal("5.00000000000000000001"), Decimal("3.75")]


@pytest.mark.parametrize(
    ("helper", "expected"),
    [
        (lambda: denormalize_box(_decimals([0.25, 0.5, 0.5, 1]), H, W), [2.0, 3.0, 4.0, 6.0]),
        (lambda: normalize_box(_decimals([2, 3, 4, 6]), H, W), [0.25, 0.5, 0.5, 1.0]),
        (lambda: clip_boxes([_decimals([9, 4, -1, 2])], H, W), [[0.0, 2.0, 8.0, 4.0]]),
        (lambda: boxes_valid([_decimals([0, 0, 1, 1]), _decimals([0, 0, 0.5, 1])]), [True, False]),
        (lambda: [(s.start, s.stop) for s in box_pixel_slices(_LONG_DECIMAL_BOX, H, W)], [(1, 4), (2, 5)]),
    ],
    ids=["denormalize_box", "normalize_box", "clip_boxes", "boxes_valid", "box_pixel_slices"],
)
def test_boxes_of_any_real_numbers_are_read_as_float64(helper, expected):
    """Box coordinates may arrive as any real numbers, e.g. ``Decimal`` from ``json.loads(...,
    parse_float=Decimal)``: every helper reads them as float64 and gives the same numbers as for the same
    text parsed as floats (a coordinate with more digits than a float64 keeps included)."""
    assert float(_LONG_DECIMAL_BOX[2]) == 5.0
    result = helper()
    if isinstance(result, np.ndarray):
        assert result.dtype in (np.float64, np.bool_)
        result = result.tolist()
    assert result == expected
