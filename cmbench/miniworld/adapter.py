"""MiniWorld as a dataset: built on demand, read losslessly.

:class:`MiniWorldAdapter` is the ``adapter: miniworld`` of ``configs/data/miniworld.yaml``. It differs
from the official layout in three ways: the suite is built locally (and rebuilt when a build knob
changes, saying which); contexts and references are read from the lossless ``context/*.npz`` frames
(the mp4s are lossy at 32x32); and ``validate`` also checks the npz files every row names.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from cmbench import bounded_read

from cmbench.data.adapter import ContextFrames, ContextShape, ContinuationShape, DatasetAdapter
from cmbench.data.manifest import Problem
from cmbench.data.references import TaskReferences, reference_frames, video_digest
from cmbench.data.task import Task
from cmbench.miniworld.readers import (
    EXTENSION,
    MiniWorldDataError,
    data_file,
    extension,
    load_context,
    load_ground_truth,
)
from cmbench.miniworld.scene import FRAME
from cmbench.miniworld.suite import SuiteConfig, build_suite


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def build_changes(root: Path, cfg: SuiteConfig) -> list[str]:
    """Build knobs of the suite at ``root`` that differ from ``cfg`` (``"world_seed: 0 -> 1"``);
    empty when there is no build yet or it matches."""
    record = Path(root) / "build.json"
    if not record.is_file():
        return []
    try:
        built = _flatten(json.loads(bounded_read.read_text(record, "build record")).get("config", {}))
    except (OSError, ValueError, AttributeError, bounded_read.ReadLimitError):
        return ["build.json: unreadable"]
    wanted = _flatten(asdict(cfg))
    return [f"{k}: {built.get(k, '(unset)')} -> {wanted.get(k, '(unset)')}"
            for k in sorted(set(built) | set(wanted)) if built.get(k) != wanted.get(k)]


class MiniWorldAdapter(DatasetAdapter):
    """The MiniWorld suite at ``data.root``, built from the build knobs of ``data``."""

    def ensure(self) -> Path:
        """Build the suite when it is missing or was built with other knobs, saying so in one line that
        names where (a relative ``data.root`` is under the working directory)."""
        changes = build_changes(self.root, SuiteConfig.from_data_config(self.data))
        if changes:
            print(f"{self.name}: rebuilding {self.root} (built with other knobs: {'; '.join(changes)})",
                  file=sys.stderr)
        elif not (self.root / "build.json").is_file():
            where = self.root if self.root.is_absolute() else f"{self.root}, under the working directory"
            print(f"{self.name}: building the suite at {where} (once, under a minute; data.root=DIR, or "
                  f"CMBENCH_HOME=DIR for data/ and runs/ together, puts it elsewhere)", file=sys.stderr)
        return build_suite(self.data)

    def prepare(self) -> Path:
        root = self.ensure()
        print(f"{self.name}: suite ready at {root}")
        return root

    def problems(self, tasks: list[Task], open_files: bool = True) -> list[Problem]:
        """Every row's ``miniworld`` extension names npz files inside the root that exist (and, with
        ``open_files``, read as the evaluator reads them)."""
        problems = []
        for task in tasks:
            try:
                extension(task)
            except MiniWorldDataError as err:
                problems.append(Problem(str(self.manifest), task.line, EXTENSION, str(err)))
                continue
            for key, load in (("context_frames", load_context), ("ground_truth", load_ground_truth)):
                try:
                    load(task) if open_files else data_file(task, key)
                except MiniWorldDataError as err:
                    problems.append(Problem(str(self.manifest), task.line, f"{EXTENSION}.{key}", str(err)))
        return problems

    def reference_source(self, task: Task) -> tuple[np.ndarray, float]:
        """The lossless context frames (``uint8 [F, 32, 32, 3]``) and their frame rate."""
        frames, _ = load_context(task)
        return frames, self._fps(task)

    def references(self, task: Task) -> TaskReferences:
        """The references in the lossless context frames, named ``<npz sha256>@<frame index>``; the npz
        is read only when a scorer needs the pixels."""
        fps = self._fps(task)
        digest = video_digest(data_file(task, "context_frames"))
        keys = [f"{digest}@{ref.frame_at(fps, native=True)}" for ref in task.references]
        return TaskReferences(keys, lambda: reference_frames(task, *self.reference_source(task), native=True))

    def context(self, task: Task, shape: ContextShape) -> ContextFrames:
        """The lossless context as stored (already at the tiny backbone's size and rate)."""
        frames, fps = self.reference_source(task)
        return ContextFrames(frames, frames, fps)

    def _fps(self, task: Task) -> float:
        return float(extension(task).get("fps", self.data.get("fps", 16)))

    def continuation_shape(self) -> ContinuationShape:
        return ContinuationShape(int(self.data.get("continuation_frames", 16)), FRAME, FRAME)
