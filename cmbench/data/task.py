"""Typed records of the official CMBench ``metadata.jsonl`` schema.

One manifest row is one task. The official fields (paper.md) map onto :class:`Task` as follows::

    type                   -> Task.source          ("synthetic" | "real")
    task_id                -> Task.task_id
    scene                  -> Task.scene
    video                  -> Task.video            (path relative to the dataset root)
    context_clip_prompts   -> Task.context_clip_prompts (exactly 6 clip_prompt strings)
    continue_prompt        -> Task.continue_prompt
    task_type              -> Task.task_type        ("reappear" | "revisit")
    target_label           -> Task.target_label
    target_aliases         -> Task.target_aliases
    references             -> Task.references       (Reference records)

Any other field of a row (an extension such as MiniWorld's camera plans) is kept verbatim in
``Task.extra``; unknown fields of a reference are kept in ``Reference.extra``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOURCES = ("synthetic", "real")
TASK_TYPES = ("reappear", "revisit")
N_CLIP_PROMPTS = 6

Box = tuple[float, float, float, float]


def as_box(values: Iterable[Any]) -> Box:
    """A box ``(x0, y0, x1, y1)`` of floats from 4 numbers (a list, an array row ``[4]``)."""
    x0, y0, x1, y1 = (float(v) for v in values)
    return x0, y0, x1, y1


@dataclass(frozen=True)
class Reference:
    """An annotated sighting of the target in the context video.

    Attributes
    ----------
    timestamp_seconds : float
        Time of the reference frame in the context video.
    bbox_xyxy_normalized : tuple of 4 floats
        Target box ``(x0, y0, x1, y1)`` in [0, 1] image coordinates, positive area.
    frame_index : int or None
        Frame index in the context video at its native frame rate, when annotated.
    extra : dict
        Unknown fields of the reference, kept verbatim.
    """

    timestamp_seconds: float
    bbox_xyxy_normalized: Box
    frame_index: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def frame_at(self, fps: float, native: bool = True) -> int:
        """Index of the reference frame in a video at ``fps``.

        ``frame_index`` when it is annotated and ``native`` (the video is at its original frame
        rate), else the frame nearest to ``timestamp_seconds``, a half frame rounding up: the frame
        OpenCV's millisecond seek aims at (``int(seconds * fps + 0.5)``), which the authors' harness
        uses for timestamp-only references (docs/protocol.md, "Scorer").
        """
        if native and self.frame_index is not None:
            return self.frame_index
        return int(math.floor(self.timestamp_seconds * fps + 0.5))

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"timestamp_seconds": self.timestamp_seconds}
        if self.frame_index is not None:
            row["frame_index"] = self.frame_index
        row["bbox_xyxy_normalized"] = list(self.bbox_xyxy_normalized)
        row.update(self.extra)
        return row


@dataclass(frozen=True)
class Task:
    """One CMBench task: a context video, a continuation prompt and a target to recall.

    Attributes
    ----------
    task_id : str
        Unique id, e.g. ``syn_001_reappear_01``.
    source : {"synthetic", "real"}
        The official ``type`` field.
    scene : str
    video : str
        Context video path relative to the dataset root (POSIX separators).
    context_clip_prompts : tuple of 6 str
    continue_prompt : str
    task_type : {"reappear", "revisit"}
    target_label : str
        Detector text query.
    target_aliases : tuple of str
        Further text queries for the same target.
    references : tuple of Reference
    extra : dict
        Extension fields of the row, kept verbatim.
    root : Path or None
        Dataset root the task was loaded from (not part of the row).
    line : int or None
        1-based line of the row in its manifest (not part of the row).
    """

    task_id: str
    source: str
    scene: str
    video: str
    context_clip_prompts: tuple[str, ...]
    continue_prompt: str
    task_type: str
    target_label: str
    target_aliases: tuple[str, ...]
    references: tuple[Reference, ...]
    extra: dict[str, Any] = field(default_factory=dict)
    root: Path | None = field(default=None, compare=False)
    line: int | None = field(default=None, compare=False)

    @property
    def context_id(self) -> str:
        """The context this task continues: its video path without extension (tasks of one
        context share a prefill)."""
        return str(Path(self.video).with_suffix(""))

    @property
    def video_path(self) -> Path:
        """Absolute path of the context video."""
        if self.root is None:
            raise ValueError(f"task {self.task_id} was not loaded from a dataset root")
        return self.root / self.video

    @property
    def queries(self) -> tuple[str, ...]:
        """Detector text queries: the label, then the aliases (deduplicated, order kept)."""
        return tuple(dict.fromkeys((self.target_label, *self.target_aliases)))

    def to_json(self) -> dict[str, Any]:
        """The official row (extension fields appended), as written to ``metadata.jsonl``."""
        row: dict[str, Any] = {
            "type": self.source,
            "task_id": self.task_id,
            "scene": self.scene,
            "video": self.video,
            "context_clip_prompts": [{"clip_prompt": p} for p in self.context_clip_prompts],
            "continue_prompt": self.continue_prompt,
            "task_type": self.task_type,
            "target_label": self.target_label,
            "target_aliases": list(self.target_aliases),
            "references": [r.to_json() for r in self.references],
        }
        row.update(self.extra)
        return row
