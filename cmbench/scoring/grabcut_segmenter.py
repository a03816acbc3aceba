"""Light CPU segmenter: GrabCut initialised with the box prompt.

OpenCV's GrabCut fits colour mixtures to the pixels outside the box (background) and inside it
(probable foreground) and cuts the box along colour edges. The random k-means initialisation of
OpenCV's global generator is seeded before every call, so results are deterministic. A box that
leaves no background pixels in the frame (it covers the whole frame) cannot be cut and returns the
box itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from cmbench.scoring.boxes import box_mask, box_pixel_slices


class GrabCutSegmenter:
    """GrabCut per box.

    Parameters
    ----------
    iterations : int
        GrabCut iterations.
    seed : int
        Seed of OpenCV's random generator before each cut.
    """

    def __init__(self, iterations: int = 3, seed: int = 0):
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        self.iterations = int(iterations)
        self.seed = int(seed)

    def segment(self, frames: np.ndarray | Sequence[np.ndarray], boxes: np.ndarray) -> list[np.ndarray]:
        """Masks of the object in each box.

        Parameters
        ----------
        frames : sequence of ``uint8 [H_i, W_i, 3]`` (or an array ``uint8 [N, H, W, 3]``)
        boxes : ndarray, ``float [N, 4]`` pixel boxes

        Returns
        -------
        list of ``bool [H_i, W_i]``, all inside their box (empty for an empty box)
        """
        masks = []
        for frame, box in zip(frames, np.asarray(boxes, dtype=np.float64)):
            height, width = frame.shape[:2]
            rows, cols = box_pixel_slices(box, height, width)
            if rows.stop - rows.start < 1 or cols.stop - cols.start < 1:
                masks.append(np.zeros((height, width), dtype=bool))
                continue
            inside = box_mask(box, height, width)
            if inside.all():
                masks.append(inside)
                continue
            labels = np.zeros((height, width), dtype=np.uint8)
            rect = (cols.start, rows.start, cols.stop - cols.start, rows.stop - rows.start)
            cv2.setRNGSeed(self.seed)
            cv2.grabCut(
                np.ascontiguousarray(frame), labels, rect, np.zeros((1, 65)), np.zeros((1, 65)),
                self.iterations, cv2.GC_INIT_WITH_RECT,
            )
            masks.append(((labels == cv2.GC_FGD) | (labels == cv2.GC_PR_FGD)) & inside)
        return masks
