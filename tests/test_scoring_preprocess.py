"""The scorer's device preprocessing against transformers' processors (PIL where a processor needs
torchvision), and the tiny models' outputs on both inputs.

Tolerances, in grey levels of the resized uint8 image (normalised inputs then differ by at most that
/ (255 * std), about 0.03 per grey level for CLIP and ImageNet statistics):

- resize (torch's uint8 kernels on CPU; float32 in two passes, PIL's order, on CUDA): at most 2 grey
  levels from PIL, on average under 0.02 when shrinking and under 0.2 when enlarging (rounding);
- OWLv2 (blur + linear zoom as matrix products in float32): 1e-5 of the normalised value;
- model outputs on the two inputs: OWL-ViT boxes IoU > 0.99 for every patch, SAM 2 masks IoU > 0.99,
  DINOv2 embeddings cosine > 0.9999.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from cmbench.benchmarks.scorer import object_crops, synthetic_frames
from cmbench.scoring import build_scorer
from cmbench.scoring.host_preprocess import blank_background, dino_pixels, processor_pixels, sam2_pixels
from cmbench.scoring.imagenet import IMAGENET_STD, imagenet_normalize
from cmbench.scoring.owl import OwlVitDetector
from cmbench.scoring.preprocess import (
    ImageSpec,
    Owlv2Spec,
    blank_outside,
    center_crop,
    frames_input,
    masked_crops_input,
    resize_two_pass,
    resize_uint8,
    upload,
)
from cmbench.scoring.runtime import resolve_runtime
from cmbench.scoring.tiny_models import tiny_deep_scorer_config

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return tiny_deep_scorer_config(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def scorer(config):
    return build_scorer(config)


@pytest.fixture(scope="module")
def owlv2(tmp_path_factory):
    return build_scorer(tiny_deep_scorer_config(tmp_path_factory.mktemp("tiny_v2"), detector="owlv2")).detector


def _grey_levels(a: torch.Tensor, b: torch.Tensor, std) -> torch.Tensor:
    """|a - b| of normalised inputs ``[N, 3, H, W]`` back on the 0..255 scale."""
    return (a - b).abs() * torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1) * 255.0


def _images():
    rng = np.random.default_rng(0)
    smooth = synthetic_frames(1, 270, 480)[0]
    return {"noise": rng.integers(0, 256, (90, 160, 3), dtype=np.uint8), "smooth": smooth,
            "small": rng.integers(0, 256, (17, 29, 3), dtype=np.uint8)}


@pytest.mark.parametrize("mode, pil", [("bilinear", Image.Resampling.BILINEAR), ("bicubic", Image.Resampling.BICUBIC)])
@pytest.mark.parametrize("size", [(64, 64), (128, 200), (300, 300)])
def test_resize_matches_pil_on_both_paths(mode, pil, size):
    for name, image in _images().items():
        ref = np.asarray(Image.fromarray(image).resize(size[::-1], pil)).astype(np.int16)
        x = upload(image[None], CPU)
        for path, fn in (("uint8", resize_uint8), ("two-pass float", resize_two_pass)):
            out = fn(x, size, mode)[0].permute(1, 2, 0).numpy().astype(np.int16)
            diff = np.abs(out - ref)
            assert out.shape == ref.shape
            assert diff.max() <= 2, (name, path, diff.max())
            assert diff.mean() < (0.02 if size[0] < image.shape[0] else 0.2), (name, path, diff.mean())


def test_owlvit_input_matches_its_processor(scorer):
    frames = synthetic_frames(3, 120, 208)
    noise = np.random.default_rng(1).integers(0, 256, (2, 120, 208, 3), dtype=np.uint8)
    detector = scorer.detector
    for batch in (frames, noise):
        diff = _grey_levels(detector.preprocess(batch), processor_pixels(detector.image_processor, batch), detector.spec.std)
        assert diff.max() < 2.01 and diff.mean() < 0.02
    # the released models' processor size (768) on a 480x832 frame: same code, upscaling
    released = transformers.OwlViTImageProcessorPil(size={"height": 768, "width": 768}, crop_size={"height": 768, "width": 768})
    spec = ImageSpec.from_processor(released, "owlvit-768")
    frame = synthetic_frames(1, 480, 832)
    diff = _grey_levels(frames_input(spec, frame, CPU), processor_pixels(released, frame), spec.std)
    assert diff.max() < 2.01 and diff.mean() < 0.2


def test_owlv2_input_matches_its_processor(owlv2):
    frames = synthetic_frames(2, 96, 160)  # padded to 160 x 160 at the bottom
    tall = synthetic_frames(1, 150, 60)  # padded at the right
    for batch, processor in ((frames, owlv2.image_processor), (tall, owlv2.image_processor),
                             (frames, transformers.Owlv2ImageProcessorPil(size={"height": 960, "width": 960}))):
        spec = Owlv2Spec.from_processor(processor, "owlv2")
        ours, ref = frames_input(spec, batch, CPU), processor_pixels(processor, batch)
        assert ours.shape == ref.shape
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_sam2_input_matches_the_processor_and_antialiases(scorer):
    frames = [synthetic_frames(1, 48, 64)[0], synthetic_frames(1, 200, 120, seed=3)[0]]  # mixed sizes
    diff = _grey_levels(scorer.segmenter.preprocess(frames), sam2_pixels(frames, scorer.segmenter.input_size), IMAGENET_STD)
    assert diff.max() < 2.01 and diff.mean() < 0.2
    # a 1080p frame to SAM 2's 1024 input: antialiased like the processor; plain bilinear is far off
    yy, xx = np.mgrid[0:1080, 0:1920]
    frame = np.stack([(xx // 3) % 256, (yy // 2) % 256, ((xx + yy) // 5) % 256], -1).astype(np.uint8)
    spec = ImageSpec.sam2(1024)
    ref = sam2_pixels([frame], 1024)
    diff = _grey_levels(frames_input(spec, [frame], CPU), ref, IMAGENET_STD)
    assert diff.max() < 1.01
    plain = torch.from_numpy(imagenet_normalize(cv2.resize(frame, (1024, 1024), interpolation=cv2.INTER_LINEAR)))[None]
    assert _grey_levels(plain, ref, IMAGENET_STD).max() > 20  # what the scorer fed SAM 2 before


@pytest.mark.parametrize("crop_mode", ["processor", "pad_square"])
def test_dino_input_matches_the_host_reference(scorer, tmp_path, crop_mode):
    frames = synthetic_frames(4, 120, 208)
    crops, masks = object_crops(frames)
    crops.append(frames[0][10:16, 5:95])  # very wide: the centre crop cuts its sides (a height of 1, 3 or 4
    masks.append(np.ones((6, 90), dtype=bool))  # would make transformers' processor read the rows as channels)
    embedder = scorer.embedder
    if crop_mode == "processor":
        ours = embedder.preprocess(crops, masks)
        ref = dino_pixels(crops, masks, 0, processor=embedder.image_processor)
    else:
        spec = ImageSpec(size=(56, 56), shortest_edge=None, resample="bicubic", crop=None,
                         mean=embedder.spec.mean, std=embedder.spec.std)
        ours = masked_crops_input(spec, crops, masks, 17, True, CPU)
        ref = dino_pixels(crops, masks, 17, square_size=56)
    diff = _grey_levels(ours, ref, embedder.spec.std)
    assert ours.shape == ref.shape == (5, 3, 56, 56)
    assert diff.max() < 2.01 and diff.mean() < 0.2


@pytest.mark.parametrize("background", [0, 17])
def test_blank_outside_keeps_the_mask_and_fills_the_rest(background):
    frame = synthetic_frames(1, 60, 80)[0]
    crop = frame[7:40, 11:70]  # a strided view into the frame, as the pipeline's crops are
    mask = np.random.default_rng(0).random(crop.shape[:2]) < 0.5
    out = blank_outside(crop, mask, background)
    np.testing.assert_array_equal(out, blank_background(crop, mask, background))
    np.testing.assert_array_equal(crop, frame[7:40, 11:70])  # the frame is not written to
    with pytest.raises(ValueError, match=r"mask shape \(33, 58\) does not match the crop's \(33, 59\)"):
        blank_outside(crop, mask[:, :-1], background)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of corner boxes ``[..., 4]``."""
    lo, hi = np.maximum(a[..., :2], b[..., :2]), np.minimum(a[..., 2:], b[..., 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area = lambda box: np.prod(box[..., 2:] - box[..., :2], axis=-1)  # noqa: E731
    return inter / (area(a) + area(b) - inter)


@torch.inference_mode()
def test_tiny_models_agree_on_both_inputs(scorer, config):
    frames = synthetic_frames(4, 120, 208)
    segmenter, embedder = scorer.segmenter, scorer.embedder
    # a random box head saturates its sigmoid (degenerate boxes, IoU undefined); a hundredth of it keeps
    # patch-sized boxes that still move with the input (by ~20 px between two different frames)
    detector = OwlVitDetector(config["detector"]["model"], resolve_runtime("cpu"), query_template="a {}", score_threshold=0.0)
    detector.model.box_head.dense2.weight.mul_(0.01)
    detector.model.box_head.dense2.bias.mul_(0.01)
    tokens = detector._tokenize(("cube",))

    def owl(pixels):
        out = detector.model(input_ids=tokens["input_ids"].repeat(len(pixels), 1),
                             attention_mask=tokens["attention_mask"].repeat(len(pixels), 1), pixel_values=pixels)
        cx, cy, w, h = out.pred_boxes.unbind(-1)
        return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1).numpy(), out.logits.numpy()

    boxes, logits = owl(detector.preprocess(frames))
    ref_boxes, ref_logits = owl(processor_pixels(detector.image_processor, frames))
    assert (boxes[..., 2:] - boxes[..., :2]).min() > 0.01  # non-degenerate
    assert _iou(boxes, ref_boxes).min() > 0.99  # every patch's box
    np.testing.assert_allclose(logits, ref_logits, atol=0.05)
    np.testing.assert_array_equal(logits.max(-1).argmax(-1), ref_logits.max(-1).argmax(-1))  # the chosen patches

    prompts = torch.tensor([[[10.0, 20.0, 90.0, 100.0]]] * len(frames)) * segmenter.input_size / 208

    def sam(pixels):
        logits = segmenter.model(pixel_values=pixels, input_boxes=prompts, multimask_output=False).pred_masks[:, 0, :1]
        return torch.nn.functional.interpolate(logits, size=(120, 208), mode="bilinear", align_corners=False)[:, 0].numpy()

    ours, ref = sam(segmenter.preprocess(list(frames))), sam(sam2_pixels(list(frames), segmenter.input_size))
    threshold = float(np.median(ref))  # random weights: cut at the median for non-trivial masks
    for a, b in zip(ours > threshold, ref > threshold):
        assert (a & b).sum() / (a | b).sum() > 0.99

    crops, masks = object_crops(frames)
    ours = embedder.model(pixel_values=embedder.preprocess(crops, masks)).pooler_output
    ref = embedder.model(pixel_values=dino_pixels(crops, masks, 0, processor=embedder.image_processor)).pooler_output
    assert torch.nn.functional.cosine_similarity(ours, ref).min() > 0.9999


@pytest.mark.parametrize("shape, crop", [((2, 3), (5, 4)), ((3, 2), (6, 7)), ((4, 4), (7, 2)), ((5, 3), (2, 6)),
                                         ((1, 1), (4, 5)), ((6, 5), (3, 3))])
def test_center_crop_pads_an_image_smaller_than_the_crop_as_transformers_does(shape, crop):
    """An image smaller than the crop is zero-padded around its centre first (``ceil`` of half the missing
    size on the top / left), then cropped: pixel for pixel what transformers' ``center_crop`` gives."""
    from transformers.image_transforms import center_crop as reference

    image = np.random.default_rng(0).integers(1, 255, (3, *shape)).astype(np.uint8)
    want = reference(image, crop, data_format="channels_first", input_data_format="channels_first")
    got = center_crop(torch.from_numpy(image)[None], crop)[0].numpy()
    assert got.shape == (3, *crop) and np.array_equal(got, want)


def test_center_crop_padding_by_hand():
    """A 1 x 2 image in a 4 x 3 crop: 3 rows missing (2 above, 1 below), 1 column (1 left, 0 right)."""
    image = torch.tensor([[[[7, 9]]]], dtype=torch.uint8)
    assert center_crop(image, (4, 3))[0, 0].tolist() == [[0, 0, 0], [0, 0, 0], [0, 7, 9], [0, 0, 0]]


def test_imagenet_normalisation_is_channel_first_float32_with_the_imagenet_statistics():
    from cmbench.scoring.imagenet import IMAGENET_MEAN

    image = np.zeros((2, 3, 3), np.uint8)
    image[..., 0], image[..., 1], image[..., 2] = 0, 255, 51
    out = imagenet_normalize(image)
    assert out.shape == (3, 2, 3) and out.dtype == np.float32  # what the models' float32 inputs are
    for channel, value in enumerate((0.0, 1.0, 0.2)):
        expected = (value - IMAGENET_MEAN[channel]) / IMAGENET_STD[channel]
        assert np.allclose(out[channel], expected, atol=1e-6)
