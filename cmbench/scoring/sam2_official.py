"""Optional backend: Meta's official ``sam2`` package (``SAM2ImagePredictor``).

The package needs a working torchvision (see docs/scoring.md for the install line); it is imported
only when this backend is chosen, and a clear error says how to install it when it is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch

from cmbench.scoring.errors import BackendUnavailableError, ScorerConfigError
from cmbench.scoring.runtime import Runtime

INSTALL_HINT = (
    "the official SAM 2 backend needs the `sam2` package and a working torchvision: "
    "pip install --no-build-isolation sam2==1.1.0 (after torch and setuptools). "
    "Or use the transformers backend: scorer.segmenter.backend=sam2"
)


def _import_sam2():
    try:
        from sam2.build_sam import build_sam2, build_sam2_hf
        from sam2.sam2_image_predictor import SAM2ImagePredictor
    except ImportError as err:  # the package or its torchvision dependency is missing / broken
        raise BackendUnavailableError(f"{INSTALL_HINT} ({err})") from err
    return build_sam2, build_sam2_hf, SAM2ImagePredictor


class OfficialSam2Segmenter:
    """SAM 2 through ``sam2.sam2_image_predictor.SAM2ImagePredictor``, one box per frame.

    Parameters
    ----------
    runtime : Runtime
    model : str, optional
        Hub id for ``sam2.build_sam.build_sam2_hf`` (e.g. ``facebook/sam2.1-hiera-large``).
    checkpoint, model_cfg : str, optional
        A local checkpoint and its Hydra config name for ``build_sam2`` (used instead of ``model``).
    mask_threshold : float
        Logit threshold passed to the predictor.
    """

    def __init__(
        self,
        runtime: Runtime,
        model: str | None = None,
        checkpoint: str | None = None,
        model_cfg: str | None = None,
        mask_threshold: float = 0.0,
    ):
        if (model is None) == (checkpoint is None):
            raise ScorerConfigError("sam2_official needs exactly one of `model` (hub id) or `checkpoint` (+ `model_cfg`)")
        if checkpoint is not None and model_cfg is None:
            raise ScorerConfigError(
                "sam2_official with `checkpoint` also needs `model_cfg` (e.g. configs/sam2.1/sam2.1_hiera_l.yaml)"
            )
        build_sam2, build_sam2_hf, predictor_cls = _import_sam2()
        self.runtime = runtime
        if model is not None:
            sam = build_sam2_hf(model, device=str(runtime.device))
        else:
            sam = build_sam2(model_cfg, checkpoint, device=str(runtime.device))
        self.predictor = predictor_cls(sam, mask_threshold=mask_threshold)

    @torch.inference_mode()
    def segment(self, frames: np.ndarray | Sequence[np.ndarray], boxes: np.ndarray) -> list[np.ndarray]:
        """Masks ``bool [H_i, W_i]`` for frames ``uint8 [H_i, W_i, 3]`` and pixel boxes ``[N, 4]``."""
        masks = []
        half = self.runtime.precision == "fp16"
        with torch.autocast("cuda", dtype=torch.float16) if half else contextlib.nullcontext():
            for frame, box in zip(frames, np.asarray(boxes, dtype=np.float32)):
                self.predictor.set_image(frame)
                predicted, _, _ = self.predictor.predict(box=box, multimask_output=False)
                masks.append(np.asarray(predicted[0]).astype(bool))
        return masks
