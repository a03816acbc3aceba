"""The frame-count rule: which frames of a continuation are scored, for ``score`` and ``run`` alike.

A task defines how many frames its continuation has (``score``: the dataset's continuation length,
``data.continuation_frames`` for MiniWorld; ``run``: the frames the run generated). The score is each
reference's best similarity over frames, so every extra frame is one more chance at a high similarity:
frames appended to a continuation (another method's, say) would raise its score. Hence:

- only the first ``defined`` frames are scored; frames after them are counted, never scored;
- a continuation with fewer frames is not scored at all (:class:`TooFewFrames`): its task is recorded
  as failed, as if the video were missing (never padded, which would invent frames);
- a dataset that does not define the length (``None``) has every frame scored.

The record says how many frames came (``frames_received``) and how many were scored (``n_frames``);
a record where they differ is flagged on the leaderboard and in the report (:func:`flagged`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np


class TooFewFrames(ValueError):
    """A continuation shorter than its task defines: not scored (recorded as a failed task).

    Attributes
    ----------
    received, defined : int
    """

    def __init__(self, received: int, defined: int):
        super().__init__(f"{received} frame(s), the task defines {defined}: a short continuation is scored as "
                         f"missing, not padded")
        self.received = received
        self.defined = defined


class _Batches(Protocol):
    def batches(self, size: int) -> Iterator[np.ndarray]:
        ...


def flagged(received: int | None, scored: int | None) -> bool:
    """Whether a record's continuation had another frame count than the frames scored (extra frames
    left unscored, or too few and nothing scored); False for records that do not say (older ones)."""
    return received is not None and scored is not None and int(received) != int(scored)


class CountedFrames:
    """A continuation's frames cut to the count its task defines, counting every frame that came.

    Parameters
    ----------
    frames : array-like ``uint8 [F, H, W, 3]``, or an object with ``batches(size)`` (a streamed video)
    defined : int or None
        The frames the task defines (None: every frame is scored).

    Attributes
    ----------
    frames : ndarray ``uint8 [min(F, defined), H, W, 3]``, or a streamed source of the first ``defined``
        frames: what the scorer reads.
    received : int or None
        Frames the continuation had: known at once for an array, after a whole pass for a stream
        (each pass reads the rest of the video to count it, scoring none of it).

    Raises
    ------
    TooFewFrames
        An array with fewer than ``defined`` frames (at once), or a stream (at the end of its pass).
    """

    def __init__(self, frames: np.ndarray | _Batches, defined: int | None):
        if defined is not None and int(defined) < 1:
            raise ValueError(f"a task defines at least 1 frame, got {defined}")
        self.defined = None if defined is None else int(defined)
        self.received: int | None = None
        if not hasattr(frames, "batches"):
            frames = np.asarray(frames)
        self._source = frames
        if isinstance(frames, np.ndarray):
            self.received = len(frames)
            self._check(self.received)
            self.frames: np.ndarray | CountedFrames = frames if self.defined is None else frames[: self.defined]
        else:
            self.frames = self

    def _check(self, received: int) -> None:
        if self.defined is not None and received < self.defined:
            raise TooFewFrames(received, self.defined)

    def batches(self, size: int) -> Iterator[np.ndarray]:
        """The first ``defined`` frames in batches of at most ``size`` (``uint8 [B, H, W, 3]``); the
        frames after them are read and counted only."""
        assert not isinstance(self._source, np.ndarray)
        count = 0
        for batch in self._source.batches(size):
            keep = len(batch) if self.defined is None else min(len(batch), max(0, self.defined - count))
            count += len(batch)
            if keep:
                yield batch[:keep]
            del batch  # not held while the source reads the next batch: one batch alive at a time
        self.received = count
        self._check(count)
