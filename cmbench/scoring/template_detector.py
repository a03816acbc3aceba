"""Light CPU detector: find the reference's appearance by masked template matching.

The template is the reference's masked crop (the segmenter's mask inside the annotated box), scaled by
the ratio of frame sizes (times each of ``scales``). Each frame is searched with OpenCV's masked
normalised cross-correlation (``TM_CCOEFF_NORMED``: mean-removed, so invariant to a uniform change of
brightness and contrast); the best location over references and scales is the frame's candidate and
its correlation in [-1, 1] is the detector score. Frames and templates are blurred by
``smooth_sigma`` first, so a sharp reference still matches a soft generated frame.

Unlike OWL-ViT this detector is not told the category: it is conditioned on the reference's look, so
it finds a same-category distractor only as far as the distractor resembles the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from cmbench.scoring.boxes import mask_bbox
from cmbench.scoring.stages import Detections, Target


class TemplateDetector:
    """Masked template matching against the reference views.

    Parameters
    ----------
    score_threshold : float
        Minimum correlation (in [-1, 1]) for a detection.
    scales : sequence of float
        Template scale factors tried on top of the frame-size ratio (1.0: same apparent size).
    smooth_sigma : float
        Gaussian blur (pixels) of frames and reference before matching; 0 disables it.
    """

    needs_reference_views = True  # the templates are the references' masked crops

    def __init__(self, score_threshold: float = 0.5, scales: Sequence[float] = (1.0,), smooth_sigma: float = 0.0):
        if not -1.0 <= score_threshold <= 1.0:
            raise ValueError(f"score_threshold is a correlation in [-1, 1], got {score_threshold}")
        if not scales or any(s <= 0 for s in scales):
            raise ValueError(f"scales must be positive, got {list(scales)}")
        self.score_threshold = float(score_threshold)
        self.scales = tuple(float(s) for s in scales)
        self.smooth_sigma = float(smooth_sigma)

    def _smooth(self, image: np.ndarray) -> np.ndarray:
        if self.smooth_sigma <= 0:
            return image
        return cv2.GaussianBlur(image, (0, 0), self.smooth_sigma, borderType=cv2.BORDER_REFLECT)

    def _templates(self, target: Target, height: int, width: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Masked reference crops resized for frames of ``height x width``.

        Returns
        -------
        list of (template ``float32 [h, w, 3]``, mask ``float32 [h, w]``), one per reference and scale
        """
        templates = []
        for view in target.references:
            box = mask_bbox(view.mask)
            if box is None:
                raise ValueError("cannot match a template of an empty reference mask")
            x0, y0, x1, y1 = box
            crop = self._smooth(view.frame.astype(np.float32))[y0:y1, x0:x1]
            mask = view.mask[y0:y1, x0:x1].astype(np.float32)
            ref_h, ref_w = view.frame.shape[:2]
            for scale in self.scales:
                w = max(2, int(round((x1 - x0) * width / ref_w * scale)))
                h = max(2, int(round((y1 - y0) * height / ref_h * scale)))
                if h > height or w > width:
                    continue
                templates.append(
                    (
                        cv2.resize(crop, (w, h), interpolation=cv2.INTER_AREA),
                        (cv2.resize(mask, (w, h), interpolation=cv2.INTER_NEAREST) > 0.5).astype(np.float32),
                    )
                )
        return templates

    def detect(self, frames: np.ndarray, target: Target) -> Detections:
        """Best match per frame.

        Parameters
        ----------
        frames : ndarray, ``uint8 [F, H, W, 3]``
        target : Target
            Only ``target.references`` is used.

        Returns
        -------
        Detections with pixel boxes ``[F, 4]`` and correlations ``[F]`` (NaN when no template fits).
        """
        n_frames, height, width = frames.shape[:3]
        templates = self._templates(target, height, width)
        boxes = np.full((n_frames, 4), np.nan)
        scores = np.full(n_frames, np.nan)
        for i, frame in enumerate(frames.astype(np.float32)):
            frame = self._smooth(frame)
            for template, mask in templates:
                response = cv2.matchTemplate(frame, template, cv2.TM_CCOEFF_NORMED, mask=mask)
                response = np.nan_to_num(response, nan=-1.0, posinf=-1.0, neginf=-1.0)  # flat windows
                y, x = np.unravel_index(int(np.argmax(response)), response.shape)
                if not response[y, x] <= scores[i]:  # also replaces NaN
                    scores[i] = float(response[y, x])
                    boxes[i] = (x, y, x + template.shape[1], y + template.shape[0])
        found = np.nan_to_num(scores, nan=-np.inf) >= self.score_threshold
        return Detections(boxes=boxes, scores=scores, found=found)
