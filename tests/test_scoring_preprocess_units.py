"""The device preprocessing of the scorer, one step at a time, on tiny hand-built images.

``tests/test_scoring_preprocess.py`` pins the agreement with transformers' processors within a grey level or
two; these tests pin each step exactly: the input checks and their messages, the resize filters and rounding
(values worked out by hand from the antialiased triangle / cubic kernels), the centre crop and its padding,
the square padding, the normalisation arithmetic, the OWLv2 pad / zoom / clip, the settings read from a
processor and their defaults, and which path a batch or a sequence of frames takes. The ``meta`` device
stands in for a GPU where a test needs a tensor off the CPU (only for cheap steps: the first arithmetic on
``meta`` tensors costs seconds).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cmbench.scoring import preprocess
from cmbench.scoring.imagenet import IMAGENET_MEAN, IMAGENET_STD
from cmbench.scoring.preprocess import (
    ImageSpec,
    Owlv2Spec,
    _mirror,
    blank_outside,
    center_crop,
    frames_input,
    masked_crops_input,
    normalize,
    pad_square,
    resize_two_pass,
    resize_uint8,
    upload,
)

META = torch.device("meta")
CPU = torch.device("cpu")
UNIT = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))  # mean, std that leave x / 255


def _u8(rows) -> torch.Tensor:
    """A ``uint8 [1, 1, H, W]`` image from nested lists of grey levels."""
    return torch.tensor(rows, dtype=torch.uint8)[None, None]


def _spec(**over) -> ImageSpec:
    """An ImageSpec resizing to 2 x 2 (bilinear, no crop, mean 0, std 1) with ``over`` replacing fields."""
    fields = dict(size=(2, 2), shortest_edge=None, resample="bilinear", crop=None, mean=UNIT[0], std=UNIT[1])
    fields.update(over)
    return ImageSpec(**fields)


def _processor(**over) -> SimpleNamespace:
    """A transformers-like image processor (OWL-ViT style: 4 x 6 resize, bicubic, CLIP-like statistics);
    ``over`` adds or replaces attributes, an attribute set to ``...`` is left out."""
    fields = dict(do_resize=True, do_rescale=True, do_normalize=True, rescale_factor=1 / 255, resample=3,
                  size={"height": 4, "width": 6}, image_mean=[0.5, 0.25, 0.125], image_std=[2, 4, 8])
    fields.update(over)
    return SimpleNamespace(**{k: v for k, v in fields.items() if v is not ...})


# ---------------------------------------------------------------- upload


def test_upload_puts_frames_channels_first_on_the_device():
    """``[B, H, W, 3]`` -> ``[B, 3, H, W]`` with every value in place (B, H, W, C all different sizes)."""
    frames = np.arange(2 * 5 * 4 * 3, dtype=np.uint8).reshape(2, 5, 4, 3)
    out = upload(frames, CPU)
    assert out.shape == (2, 3, 5, 4) and out.dtype == torch.uint8
    assert torch.equal(out, torch.from_numpy(frames).permute(0, 3, 1, 2))
    assert out[1, 2, 4, 3] == frames[1, 4, 3, 2]
    strided = frames[:, ::2, ::-1]  # a non-contiguous view uploads as well
    assert torch.equal(upload(strided, CPU), torch.from_numpy(strided.copy()).permute(0, 3, 1, 2))
    assert upload(frames, META).device == META


@pytest.mark.parametrize("frames", [
    np.zeros((1, 5, 4, 3), np.float32),  # wrong dtype, right shape
    np.zeros((5, 4, 3), np.uint8),  # one frame without the batch axis
    np.zeros((1, 1, 5, 4, 3), np.uint8),
    np.zeros((1, 5, 4, 4), np.uint8),  # RGBA
    np.zeros((1, 5, 3, 4), np.uint8),  # channels not last
    np.zeros((1, 3, 4, 5), np.uint8),
])
def test_upload_rejects_anything_but_uint8_bhw3(frames):
    shown = f"got {frames.dtype} {frames.shape}"
    with pytest.raises(ValueError, match=re.escape(f"frames must be uint8 [B, H, W, 3], {shown}")):
        upload(frames, CPU)


# ---------------------------------------------------------------- resize

# A 1 x 4 row shrunk to 1 x 2, bilinear with antialiasing: the triangle filter is stretched by the scale
# (2), so output 0 (centre 1.0) weighs input centres 0.5, 1.5, 2.5 by 1 - d / 2 = 0.75, 0.75, 0.25 (sum 1.75):
# (0.75 * 0 + 0.75 * 70 + 0.25 * 140) / 1.75 = 87.5 / 1.75 = 50; output 1 by symmetry:
# (0.25 * 70 + 0.75 * 140 + 0.75 * 210) / 1.75 = 280 / 1.75 = 160. Without antialiasing it would sample
# 0.5 and 2.5 (35, 175); with align_corners 0 and 3 (87.5, 186.7).
RAMP = [[0, 70, 140, 210], [210, 140, 70, 0]]
RAMP_HALF = [[50, 160], [160, 50]]


@pytest.mark.parametrize("resize", [resize_uint8, resize_two_pass])
def test_resize_shrinks_with_the_antialiased_triangle_filter(resize):
    """Two different rows, width only: each row is resized on its own (the height pass is skipped)."""
    out = resize(_u8(RAMP), (2, 2), "bilinear")
    assert out.dtype == torch.uint8 and out[0, 0].tolist() == RAMP_HALF


def test_resize_two_pass_resizes_the_width_then_the_height():
    """A 2 x 4 image to 1 x 2: widths first (the rows above), then the two rows' mean: (50 + 160) / 2 = 105;
    and a 1 x 4 image to 3 x 2 (the height upsampled from one row: a constant column)."""
    assert resize_two_pass(_u8(RAMP), (1, 2), "bilinear")[0, 0].tolist() == [[105, 105]]
    assert resize_two_pass(_u8(RAMP[:1]), (3, 2), "bilinear")[0, 0].tolist() == [[50, 160]] * 3


# A step edge doubled with the bicubic kernel (a = -0.5: w(d) = 1.5|d|^3 - 2.5|d|^2 + 1 for |d| <= 1,
# -0.5|d|^3 + 2.5|d|^2 - 4|d| + 2 for 1 < |d| < 2). Output j samples input (j + 0.5) / 2 - 0.5:
# j = 4 -> 1.75: only input 3 (255) at d = 1.25 counts, w = -0.0703125 -> -17.9, clipped to 0;
# j = 5 -> 2.25: inputs 3, 4 (255) at d = 0.75, 1.75: 0.2265625 - 0.0234375 = 0.203125 -> 51.8 -> 52;
# j = 6, 7 mirror j = 5, 4: 255 - 51.8 = 203.2 -> 203 and 255 + 17.9 = 272.9, clipped to 255.
STEP = [[0, 0, 0, 255, 255, 255]]
STEP_DOUBLED = [[0, 0, 0, 0, 0, 52, 203, 255, 255, 255, 255, 255]]


@pytest.mark.parametrize("resize", [resize_uint8, resize_two_pass])
def test_bicubic_overshoot_is_clipped_to_0_and_255(resize):
    assert resize(_u8(STEP), (1, 12), "bicubic")[0, 0].tolist() == STEP_DOUBLED


def test_resize_on_cpu_rounds_halves_up_like_pil():
    """1 x 6 -> 1 x 2, bilinear: the filter (scale 3) weighs centres at distance 0, 1, 2 by 1, 2/3, 1/3 (sum
    8/3): output 1 = (183 * 1 + 108 * 2 + 39 * 3 + 216 * 2) / 8 = 948 / 8 = 118.5. PIL (and torch's uint8
    kernel, the CPU path) round it up to 119; output 0 = 1013 / 8 = 126.625 -> 127."""
    assert resize_uint8(_u8([[130, 93, 183, 108, 39, 216]]), (1, 2), "bilinear")[0, 0].tolist() == [[127, 119]]


def test_resize_to_the_same_size_returns_the_images_themselves():
    images = _u8(RAMP)
    assert resize_uint8(images, (2, 4), "bicubic") is images


def test_resize_off_the_cpu_runs_the_float_two_pass_resize(monkeypatch):
    """Images on another device (``meta`` here, standing in for CUDA) go to :func:`resize_two_pass` (itself
    pinned above on CPU tensors) with the size and the filter asked for."""
    calls = []
    monkeypatch.setattr(preprocess, "resize_two_pass", lambda *args: calls.append(args) or "two-pass")
    images = torch.zeros(2, 3, 8, 6, dtype=torch.uint8, device=META)
    assert resize_uint8(images, (4, 5), "bicubic") == "two-pass"
    assert len(calls) == 1 and calls[0][0] is images and calls[0][1:] == ((4, 5), "bicubic")
    assert resize_uint8(_u8(RAMP), (2, 2), "bilinear")[0, 0].tolist() == RAMP_HALF and len(calls) == 1  # CPU


# ---------------------------------------------------------------- normalise


def test_normalize_per_channel_by_hand():
    """(x / 255 - mean) / std per channel, x = 0, 51, 255 in every channel:
    channel 0 (mean 0.5, std 0.5): -1, (0.2 - 0.5) / 0.5 = -0.6, 1;
    channel 1 (mean 0.2, std 0.25): -0.8, 0, 3.2; channel 2 (mean 0, std 2): 0, 0.1, 0.5."""
    images = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 1, 1, 3).expand(1, 3, 2, 3)
    out = normalize(images, (0.5, 0.2, 0.0), (0.5, 0.25, 2.0))
    assert out.dtype == torch.float32 and out.shape == (1, 3, 2, 3)
    want = torch.tensor([[-1.0, -0.6, 1.0], [-0.8, 0.0, 3.2], [0.0, 0.1, 0.5]]).view(1, 3, 1, 3).expand(1, 3, 2, 3)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)


def test_normalize_gives_a_contiguous_tensor_from_a_channels_last_view():
    frames = np.arange(2 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 4, 5, 3)
    images = upload(frames, CPU)
    assert not images.is_contiguous()
    out = normalize(images, *UNIT)
    assert out.is_contiguous()
    torch.testing.assert_close(out, images.float() / 255.0)


def test_normalize_leaves_a_float_input_unchanged():
    """The docstring accepts float inputs; ``.to(float32)`` of a contiguous float32 tensor is the tensor itself,
    so an in-place ``sub_`` / ``mul_`` on it would write into the caller's tensor."""
    images = torch.full((1, 3, 2, 2), 255.0)
    out = normalize(images, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert (images == 255.0).all() and (out == 1.0).all()  # (255 / 255 - 0.5) / 0.5 = 1


# ---------------------------------------------------------------- centre crop and square padding


def test_center_crop_offsets_round_down():
    """A 5 x 6 image cropped to 2 x 3: offsets (5 - 2) // 2 = 1 and (6 - 3) // 2 = 1."""
    image = torch.arange(30, dtype=torch.uint8).view(1, 1, 5, 6)
    assert center_crop(image, (2, 3))[0, 0].tolist() == [[7, 8, 9], [13, 14, 15]]
    assert center_crop(image, (5, 6)).tolist() == image.tolist()  # the full size: the image itself


def test_center_crop_pads_a_small_image_with_the_extra_on_top_and_left():
    """A 1 x 2 image (two channels, two images) in a 4 x 7 crop: 3 missing rows (ceil(3 / 2) = 2 above, 1 below),
    5 missing columns (ceil(5 / 2) = 3 left, 2 right)."""
    image = torch.tensor([[[[1, 2]], [[3, 4]]], [[[5, 6]], [[7, 8]]]], dtype=torch.uint8)
    out = center_crop(image, (4, 7))
    assert out.shape == (2, 2, 4, 7)
    want = torch.zeros(2, 2, 4, 7, dtype=torch.uint8)
    want[:, :, 2, 3:5] = image[:, :, 0]
    assert torch.equal(out, want)


def test_center_crop_pads_one_side_and_crops_the_other():
    """A 2 x 6 image in a 5 x 2 crop: rows padded (3 missing: 2 above, 1 below), columns cropped at (6 - 2) // 2."""
    image = torch.arange(1, 13, dtype=torch.uint8).view(1, 1, 2, 6)
    assert center_crop(image, (5, 2))[0, 0].tolist() == [[0, 0], [0, 0], [3, 4], [9, 10], [0, 0]]
    # and the other way round: 6 x 2 in a 2 x 5 crop
    tall = image.view(1, 1, 6, 2)
    assert center_crop(tall, (2, 5))[0, 0].tolist() == [[0, 0, 5, 6, 0], [0, 0, 7, 8, 0]]


def test_pad_square_centres_the_image_with_the_extra_bottom_right():
    """1 x 5 -> 5 x 5 with the row at (5 - 1) // 2 = 2; 6 x 2 -> 6 x 6 with the columns at (6 - 2) // 2 = 2."""
    wide = torch.arange(1, 16, dtype=torch.uint8).view(3, 1, 5)
    out = pad_square(wide, 9)
    assert out.shape == (3, 5, 5) and out.dtype == torch.uint8
    want = torch.full((3, 5, 5), 9, dtype=torch.uint8)
    want[:, 2] = wide[:, 0]
    assert torch.equal(out, want)
    tall = torch.arange(1, 37, dtype=torch.uint8).view(3, 6, 2)
    want = torch.full((3, 6, 6), 9, dtype=torch.uint8)
    want[:, :, 2:4] = tall
    assert torch.equal(pad_square(tall, 9), want)
    odd = torch.ones(3, 2, 5, dtype=torch.uint8)  # 3 missing rows: 1 above, 2 below
    assert pad_square(odd, 0)[0, :, 0].tolist() == [0, 1, 1, 0, 0]


# ---------------------------------------------------------------- host blanking


def test_blank_outside_fills_the_unmasked_pixels():
    crop = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) + 100
    mask = np.array([[True, False, True], [False, True, False]])
    out = blank_outside(crop, mask, 7)
    assert out.dtype == np.uint8 and out.shape == (2, 3, 3)
    want = np.where(mask[..., None], crop, 7)
    np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError, match=r"mask shape \(2, 2\) does not match the crop's \(2, 3\)"):
        blank_outside(crop, mask[:, :2], 7)


