"""DINOv2 embeddings of masked crops: CLS token after the final LayerNorm (``pooler_output``).

The crop is the mask's tight box with the pixels outside the mask set to ``background``. Two ways
to turn it into the model's input (``crop_mode``):

- ``processor`` (default; the authors' processing): the model folder's own image processor
  (``BitImageProcessor`` for ``facebook/dinov2-*``: bicubic resize of the shorter side to 256,
  centre crop 224, ImageNet mean / std) applied to the crop. A crop much wider than high loses its
  sides to the centre crop.
- ``pad_square``: the crop padded to a centred square with ``background`` (the whole object stays
  in view), resized to ``image_size`` (antialiased bicubic) and ImageNet-normalised.

Both run on the model's device (:mod:`cmbench.scoring.preprocess`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from cmbench.scoring.imagenet import IMAGENET_MEAN, IMAGENET_STD
from cmbench.scoring.preprocess import ImageSpec, masked_crops_input
from cmbench.scoring.runtime import Runtime, load_pretrained, model_identity

CROP_MODES = ("processor", "pad_square")


class Dinov2Embedder:
    """DINOv2 (any size) through transformers' ``Dinov2Model``.

    Parameters
    ----------
    model : str
        Hub id (``facebook/dinov2-small`` / ``-base`` / ``-large`` / ``-giant``) or local folder.
    runtime : Runtime
    crop_mode : {"processor", "pad_square"}
        How a masked crop becomes the model's input (module docstring).
    image_size : int, optional
        ``pad_square`` only: the input side, a multiple of the patch size (default 224). The
        ``processor`` mode takes its sizes from the model's image processor.
    background : int
        Fill value (0..255) of the pixels outside the mask (and of the padding).
    """

    def __init__(
        self,
        model: str,
        runtime: Runtime,
        crop_mode: str = "processor",
        image_size: int | None = None,
        background: int = 0,
    ):
        from transformers import AutoImageProcessor, Dinov2Model

        if crop_mode not in CROP_MODES:
            raise ValueError(f"embedder crop_mode must be one of {', '.join(CROP_MODES)}, got {crop_mode!r}")
        if not 0 <= background <= 255:
            raise ValueError(f"embedder background must be in 0..255, got {background}")
        self.runtime = runtime
        self.crop_mode = crop_mode
        self.background = int(background)
        self.model = load_pretrained(Dinov2Model, model, "embedder").to(runtime.device).eval()
        patch = int(self.model.config.patch_size)
        if crop_mode == "processor":
            if image_size is not None:
                raise ValueError(
                    "embedder image_size applies to crop_mode=pad_square; crop_mode=processor takes its sizes "
                    "from the model's image processor (preprocessor_config.json)"
                )
            self.image_processor = load_pretrained(AutoImageProcessor, model, "embedder image processor")
            self.spec = ImageSpec.from_processor(self.image_processor, model)
            if self.spec.crop is None:
                raise ValueError(f"{model}: the DINOv2 image processor has no centre crop (do_center_crop is false)")
            sides = self.spec.crop
        else:
            side = 224 if image_size is None else int(image_size)
            self.spec = ImageSpec(size=(side, side), shortest_edge=None, resample="bicubic", crop=None,
                                  mean=IMAGENET_MEAN, std=IMAGENET_STD)
            sides = (side, side)
        if any(s % patch for s in sides):
            raise ValueError(f"embedder input {sides[0]}x{sides[1]} must be a multiple of the patch size {patch}")
        self._identity = model_identity(model, self.model)

    def identity(self) -> dict[str, str]:
        """Content identity of the model and its image processor (see :func:`model_identity`)."""
        return self._identity

    def preprocess(self, crops: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> torch.Tensor:
        """Model input of masked crops.

        Parameters
        ----------
        crops : sequence of ``uint8 [h_i, w_i, 3]``
        masks : sequence of ``bool [h_i, w_i]``

        Returns
        -------
        Tensor, ``float32 [N, 3, s, s]`` on the model's device
        """
        return masked_crops_input(self.spec, crops, masks, self.background, self.crop_mode == "pad_square", self.runtime.device)

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
            pixels = self.preprocess(crops[start : start + step], masks[start : start + step])
            with self.runtime.autocast():
                cls = self.model(pixel_values=pixels).pooler_output.float()
            out.append(torch.nn.functional.normalize(cls, dim=-1).cpu().numpy())
        if not out:
            return np.zeros((0, int(self.model.config.hidden_size)), dtype=np.float32)
        return np.concatenate(out).astype(np.float32)
