"""SAM 2 box-prompted segmentation through transformers' ``Sam2Model``.

Our own preprocessing replaces ``Sam2Processor`` (which needs torchvision): resize each frame to the
model's square input (``prompt_encoder_config.image_size``, 1024 for the released models) without
keeping the aspect ratio, scale to [0, 1], normalise with ImageNet mean/std, scale the box prompt by
the same per-axis factors, and upsample the low-resolution mask logits bilinearly to the frame size.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from cmbench.scoring.imagenet import imagenet_normalize
from cmbench.scoring.runtime import Runtime, load_pretrained

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
        self.model = load_pretrained(Sam2Model, model, "segmenter").to(runtime.device, runtime.dtype).eval()
        self.input_size = int(self.model.config.prompt_encoder_config.image_size)

    @torch.inference_mode()
    def segment(self, frames: Sequence[np.ndarray], boxes: np.ndarray) -> list[np.ndarray]:
        """Masks of the object in each box.

        Parameters
        ----------
        frames : sequence of ``uint8 [H_i, W_i, 3]`` (sizes may differ)
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
            pixels = np.stack(
                [imagenet_normalize(cv2.resize(f, (size, size), interpolation=cv2.INTER_LINEAR)) for f in batch]
            )
            scales = np.array([[size / f.shape[1], size / f.shape[0]] * 2 for f in batch])
            prompts = torch.from_numpy(batch_boxes * scales).float()[:, None, :]  # [B, 1, 4]
            out = self.model(
                pixel_values=torch.from_numpy(pixels).to(self.runtime.device, self.runtime.dtype),
                input_boxes=prompts.to(self.runtime.device, self.runtime.dtype),
                multimask_output=False,
            )
            low_res = out.pred_masks[:, 0, 0].float()  # [B, h, w]
            for logits, frame in zip(low_res, batch):
                full = F.interpolate(logits[None, None], size=frame.shape[:2], mode="bilinear", align_corners=False)
                masks.append((full[0, 0] > self.mask_threshold).cpu().numpy())
        return masks