# ---------------------------------------------------------------- ImageSpec


def test_image_spec_resizes_to_exactly_one_of_size_or_shortest_edge():
    with pytest.raises(ValueError, match="^an ImageSpec resizes to exactly one of size or shortest_edge$"):
        _spec(shortest_edge=4)
    with pytest.raises(ValueError, match="^an ImageSpec resizes to exactly one of size or shortest_edge$"):
        _spec(size=None)
    assert _spec(size=None, shortest_edge=4).shortest_edge == 4


def test_image_spec_names_the_resample_filters_it_knows():
    with pytest.raises(ValueError, match=r"resample must be one of \['bicubic', 'bilinear'\], got 'nearest'"):
        _spec(resample="nearest")
    assert _spec(resample="bicubic").resample == "bicubic"


def test_resized_size_by_shortest_edge_truncates_the_long_side():
    """Edge 4: 3 x 5 -> (4, int(4 * 5 / 3) = int(6.67) = 6); 5 x 3 -> (6, 4); 7 x 7 -> (4, 4)."""
    spec = _spec(size=None, shortest_edge=4)
    assert spec.resized_size(3, 5) == (4, 6)
    assert spec.resized_size(5, 3) == (6, 4)
    assert spec.resized_size(7, 7) == (4, 4)
    assert _spec(size=(3, 9)).resized_size(5, 3) == (3, 9)


