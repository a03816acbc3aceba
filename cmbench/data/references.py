"""A task's reference frames: which frames of its context video, what identifies them, their pixels.

The reference frame is ``frame_index`` when annotated (and the frames are at the video's native
rate), else ``floor(timestamp_seconds * fps + 0.5)`` (:meth:`cmbench.data.task.Reference.frame_at`: the
frame OpenCV's millisecond seek aims at, as the authors' harness seeks).

:class:`TaskReferences` names each reference by content (the context file's SHA-256 and the frame
index, or the hash of the frame's pixels) and decodes the pixels only when a stage needs them: the
feature cache is keyed by those names, so a cached task, or a cached reference embedding with a
text-conditioned detector, never decodes its context video. When it does decode, it reads the video
sequentially up to the last reference and keeps only the referenced frames
(:func:`cmbench.data.video.read_frames_at`), so memory does not grow with the video's length.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from cmbench.data.task import Task
from cmbench.data.video import VideoError, probe_video, read_frames_at
from cmbench.errors import CMBenchError
from cmbench.hashing import array_hash, file_hash


class ReferenceFrameError(CMBenchError):
    """A task's reference points past the end of its context video."""


def reference_frames(task: Task, context_frames: np.ndarray, fps: float, native: bool = True) -> list[np.ndarray]:
    """The frame of every reference of ``task``, out of frames already in memory.

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


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """:func:`file_hash`, memoised per (path, size, modification time) within a process."""
    return file_hash(path)


def video_digest(path: str | Path) -> str:
    """SHA-256 of a video file's bytes (hashed once per process while the file is unchanged)."""
    stat = os.stat(path)
    return _file_digest(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


class TaskReferences:
    """The reference frames of one task, named by content and decoded at most once, on demand.

    Parameters
    ----------
    keys : sequence of str
        One content name per reference (what the feature cache keys reference features by).
    load : callable returning a list of ``uint8 [H, W, 3]``
        Produces the frames, one per key, when :meth:`frames` is first called.

    Attributes
    ----------
    decoded : bool
        Whether the frames were produced (a fully cached task never produces them).
    """

    def __init__(self, keys: Sequence[str], load: Callable[[], list[np.ndarray]]):
        if not keys:
            raise ValueError("a task needs at least one reference")
        self.keys = tuple(keys)
        self._load = load
        self._frames: list[np.ndarray] | None = None

    @property
    def decoded(self) -> bool:
        return self._frames is not None

    def frames(self) -> list[np.ndarray]:
        """The reference frames, ``uint8 [H, W, 3]`` each, in ``keys`` order."""
        if self._frames is None:
            frames = self._load()
            if len(frames) != len(self.keys):
                raise ValueError(f"expected {len(self.keys)} reference frames, got {len(frames)}")
            for frame in frames:
                if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
                    raise ValueError(f"reference frames must be uint8 [H, W, 3], got {frame.dtype} {frame.shape}")
            self._frames = list(frames)
        return self._frames

    @classmethod
    def from_arrays(cls, frames: Sequence[np.ndarray]) -> TaskReferences:
        """References already in memory, named by the hash of their pixels."""
        frames = [np.asarray(f) for f in frames]
        return cls([array_hash([f]) for f in frames], lambda: frames)

    @classmethod
    def from_video(cls, task: Task, video: str | Path | None = None) -> TaskReferences:
        """The references of ``task`` in its context video, named ``<file sha256>@<frame index>``.

        Only the file's header is read here; :meth:`frames` decodes sequentially up to the last
        reference and keeps the referenced frames only.

        Parameters
        ----------
        task : Task
        video : path, optional
            The context video (default ``task.video_path``), at its native frame rate.
        """
        path = Path(video) if video is not None else task.video_path
        _, fps, _, _ = probe_video(path)
        indices = [ref.frame_at(fps, native=True) for ref in task.references]
        digest = video_digest(path)

        def load() -> list[np.ndarray]:
            try:
                frames = read_frames_at(path, indices)
            except VideoError as err:
                last = max(range(len(indices)), key=indices.__getitem__)
                ref = task.references[last]
                raise ReferenceFrameError(
                    f"task {task.task_id}: reference {last} is frame {indices[last]} "
                    f"(t={ref.timestamp_seconds}s at {fps:g} fps): {err}"
                ) from err
            return [frames[i] for i in indices]

        return cls([f"{digest}@{i}" for i in indices], load)
