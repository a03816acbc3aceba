"""Ground-truth measures of a MiniWorld continuation (MiniWorld renders the true frames of every task)."""

from __future__ import annotations

import numpy as np
from skimage.metrics import structural_similarity

BOX_PAD = 2  # pixels around the target's box
WHOLE = 0.999  # a frame "shows the whole target" above this visible fraction


def target_region_similarity(generated: np.ndarray, truth: np.ndarray, masks: np.ndarray, visible: np.ndarray) -> float:
    """Mean SSIM over the frames showing the whole target, in its padded bounding box.

    Parameters
    ----------
    generated, truth : ndarray ``uint8 [F, H, W, 3]``
    masks : ndarray ``bool [F, H, W]``
        The target's true pixels in each frame.
    visible : ndarray ``float [F]``
        Fraction of the target's area inside each frame.

    Returns
    -------
    float in [0, 1]
    """
    frames = np.flatnonzero(visible >= WHOLE)
    if len(frames) == 0:
        raise ValueError("no continuation frame shows the whole target")
    h, w = masks.shape[1:]
    scores = []
    for f in frames:
        rows, cols = np.flatnonzero(masks[f].any(axis=1)), np.flatnonzero(masks[f].any(axis=0))
        r0, r1 = max(0, rows[0] - BOX_PAD), min(h, rows[-1] + 1 + BOX_PAD)
        c0, c1 = max(0, cols[0] - BOX_PAD), min(w, cols[-1] + 1 + BOX_PAD)
        ssim = structural_similarity(
            generated[f, r0:r1, c0:c1], truth[f, r0:r1, c0:c1], win_size=7, channel_axis=-1, data_range=255
        )
        scores.append(max(0.0, float(ssim)))
    return float(np.mean(scores))
