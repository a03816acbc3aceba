"""Read a MiniWorld task's lossless context and ground truth (the row's ``miniworld`` extension).

The mp4 context videos are lossy at 32x32 (about 5 / 255 mean absolute error), so code that feeds
MiniWorld contexts to a model should read the lossless frames with :func:`load_context`.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from cmbench import bounded_read
from cmbench.errors import CMBenchError
from cmbench.scoring.continuity import CameraPlan

EXTENSION = "miniworld"  # name of the extension field of every MiniWorld row


class MiniWorldDataError(CMBenchError):
    """A task lacks MiniWorld extension data, or a file it names is missing or outside the root."""


def extension(task: Any) -> dict[str, Any]:
    """The ``miniworld`` extension of a :class:`cmbench.data.Task` (raises if the row has none)."""
    ext = getattr(task, "extra", {}).get(EXTENSION)
    if not isinstance(ext, dict):
        raise MiniWorldDataError(f"task {getattr(task, 'task_id', '?')} has no '{EXTENSION}' extension (not a MiniWorld row)")
    return ext


def camera_plan(task: Any) -> CameraPlan | None:
    """The task's camera plan from its row (MiniWorld's ``context_camera_x``, ``continuation_camera_x`` and
    ``panorama_width``), or None when the row has none or a malformed one (the task is then not checked)."""
    try:
        ext = extension(task)
    except MiniWorldDataError:
        return None
    context, continuation, width = (ext.get(k) for k in ("context_camera_x", "continuation_camera_x",
                                                          "panorama_width"))
    if not (isinstance(context, list) and context and isinstance(continuation, list) and continuation
            and isinstance(width, int) and _whole(width) and width > 0
            and all(_whole(x) for x in [*context, *continuation])):
        return None
    return CameraPlan(int(context[-1]), np.asarray(continuation, dtype=np.int64), width)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def data_file(task: Any, key: str) -> Path:
    """The file the extension's ``key`` names, checked to be inside the dataset root and present."""
    ext = extension(task)
    if task.root is None:
        raise MiniWorldDataError(f"task {task.task_id} was not loaded from a dataset root")
    if key not in ext:
        raise MiniWorldDataError(f"task {task.task_id}: the '{EXTENSION}' extension has no '{key}' field")
    root = Path(task.root).resolve()
    path = (root / str(ext[key])).resolve()
    if not path.is_relative_to(root):
        raise MiniWorldDataError(f"task {task.task_id}: {EXTENSION}.{key} = {ext[key]!r} points outside the dataset root")
    if not path.exists():
        raise MiniWorldDataError(
            f"task {task.task_id}: {path} not found (rebuild with `python -m cmbench prepare data=miniworld`)"
        )
    try:  # a FIFO, a device or a directory is named for what it is, never opened by a reader that would hang
        os.close(bounded_read.open_regular(path))
    except (bounded_read.ReadLimitError, OSError) as err:
        raise MiniWorldDataError(f"task {task.task_id}: {err}") from None
    return path


def _read_npz(task: Any, key: str, fields: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """Arrays of the npz file named by the extension's ``key`` (all of them when ``fields`` is None)."""
    path = data_file(task, key)
    try:  # each array's declared shape x dtype is checked before it is decompressed
        return bounded_read.npz_arrays(path, fields)
    except bounded_read.ReadLimitError as err:
        raise MiniWorldDataError(f"task {task.task_id}: {err}") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise MiniWorldDataError(
            f"task {task.task_id}: cannot read {path} ({err}); rebuild with `python -m cmbench prepare data=miniworld`"
        ) from err


def load_context(task: Any) -> tuple[np.ndarray, np.ndarray]:
    """Lossless context of a task.

    Returns
    -------
    frames : ndarray, ``uint8 [F, 32, 32, 3]``
    camera_x : ndarray, ``int64 [F]``
    """
    data = _read_npz(task, "context_frames", ("frames", "camera_x"))
    return data["frames"], data["camera_x"]


def load_ground_truth(task: Any) -> dict[str, np.ndarray]:
    """True continuation of a task.

    Returns
    -------
    dict with ``frames`` ``uint8 [C, 32, 32, 3]``, ``camera_x`` ``int64 [C]``, ``target_boxes``
    ``float [C, 4]`` (normalised xyxy, NaN where the target is not visible), ``target_masks``
    ``bool [C, 32, 32]``, ``target_visible_fraction`` ``float [C]``, ``first_frame`` (int array,
    absolute index of the first continuation frame).
    """
    return _read_npz(task, "ground_truth")
