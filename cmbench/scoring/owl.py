"""Open-vocabulary detection with OWL-ViT (default) or OWLv2 through transformers.

Text queries are the task's target label and aliases, each put through ``query_template``. Per
frame the detector keeps the single best (patch, query) pair: its sigmoid score and its box.

Frames are preprocessed on the model's device by :mod:`cmbench.scoring.preprocess` with the settings
of the model folder's own image processor (OWL-ViT: antialiased bicubic resize to the square input;
OWLv2: pad to a square, Gaussian anti-aliasing, linear resize), matching the processor's output.
"""

from __future__ import annotations

import numpy as np
import torch

from cmbench.scoring.preprocess import ImageSpec, Owlv2Spec, frames_input
from cmbench.scoring.runtime import Runtime, load_pretrained, model_identity
from cmbench.scoring.stages import Detections, Target


def _cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """``[..., 4]`` centre/size boxes -> corner boxes."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)


class OwlVitDetector:
    """OWL-ViT: each frame is resized (without padding) to the model's square input.

    Parameters
    ----------
    model : str
        Hub id or local folder holding the model, its tokenizer and its image processor
        (``save_pretrained`` layout), e.g. ``google/owlvit-base-patch32``.
    runtime : Runtime
    query_template : str
        Format string turning a label into a text query (``"a photo of a {}"``).
    score_threshold : float
        A frame's best candidate counts as a detection when its sigmoid score is at least this.

    Attributes
    ----------
    image_processor
        The folder's transformers image processor (the reference the device preprocessing matches).
    spec : ImageSpec or Owlv2Spec
        The device preprocessing read from it.
    """

    model_class_name = "OwlViTForObjectDetection"
    processor_class_name = "OwlViTProcessor"
    spec_class: type[ImageSpec] | type[Owlv2Spec] = ImageSpec
    needs_reference_views = False  # conditioned on text only

    def __init__(
        self,
        model: str,
        runtime: Runtime,
        query_template: str = "a photo of a {}",
        score_threshold: float = 0.1,
    ):
        import transformers

        if "{}" not in query_template:
            raise ValueError(f"query_template must contain '{{}}', got {query_template!r}")
        self.runtime = runtime
        self.query_template = query_template
        self.score_threshold = float(score_threshold)
        model_cls = getattr(transformers, self.model_class_name)
        processor_cls = getattr(transformers, self.processor_class_name)
        self.model = load_pretrained(model_cls, model, "detector").to(runtime.device).eval()
        processor = load_pretrained(processor_cls, model, "detector processor")
        self.tokenizer = processor.tokenizer
        self.image_processor = processor.image_processor
        self.spec = self.spec_class.from_processor(self.image_processor, model)
        self.max_text_length = int(self.model.config.text_config.max_position_embeddings)
        self._identity = model_identity(model, self.model)

    def identity(self) -> dict[str, str]:
        """Content identity of the model, tokenizer and processor (see :func:`model_identity`)."""
        return self._identity

    def _tokenize(self, queries: tuple[str, ...]) -> dict[str, torch.Tensor]:
        texts = [self.query_template.format(q) for q in queries]
        tokens = self.tokenizer(
            texts, padding="max_length", truncation=True, max_length=self.max_text_length, return_tensors="pt"
        )
        return {k: tokens[k].to(self.runtime.device) for k in ("input_ids", "attention_mask")}

    def _box_scale(self, height: int, width: int) -> torch.Tensor:
        """Normalised model boxes -> pixels: OWL-ViT boxes are relative to the (unpadded) frame."""
        return torch.tensor([width, height, width, height], dtype=torch.float64)

    def preprocess(self, frames: np.ndarray) -> torch.Tensor:
        """Model input of a batch of frames.

        Parameters
        ----------
        frames : ndarray, ``uint8 [B, H, W, 3]``

        Returns
        -------
        Tensor, ``float32 [B, 3, h, w]`` on the model's device
        """
        return frames_input(self.spec, frames, self.runtime.device)

    @torch.inference_mode()
    def detect(self, frames: np.ndarray, target: Target) -> Detections:
        """Best candidate per frame.

        Parameters
        ----------
        frames : ndarray, ``uint8 [F, H, W, 3]``
        target : Target
            Only ``target.queries`` is used.

        Returns
        -------
        Detections with pixel boxes ``[F, 4]`` and sigmoid scores ``[F]``.
        """
        n_frames, height, width = frames.shape[:3]
        tokens = self._tokenize(target.queries)
        n_queries = tokens["input_ids"].shape[0]
        boxes = np.full((n_frames, 4), np.nan)
        scores = np.full(n_frames, np.nan)
        scale = self._box_scale(height, width)
        for start in range(0, n_frames, self.runtime.batch_size):
            batch = frames[start : start + self.runtime.batch_size]
            pixels = self.preprocess(batch)
            with self.runtime.autocast():
                out = self.model(
                    input_ids=tokens["input_ids"].repeat(len(batch), 1),
                    attention_mask=tokens["attention_mask"].repeat(len(batch), 1),
                    pixel_values=pixels,
                )
            logits = out.logits.float()[..., :n_queries]  # [B, P, Q]
            best = torch.sigmoid(logits).amax(dim=-1)  # [B, P]
            patch = best.argmax(dim=-1)  # [B]
            rows = torch.arange(len(batch), device=patch.device)
            chosen = _cxcywh_to_xyxy(out.pred_boxes.float()[rows, patch]).double().cpu() * scale
            boxes[start : start + len(batch)] = chosen.numpy()
            scores[start : start + len(batch)] = best[rows, patch].double().cpu().numpy()
        found = np.nan_to_num(scores, nan=-np.inf) >= self.score_threshold
        return Detections(boxes=boxes, scores=scores, found=found)


class Owlv2Detector(OwlVitDetector):
    """OWLv2: frames are padded (bottom / right) to a square before resizing, so model boxes are
    relative to the padded square of side ``max(H, W)``."""

    model_class_name = "Owlv2ForObjectDetection"
    processor_class_name = "Owlv2Processor"
    spec_class = Owlv2Spec

    def _box_scale(self, height: int, width: int) -> torch.Tensor:
        side = max(height, width)
        return torch.tensor([side, side, side, side], dtype=torch.float64)
