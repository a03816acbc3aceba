"""Per-image host preprocessing: transformers' image processors and PIL, one image at a time.

This is the numerical reference of :mod:`cmbench.scoring.preprocess` (``tests/test_scoring_preprocess.py``
checks the device path against it) and the host path ``scripts/bench_scorer.py`` times it against.
SAM 2's own processor (``Sam2ImageProcessor``) needs torchvision, so its arithmetic is written out
here with PIL: antialiased bilinear resize of the uint8 frame to the square input (torchvision's
``antialias=True`` resize matches PIL's), then ``(x / 255 - mean) / std`` with ImageNet statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from cmbench.scoring.imagenet import imagenet_normalize


def blank_background(crop: np.ndarray, mask: np.ndarray, background: int) -> np.ndarray:
    """``uint8 [h, w, 3]`` crop with the pixels outside ``mask`` (``bool [h, w]``) set to ``background``."""
    return np.where(mask[..., None], crop, np.uint8(background))


def processor_pixels(processor: Any, images: Sequence[np.ndarray] | np.ndarray) -> torch.Tensor:
    """A transformers image processor on ``uint8 [H_i, W_i, 3]`` images -> ``float32 [N, 3, h, w]``."""
    return processor(images=list(images), return_tensors="pt")["pixel_values"]


def sam2_pixels(frames: Sequence[np.ndarray] | np.ndarray, size: int) -> torch.Tensor:
    """``Sam2ImageProcessor``'s output for ``uint8 [H_i, W_i, 3]`` frames: ``float32 [N, 3, size, size]``."""
    resized = [np.asarray(Image.fromarray(f).resize((size, size), Image.Resampling.BILINEAR)) for f in frames]
    return torch.from_numpy(np.stack([imagenet_normalize(r) for r in resized]))


def dino_pixels(
    crops: Sequence[np.ndarray],
    masks: Sequence[np.ndarray],
    background: int,
    processor: Any = None,
    square_size: int = 224,
) -> torch.Tensor:
    """DINOv2 input of masked crops, one crop at a time on the host.

    Parameters
    ----------
    crops : sequence of ``uint8 [h_i, w_i, 3]``
    masks : sequence of ``bool [h_i, w_i]``
    background : int
    processor : transformers image processor, optional
        ``crop_mode="processor"``: the model's processor on each blanked crop.
    square_size : int
        ``crop_mode="pad_square"`` (no ``processor``): pad to a centred square of ``background``, PIL
        bicubic resize to this side, ImageNet-normalise.

    Returns
    -------
    Tensor, ``float32 [N, 3, s, s]``
    """
    blanked = [blank_background(c, m, background) for c, m in zip(crops, masks)]
    if processor is not None:
        return processor_pixels(processor, blanked)
    out = []
    for crop in blanked:
        height, width = crop.shape[:2]
        side = max(height, width)
        square = np.full((side, side, 3), background, dtype=np.uint8)
        top, left = (side - height) // 2, (side - width) // 2
        square[top : top + height, left : left + width] = crop
        resized = Image.fromarray(square).resize((square_size, square_size), Image.Resampling.BICUBIC)
        out.append(imagenet_normalize(np.asarray(resized)))
    return torch.from_numpy(np.stack(out))