def test_image_spec_pads_when_the_crop_is_larger_than_the_resized_image():
    """DINOv2-style (shortest edge, then crop) with a crop larger than the resized image: a 2 x 3 image is
    already at shortest edge 2 (2 x int(2 * 3 / 2) = 2 x 3), then zero-padded into the 4 x 4 crop (2 missing
    rows: 1 above; 1 missing column: ceil(1 / 2) = 1 left)."""
    spec = _spec(size=None, shortest_edge=2, crop=(4, 4))
    image = torch.tensor([[10, 20, 30], [40, 50, 60]], dtype=torch.uint8).expand(1, 3, 2, 3)
    want = torch.zeros(1, 3, 4, 4)
    want[..., 1:3, 1:4] = image.float()
    torch.testing.assert_close(spec(image), want / 255.0)
    torch.testing.assert_close(spec.batch([image[0], image[0]]), torch.cat([want, want]) / 255.0)


def test_image_spec_resizes_then_crops_then_normalises():
    """The 2 x 4 ramp resized to 2 x 2 (rows [50, 160] and [160, 50]), centre-cropped to 1 x 1 at offset
    (2 - 1) // 2 = 0 (the value 50), normalised with mean 0.5 and std 0.25: (50 / 255 - 0.5) / 0.25."""
    spec = _spec(crop=(1, 1), mean=(0.5,) * 3, std=(0.25,) * 3)
    images = _u8(RAMP).expand(1, 3, 2, 4)
    assert spec.resize_crop(images).tolist() == [[[[50]]] * 3]
    torch.testing.assert_close(spec(images), torch.full((1, 3, 1, 1), (50 / 255 - 0.5) / 0.25))
    plain = _spec(mean=(0.5,) * 3, std=(0.25,) * 3)  # no crop: the 2 x 2 resize as it is
    torch.testing.assert_close(plain(images)[0, 0], (torch.tensor(RAMP_HALF) / 255.0 - 0.5) / 0.25)


