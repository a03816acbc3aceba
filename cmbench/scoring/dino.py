"""DINOv2 embeddings of masked crops: CLS token after the final LayerNorm (``pooler_output``).

Preprocessing (ours, no image processor): background pixels of the crop (outside the mask) are set
to ``background``, the crop is padded to a square with the same value (so the whole object stays in
view, unlike a centre crop), resized to ``image_size`` and ImageNet-normalised.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from cmbench.scoring.imagenet import imagenet_normalize
from cmbench.scoring.runtime import Runtime, load_pretrained


def square_masked_crop(crop: np.ndarray, mask: np.ndarray, background: int, size: int) -> np.ndarray:
    """Blank the background, pad to a centred square and resize.

    Parameters
    ----------
    crop : ndarray, ``uint8 [h, w, 3]``
    mask : ndarray, ``bool [h, w]``
    background : int
        Fill value (0..255) for pixels outside the mask and for the padding.
    size : int
        Output side.

    Returns
    -------
    ndarray, ``uint8 [size, size, 3]``
    """
    h, w = mask.shape
    side = max(h, w)
    square = np.full((side, side, 3), background, dtype=np.uint8)
    top, left = (side - h) // 2, (side - w) // 2
    square[top : top + h, left : left + w] = np.where(mask[..., None], crop, np.uint8(background))
    interp = cv2.INTER_AREA if side > size else cv2.INTER_CUBIC
    return cv2.resize(square, (size, size), interpolation=interp)


class Dinov2Embedder:
    """DINOv2 (any size) through transformers' ``Dinov2Model``.

    Parameters
    ----------
    model : str
        Hub id (``facebook/dinov2-small`` / ``-base`` / ``-large`` / ``-giant``) or local folder.
    runtime : Runtime
    image_size : int
        Input side; a multiple of the patch size (224 = 16 x 14 for the released models).
    background : int
        Fill value of masked-out pixels.
    """

    def __init__(self, model: str, runtime: Runtime, image_size: int = 224, background: int = 0):
        from transformers import Dinov2Model

        self.runtime = runtime
        self.model = load_pretrained(Dinov2Model, model, "embedder").to(runtime.device, runtime.dtype).eval()
        patch = int(self.model.config.patch_size)
        if image_size % patch:
            raise ValueError(f"embedder image_size {image_size} must be a multiple of the patch size {patch}")
        if not 0 <= background <= 255:
            raise ValueError(f"embedder background must be in 0..255, got {background}")
        self.image_size = int(image_size)
        self.background = int(background)

    @torch.inference_mode()
    def embed(self, crops: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> np.ndarray:
        """Unit-norm CLS embeddings.

        Parameters
        ----------
        crops : sequence of ``uint8 [h_i, w_i, 3]``
        masks : sequence of ``bool [h_i, w_i]``

        Returns
        -------
        ndarray, ``float32 [N, D]`` (D = hidden size)
        """
        out = []
        step = self.runtime.batch_size
        for start in range(0, len(crops), step):
            images = [
                imagenet_normalize(square_masked_crop(c, m, self.background, self.image_size))
                for c, m in zip(crops[start : start + step], masks[start : start + step])
            ]
            pixels = torch.from_numpy(np.stack(images)).to(self.runtime.device, self.runtime.dtype)
            cls = self.model(pixel_values=pixels).pooler_output.float()
            out.append(torch.nn.functional.normalize(cls, dim=-1).cpu().numpy())
        if not out:
            return np.zeros((0, int(self.model.config.hidden_size)), dtype=np.float32)
        return np.concatenate(out).astype(np.float32)
