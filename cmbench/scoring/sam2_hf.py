"""SAM 2 box-prompted segmentation through transformers' ``Sam2Model``.

Preprocessing is ``Sam2ImageProcessor``'s (which needs torchvision, so it is reproduced on the
model's device by :mod:`cmbench.scoring.preprocess`): resize each frame to the model's square input
(``prompt_encoder_config.image_size``, 1024 for the released models) with antialiased bilinear
filtering, without keeping the aspect ratio; scale to [0, 1] and normalise with ImageNet mean / std;
scale the box prompt by the same per-axis factors (``Sam2Processor``). The low-resolution mask logits
are upsampled bilinearly (``align_corners=False``) to the frame size and thresholded
(``Sam2Processor.post_process_masks``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from cmbench.scoring.preprocess import ImageSpec, frames_input
from cmbench.scoring.runtime import Runtime, load_pretrained, model_identity


class Sam2Segmenter:
    """SAM 2 (transformers) with one box prompt per frame and a single output mask.

    Parameters
    ----------
    model : str
        Hub id (e.g. ``facebook/sam2.1-hiera-large``) or local ``save_pretrained`` folder.
    runtime : Runtime
    mask_threshold : float
        Logit threshold of the upsampled mask (0 = probability 0.5).
    """

    def __init__(self, model: str, runtime: Runtime, mask_threshold: float = 0.0):
        from transformers import Sam2Model

        self.runtime = runtime
        self.mask_threshold = float(mask_threshold)
        self.model = load_pretrained(Sam2Model, model, "segmenter").to(runtime.device).eval()
        self.input_size = int(self.model.config.prompt_encoder_config.image_size)
        self.spec = ImageSpec.sam2(self.input_size)
        self._identity = model_identity(model, self.model)

    def identity(self) -> dict[str, str]:
        """Content identity of the model (see :func:`model_identity`)."""
        return self._identity

    def preprocess(self, frames: np.ndarray | Sequence[np.ndarray]) -> torch.Tensor:
        """Model input of frames: one batched pass for an array, frame by frame for a sequence
        (whose frames may differ in size).

        Parameters
        ----------
        frames : ``uint8 [N, H, W, 3]`` array, or a sequence of ``uint8 [H_i, W_i, 3]``

        Returns
        -------
        Tensor, ``float32 [N, 3, S, S]`` on the model's device (S = the model's input size)
        """
        return frames_input(self.spec, frames, self.runtime.device)

    @torch.inference_mode()
    def segment(self, frames: np.ndarray | Sequence[np.ndarray], boxes: np.ndarray) -> list[np.ndarray]:
        """Masks of the object in each box.

        Parameters
        ----------
        frames : ``uint8 [N, H, W, 3]`` array (preprocessed a batch at a time), or a sequence of
            ``uint8 [H_i, W_i, 3]`` (sizes may differ; preprocessed frame by frame)
        boxes : ndarray, ``float [N, 4]`` pixel boxes, one per frame

        Returns
        -------
        list of ``bool [H_i, W_i]`` (may be empty masks; the pipeline decides what that means)
        """
        size = self.input_size
        masks: list[np.ndarray] = []
        for start in range(0, len(frames), self.runtime.batch_size):
            batch = frames[start : start + self.runtime.batch_size]
            batch_boxes = np.asarray(boxes[start : start + len(batch)], dtype=np.float64)
            scales = np.array([[size / f.shape[1], size / f.shape[0]] * 2 for f in batch])
            prompts = torch.from_numpy(batch_boxes * scales).float()[:, None, :]  # [B, 1, 4]
            pixels = self.preprocess(batch)
            with self.runtime.autocast():
                out = self.model(pixel_values=pixels, input_boxes=prompts.to(self.runtime.device), multimask_output=False)
            low_res = out.pred_masks[:, 0, :1].float()  # [B, 1, h, w]
            for logits, frame in zip(low_res, batch):
                full = F.interpolate(logits[None], size=frame.shape[:2], mode="bilinear", align_corners=False)
                masks.append((full[0, 0] > self.mask_threshold).cpu().numpy())
        return masks