def test_image_spec_batch_needs_a_fixed_output_size():
    images = [torch.zeros(3, 5, 7, dtype=torch.uint8), torch.full((3, 3, 2), 255, dtype=torch.uint8)]
    with pytest.raises(ValueError, match=r"^batching images of different sizes needs a fixed output size \(crop or size\)$"):
        _spec(size=None, shortest_edge=2).batch(images)
    out = _spec().batch(images)  # a size: every image resized to 2 x 2
    assert out.shape == (2, 3, 2, 2)
    torch.testing.assert_close(out, torch.cat([torch.zeros(1, 3, 2, 2), torch.ones(1, 3, 2, 2)]))
    cropped = _spec(size=None, shortest_edge=2, crop=(2, 2)).batch(images)  # a crop: every image cut to 2 x 2
    torch.testing.assert_close(cropped, out)


def test_sam2_spec():
    assert ImageSpec.sam2(16) == ImageSpec(size=(16, 16), shortest_edge=None, resample="bilinear", crop=None,
                                           mean=IMAGENET_MEAN, std=IMAGENET_STD)


def test_from_processor_reads_size_resample_and_statistics():
    spec = ImageSpec.from_processor(_processor(), "m")
    assert spec == ImageSpec(size=(4, 6), shortest_edge=None, resample="bicubic", crop=None,
                             mean=(0.5, 0.25, 0.125), std=(2.0, 4.0, 8.0))
    assert all(isinstance(v, float) for v in spec.mean + spec.std)


