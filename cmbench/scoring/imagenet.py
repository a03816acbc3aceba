"""ImageNet statistics of the SAM 2 and DINOv2 preprocessing."""

from __future__ import annotations

import numpy as np

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def imagenet_normalize(image: np.ndarray) -> np.ndarray:
    """``uint8 [H, W, 3]`` -> ``float32 [3, H, W]`` scaled to [0, 1] and ImageNet-normalised."""
    mean, std = np.array(IMAGENET_MEAN, dtype=np.float32), np.array(IMAGENET_STD, dtype=np.float32)
    return ((image.astype(np.float32) / 255.0 - mean) / std).transpose(2, 0, 1)
