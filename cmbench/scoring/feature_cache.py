"""On-disk cache of per-frame scorer features, so rescoring a video is cheap.

An entry is keyed by (video content hash, scorer config hash, target hash): the target hash covers
what the stages condition on (text queries, reference frames and boxes). It stores the reference
embeddings and, per generated frame, the chosen box, detector score, detection flag and embedding;
similarities and the task score are recomputed from them. Layout::

    <root>/<config_hash>/<video_hash[:2]>/<video_hash>_<target_hash>.npz

Writes go to a temporary file and are renamed into place, so concurrent scorers never read a
half-written entry.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class FrameFeatures:
    """What the scorer's stages produced for one video and one target.

    Attributes
    ----------
    reference_embeddings : ndarray, ``float32 [R, D]``
    reference_mask_fallback : ndarray, ``bool [R]``
        True where the segmenter returned an empty reference mask and the annotated box was used.
    boxes : ndarray, ``float64 [F, 4]``
        Clipped pixel box of each frame's best candidate (NaN without a candidate).
    scores : ndarray, ``float64 [F]``
        Detector score of that candidate (NaN without one).
    detected : ndarray, ``bool [F]``
        Detection above threshold, with a box of at least the minimum size and a non-empty mask.
    embeddings : ndarray, ``float32 [F, D]``
        Unit-norm embedding of the frame's masked crop (zeros where not detected).
    frame_size : ndarray, ``int64 [2]``
        ``(H, W)`` of the generated frames.
    """

    reference_embeddings: np.ndarray
    reference_mask_fallback: np.ndarray
    boxes: np.ndarray
    scores: np.ndarray
    detected: np.ndarray
    embeddings: np.ndarray
    frame_size: np.ndarray


class FeatureCache:
    """Directory of :class:`FrameFeatures` entries for one scorer config.

    Parameters
    ----------
    root : str or Path
        Cache folder (created on first write).
    config_hash : str
        The scorer's :func:`cmbench.scoring.registry.scorer_hash`.
    """

    def __init__(self, root: str | Path, config_hash: str):
        self.folder = Path(root) / config_hash

    def path(self, video_hash: str, target_hash: str) -> Path:
        """File of one entry."""
        return self.folder / video_hash[:2] / f"{video_hash}_{target_hash}.npz"

    def load(self, video_hash: str, target_hash: str) -> FrameFeatures | None:
        """The entry, or None when absent or unreadable: an empty, truncated or garbage file (left by a
        full disk or a crash) is a miss, recomputed and overwritten by :meth:`store`."""
        path = self.path(video_hash, target_hash)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                return FrameFeatures(**{f.name: data[f.name] for f in fields(FrameFeatures)})
        except Exception:  # EOFError, zipfile.BadZipFile, ValueError, KeyError, OSError, ...
            return None

    def store(self, video_hash: str, target_hash: str, features: FrameFeatures) -> Path:
        """Write an entry atomically; returns its path."""
        path = self.path(video_hash, target_hash)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                np.savez(handle, **{f.name: getattr(features, f.name) for f in fields(FrameFeatures)})
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path