def test_from_processor_reads_a_shortest_edge_and_a_crop():
    """DINOv2 style: ``size`` holds only the shortest edge, the crop comes from ``crop_size`` (transformers 5's
    SizeDict objects: attributes, a missing one read as None)."""
    size = SimpleNamespace(shortest_edge=8.0)
    crop = SimpleNamespace(height=6, width=5)
    spec = ImageSpec.from_processor(_processor(size=size, resample=2, do_center_crop=True, crop_size=crop), "m")
    assert (spec.size, spec.shortest_edge, spec.resample, spec.crop) == (None, 8, "bilinear", (6, 5))
    dict_crop = _processor(size={"shortest_edge": 8}, resample=2, do_center_crop=True, crop_size={"height": 6, "width": 5})
    assert ImageSpec.from_processor(dict_crop, "m") == spec


def test_from_processor_takes_the_shortest_edge_when_size_lacks_a_width():
    """A ``size`` with a height but no width is no exact size: the shortest edge decides."""
    spec = ImageSpec.from_processor(_processor(size={"height": 5, "shortest_edge": 7}), "m")
    assert (spec.size, spec.shortest_edge) == (None, 7)


def test_from_processor_prefers_an_exact_size_to_a_shortest_edge():
    """transformers 5's SizeDict carries every field; with a height and a width the shortest edge is ignored."""
    spec = ImageSpec.from_processor(_processor(size=SimpleNamespace(height=4, width=6, shortest_edge=3)), "m")
    assert (spec.size, spec.shortest_edge) == ((4, 6), None)


def test_from_processor_defaults():
    """Attributes a processor does not have: resize, rescale by 1/255, normalise, bilinear, no centre crop
    (even with a ``crop_size``)."""
    bare = _processor(do_resize=..., do_rescale=..., do_normalize=..., rescale_factor=..., resample=...,
                      crop_size={"height": 1, "width": 1})
    spec = ImageSpec.from_processor(bare, "m")
    assert (spec.size, spec.resample, spec.crop) == ((4, 6), "bilinear", None)
    assert spec(torch.zeros(1, 3, 4, 6, dtype=torch.uint8)).shape == (1, 3, 4, 6)


