"""Pick the annotated reference frames of a task out of its context video."""

from __future__ import annotations

import numpy as np

from cmbench.data import Task
from cmbench.errors import CMBenchError


class ReferenceFrameError(CMBenchError):
    """A task's reference points past the end of its context video."""


def reference_frames(task: Task, context_frames: np.ndarray, fps: float, native: bool = True) -> list[np.ndarray]:
    """The frame of every reference of ``task``.

    The reference frame is ``frame_index`` when annotated (and the frames are at the video's native
    rate), else ``round(timestamp_seconds * fps)``.

    Parameters
    ----------
    task : Task
    context_frames : ndarray, ``uint8 [F, H, W, 3]``
        The context video.
    fps : float
        Frame rate of ``context_frames``.
    native : bool
        False when ``context_frames`` were resampled (then annotated frame indices no longer apply
        and timestamps are used).

    Returns
    -------
    list of ``uint8 [H, W, 3]``, one per ``task.references``.
    """
    frames = []
    for i, ref in enumerate(task.references):
        index = ref.frame_at(fps, native=native)
        if not 0 <= index < len(context_frames):
            raise ReferenceFrameError(
                f"task {task.task_id}: reference {i} is frame {index} "
                f"(t={ref.timestamp_seconds}s at {fps:g} fps) but the context video has {len(context_frames)} frames"
            )
        frames.append(context_frames[index])
    return frames
