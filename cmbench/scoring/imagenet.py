"""ImageNet normalisation used by the SAM 2 and DINOv2 preprocessing."""

from __future__ import annotations

import numpy as np

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def imagenet_normalize(image: np.ndarray) -> np.ndarray:
    """``uint8 [H, W, 3]`` -> ``float32 [3, H, W]`` scaled to [0, 1] and ImageNet-normalised."""
    return ((image.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)