@pytest.mark.parametrize("over, message", [
    (dict(do_resize=False), "models/x: image processors without do_resize are not supported"),
    (dict(do_rescale=False), "models/x: the image processor must rescale and normalise"),
    (dict(do_normalize=False), "models/x: the image processor must rescale and normalise"),
    (dict(rescale_factor=2 / 255), "models/x: rescale_factor 0.00784313725490196 is not 1/255"),
    (dict(rescale_factor=1 / 256), "models/x: rescale_factor 0.00390625 is not 1/255"),
    (dict(rescale_factor=1.0), "models/x: rescale_factor 1.0 is not 1/255"),
    (dict(resample=0), r"models/x: resample=0 is not bilinear \(2\) or bicubic \(3\)"),
    (dict(resample=1), r"models/x: resample=1 is not bilinear \(2\) or bicubic \(3\)"),
])
def test_from_processor_refuses_what_it_does_not_reproduce(over, message):
    with pytest.raises(ValueError, match=message):
        ImageSpec.from_processor(_processor(**over), "models/x")


def test_from_processor_accepts_a_rescale_factor_within_a_millionth():
    """|255 f - 1| <= 1e-6 passes (float32 statistics in a saved config round 1/255 slightly)."""
    assert ImageSpec.from_processor(_processor(rescale_factor=(1 + 9e-7) / 255), "m").size == (4, 6)
    with pytest.raises(ValueError, match="is not 1/255"):
        ImageSpec.from_processor(_processor(rescale_factor=(1 + 2e-6) / 255), "m")


# ---------------------------------------------------------------- frames and crops to model inputs


def test_frames_input_batches_an_array_and_goes_frame_by_frame_for_a_sequence():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (2, 4, 6, 3), dtype=np.uint8)
    spec = _spec(size=(3, 3))
    want = spec(upload(frames, CPU))
    torch.testing.assert_close(frames_input(spec, frames, CPU), want)
    torch.testing.assert_close(frames_input(spec, list(frames), CPU), want)
    other = rng.integers(0, 256, (5, 2, 3), dtype=np.uint8)  # a sequence may mix sizes
    mixed = frames_input(spec, [frames[0], other], CPU)
    torch.testing.assert_close(mixed, torch.cat([want[:1], spec(upload(other[None], CPU))]))
    owl = Owlv2Spec(size=(3, 3), mean=UNIT[0], std=UNIT[1])
    torch.testing.assert_close(frames_input(owl, [frames[0], other], CPU),
                               torch.cat([owl(upload(frames[:1], CPU)), owl(upload(other[None], CPU))]))


def test_masked_crops_input_blanks_pads_and_batches():
    """Two 2 x 3 crops, background 9: pixels outside the mask become 9; squared, each sits in rows 0-1 of a
    3 x 3 square ((3 - 2) // 2 = 0 rows above) whose last row is 9; the spec's 3 x 3 size keeps them as they are."""
    crops = [np.full((2, 3, 3), 100, np.uint8), np.full((2, 3, 3), 200, np.uint8)]
    masks = [np.array([[True, False, True], [True, True, False]]), np.ones((2, 3), bool)]
    out = masked_crops_input(_spec(size=(3, 3)), crops, masks, 9, True, CPU)
    want = torch.tensor([[[100, 9, 100], [100, 100, 9], [9, 9, 9]],
                         [[200, 200, 200], [200, 200, 200], [9, 9, 9]]], dtype=torch.float32)
    torch.testing.assert_close(out, want[:, None].expand(2, 3, 3, 3) / 255.0)
    flat = masked_crops_input(_spec(size=(2, 3)), crops, masks, 9, False, CPU)  # not squared: 2 x 3 as they are
    torch.testing.assert_close(flat, want[:, None, :2].expand(2, 3, 2, 3) / 255.0)


# ---------------------------------------------------------------- OWLv2


def test_mirror_reflects_about_the_edge_samples():
    """n = 4: ... 3 2 1 | 0 1 2 3 | 2 1 0 1 2 ... (period 2 (n - 1) = 6); n = 2 alternates; n = 1 is all 0."""
    index = np.arange(-3, 9)
    assert _mirror(index, 4).tolist() == [3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1, 2]
    assert _mirror(index, 2).tolist() == [1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0]
    assert _mirror(index, 1).tolist() == [0] * 12


