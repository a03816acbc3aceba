"""On-disk cache of scorer features, so rescoring a video is cheap.

Two kinds of entries, both under one scorer identity: the scorer config hash (every knob that changes
a number) and the models hash (the content of the weight, config and processor files, or the hub
commits, and the transformers version: replacing the weights in a folder is a new identity).

- **task entries**, keyed by (generated video content hash, target hash): the reference embeddings
  and, per generated frame, the chosen box, detector score, detection flag and embedding. The target
  hash covers what the stages condition on: text queries, the references' content names (context
  file hash and frame index, or pixel hash) and their boxes. Similarities and the task score are
  recomputed from an entry.
- **reference entries**, keyed by (reference content name, box): the reference's embedding and
  whether its mask fell back to the box. Scoring another video for the same task reuses them without
  decoding the context video (when the detector is conditioned on text only).

Layout::

    <root>/<config_hash>/<models_hash>/<video_hash[:2]>/<video_hash>_<target_hash>.npz
    <root>/references/<config_hash>/<models_hash>/<key[:2]>/<key>.npz

Writes go to a temporary file and are renamed into place, so concurrent scorers never read a
half-written entry; an unreadable entry is a miss.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

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


@dataclass(frozen=True)
class ReferenceFeatures:
    """One reference's embedding.

    Attributes
    ----------
    embedding : ndarray, ``float32 [D]``
    mask_fallback : ndarray, ``bool []``
        True when its segmentation was empty and the annotated box was the mask.
    """

    embedding: np.ndarray
    mask_fallback: np.ndarray


Entry = TypeVar("Entry", FrameFeatures, ReferenceFeatures)


def _load(path: Path, kind: type[Entry]) -> Entry | None:
    """An entry, or None when absent or unreadable: an empty, truncated or garbage file (left by a full
    disk or a crash) is a miss, recomputed and overwritten by the next store."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return kind(**{f.name: data[f.name] for f in fields(kind)})
    except Exception:  # EOFError, zipfile.BadZipFile, ValueError, KeyError, OSError, ...
        return None


def _store(path: Path, entry: FrameFeatures | ReferenceFeatures) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **{f.name: getattr(entry, f.name) for f in fields(entry)})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class FeatureCache:
    """Directory of task and reference entries for one scorer identity.

    Parameters
    ----------
    root : str or Path
        Cache folder (created on first write).
    config_hash : str
        The scorer's :func:`cmbench.scoring.registry.scorer_hash`.
    models_hash : str
        The scorer's :attr:`cmbench.scoring.pipeline.Scorer.models_hash`.
    """

    def __init__(self, root: str | Path, config_hash: str, models_hash: str):
        self.folder = Path(root) / config_hash / models_hash
        self.reference_folder = Path(root) / "references" / config_hash / models_hash

    def path(self, video_hash: str, target_hash: str) -> Path:
        """File of one task entry."""
        return self.folder / video_hash[:2] / f"{video_hash}_{target_hash}.npz"

    def reference_path(self, key: str) -> Path:
        """File of one reference entry."""
        return self.reference_folder / key[:2] / f"{key}.npz"

    def load(self, video_hash: str, target_hash: str) -> FrameFeatures | None:
        """The task entry, or None when absent or unreadable (a corrupt entry is treated as a miss)."""
        return _load(self.path(video_hash, target_hash), FrameFeatures)

    def store(self, video_hash: str, target_hash: str, features: FrameFeatures) -> Path:
        """Write a task entry atomically; returns its path."""
        return _store(self.path(video_hash, target_hash), features)

    def load_reference(self, key: str) -> ReferenceFeatures | None:
        """The reference entry, or None when absent or unreadable."""
        return _load(self.reference_path(key), ReferenceFeatures)

    def store_reference(self, key: str, features: ReferenceFeatures) -> Path:
        """Write a reference entry atomically; returns its path."""
        return _store(self.reference_path(key), features)