def test_owlv2_pads_bottom_right_with_zeros_at_the_same_scale():
    """A square output as large as the padded input: blur (sigma 0) and zoom (sample j at j) are the identity,
    so the output is the image padded with zeros at the bottom (wide) or right (tall), then normalised. The
    zeros are inside the clipped range even though every pixel is >= 10."""
    spec = Owlv2Spec(size=(3, 3), mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 1.0))
    wide = torch.tensor([[10, 20, 30], [40, 50, 255]], dtype=torch.uint8).expand(2, 3, 2, 3).clone()
    wide[1] //= 2
    want = torch.zeros(2, 3, 3, 3)
    want[:, :, :2] = wide.float() / 255.0
    norm = torch.tensor([[0.5, 0.25, 0.0], [0.5, 0.25, 1.0]]).view(2, 1, 3, 1, 1)
    torch.testing.assert_close(spec(wide), (want - norm[0]) / norm[1], atol=1e-6, rtol=0)
    tall = wide.transpose(-1, -2)
    torch.testing.assert_close(spec(tall), ((want - norm[0]) / norm[1]).transpose(-1, -2), atol=1e-6, rtol=0)


def test_owlv2_output_has_the_spec_size():
    """Height and width take their own axis operators: a 3 x 3 image to 2 x 3 (rows averaged in pairs by the
    zoom, columns as they are) and to 3 x 2."""
    image = torch.full((1, 3, 3, 3), 51, dtype=torch.uint8)
    out = Owlv2Spec(size=(2, 3), mean=UNIT[0], std=UNIT[1])(image)
    assert out.shape == (1, 3, 2, 3)
    torch.testing.assert_close(out, torch.full((1, 3, 2, 3), 0.2))
    assert Owlv2Spec(size=(3, 2), mean=UNIT[0], std=UNIT[1])(image).shape == (1, 3, 3, 2)


def test_owlv2_clips_each_image_to_its_own_range():
    """Blur and zoom are convex combinations, so the float32 products leave a flat image only by rounding
    noise; the clip to each image's own [min, max] gives exactly flat outputs (a 9 x 9 frame to 4 x 4: the
    noise goes both ways at these grey levels)."""
    images = torch.stack([torch.full((3, 9, 9), 200, dtype=torch.uint8), torch.full((3, 9, 9), 100, dtype=torch.uint8)])
    out = Owlv2Spec(size=(4, 4), mean=UNIT[0], std=UNIT[1])(images)
    for image, value in zip(out, (200, 100)):
        assert (image == image[0, 0, 0]).all()
        assert abs(float(image[0, 0, 0]) - value / 255) < 1e-6


def test_owlv2_clips_a_padded_image_to_zero_and_its_maximum():
    """A 4 x 6 flat frame to 3 x 3: padded with zeros, so the range is [0, 100 / 255]; nothing exceeds the top."""
    image = torch.full((1, 3, 4, 6), 100, dtype=torch.uint8)
    out = Owlv2Spec(size=(3, 3), mean=UNIT[0], std=UNIT[1])(image)
    assert float(out.max()) == float(normalize(torch.full((1, 3, 1, 1), 100 / 255) * 255.0, *UNIT).max())
    assert float(out.min()) >= 0.0 and float(out[..., 2, :].max()) < 0.5 * 100 / 255  # the padded bottom row


def test_owlv2_from_processor():
    processor = SimpleNamespace(size={"height": 8, "width": 6}, image_mean=[0.5, 0.25, 1], image_std=[1, 2, 3])
    assert Owlv2Spec.from_processor(processor, "m") == Owlv2Spec(size=(8, 6), mean=(0.5, 0.25, 1.0), std=(1.0, 2.0, 3.0))
    processor.size = SimpleNamespace(height=8, width=6)
    assert Owlv2Spec.from_processor(processor, "m").size == (8, 6)
    processor.do_pad, processor.do_resize = True, True
    assert Owlv2Spec.from_processor(processor, "m").size == (8, 6)


@pytest.mark.parametrize("over, message", [
    (dict(do_pad=False), "models/v2: OWLv2 processors without padding or resizing are not supported"),
    (dict(do_resize=False), "models/v2: OWLv2 processors without padding or resizing are not supported"),
    (dict(size={"height": 8}), r"models/v2: the OWLv2 processor needs size height and width, got \{'height': 8\}"),
    (dict(size={"width": 8}), r"models/v2: the OWLv2 processor needs size height and width, got \{'width': 8\}"),
])
def test_owlv2_from_processor_refuses(over, message):
    processor = SimpleNamespace(size={"height": 8, "width": 6}, image_mean=[0.5] * 3, image_std=[1] * 3)
    for key, value in over.items():
        setattr(processor, key, value)
    with pytest.raises(ValueError, match=message):
        Owlv2Spec.from_processor(processor, "models/v2")
