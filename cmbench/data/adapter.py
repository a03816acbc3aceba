"""Dataset adapters: how a dataset is made available and how a task's frames are read.

Every dataset in the official ``metadata.jsonl`` layout is read through one :class:`DatasetAdapter`;
a dataset that stores more than that layout (MiniWorld's lossless frames and its build knobs)
subclasses it, so commands and the evaluator never ask which dataset they hold. A data config names
its adapter (``adapter: official`` | ``miniworld`` | a registered name | ``package.module:Class``;
``official`` when absent)::

    adapter = build_adapter(cfg.data)
    adapter.ensure()                         # make the data present (build, or say how to fetch it)
    context = adapter.context(task, shape)   # frames to prefill + the frames references index
    frames, fps = adapter.reference_source(task)
    refs = adapter.references(task)          # only the referenced frames, decoded when first needed
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cmbench.data.manifest import Problem
from cmbench.data.references import TaskReferences, reference_frames
from cmbench.data.task import Task
from cmbench.data.video import prepare_frames, read_video
from cmbench.errors import ConfigError
from cmbench.registry import Registry


@dataclass(frozen=True)
class ContextShape:
    """How a backbone wants its context: frame rate, frame size, latent chunking.

    Attributes
    ----------
    fps : float
    height, width : int
    chunk_latent_frames : int
        Latent frames per chunk (the context is padded to whole chunks).
    temporal_stride : int
        The VAE's temporal stride (4 for Wan, 1 for a frame-wise tokenizer).
    """

    fps: float
    height: int
    width: int
    chunk_latent_frames: int
    temporal_stride: int = 4


@dataclass(frozen=True)
class ContextFrames:
    """A task's context, ready for a backbone.

    Attributes
    ----------
    frames : ndarray, ``uint8 [F, H, W, 3]``
        What the backbone prefills.
    reference_source : ndarray, ``uint8 [F', H', W', 3]``
        The frames the reference annotations index (the context as stored).
    reference_fps : float
        Frame rate of ``reference_source``.
    """

    frames: np.ndarray
    reference_source: np.ndarray
    reference_fps: float


@dataclass(frozen=True)
class ContinuationShape:
    """What a continuation of this dataset should look like (``score`` warns when a video differs).

    Attributes
    ----------
    frames : int or None
        Frame count, None when the dataset does not fix it.
    height, width : int
    """

    frames: int | None
    height: int
    width: int


class DatasetAdapter:
    """The official CMBench layout: ``metadata.jsonl`` plus context videos, read as stored.

    Parameters
    ----------
    data : mapping
        The data config (``name``, ``root``, ``manifest``, ``fps``, ``height``, ``width``, ...).
    """

    def __init__(self, data: Any):
        self.data = data
        self.root = Path(str(data["root"]))
        self.manifest = self.root / str(data.get("manifest", "metadata.jsonl"))
        self._decoded: tuple[Path, np.ndarray, float] | None = None

    @property
    def name(self) -> str:
        return str(self.data.get("name", "dataset"))

    def ensure(self) -> Path:
        """Make the dataset present for a run (the official set is never fetched implicitly).

        Raises
        ------
        ConfigError
            Saying how to get the data, when the manifest is missing.
        """
        if not self.manifest.exists():  # anything else there (a FIFO, a directory) is named by its read
            raise ConfigError(f"{self.manifest} not found: run `python -m cmbench prepare data={self.name} "
                              f"data.root={self.root}` first, or point data.root at a copy of the dataset")
        return self.root

    def prepare(self) -> Path:
        """``python -m cmbench prepare``: fetch the dataset its spec names (a hub dataset)."""
        from cmbench.data.official import fetch_official

        return fetch_official(self.data)

    def problems(self, tasks: list[Task], open_files: bool = True) -> list[Problem]:
        """Checks beyond the official schema (none for the official layout)."""
        return []

    def reference_source(self, task: Task) -> tuple[np.ndarray, float]:
        """The frames a task's references index, and their frame rate: the context video decoded
        (once while the tasks of one video come in a row).

        Returns
        -------
        frames : ndarray, ``uint8 [F, H, W, 3]``
        fps : float
        """
        path = task.video_path
        if self._decoded is None or self._decoded[0] != path:
            self._decoded = None  # a failed decode must not leave the previous video in place
            frames, fps = read_video(path)
            self._decoded = (path, frames, fps)
        return self._decoded[1], self._decoded[2]

    def references(self, task: Task) -> TaskReferences:
        """A task's reference frames, named by content and decoded only when a scorer needs their pixels.

        The official layout reads the context video's header now and, on :meth:`TaskReferences.frames`,
        decodes it sequentially up to the last reference, keeping only the referenced frames
        (:meth:`TaskReferences.from_video`); a task whose features are cached never decodes it. An
        adapter that overrides only :meth:`reference_source` gets its references picked out of those
        frames, named by their pixels.
        """
        if type(self).reference_source is not DatasetAdapter.reference_source:
            return TaskReferences.from_arrays(reference_frames(task, *self.reference_source(task), native=True))
        return TaskReferences.from_video(task)

    def context(self, task: Task, shape: ContextShape) -> ContextFrames:
        """The context prepared as the authors' runtime does (resample by nearest index, resize,
        pad to whole chunks), and the decoded frames the references index."""
        original, fps = self.reference_source(task)
        frames = prepare_frames(original, fps, fps=shape.fps, height=shape.height, width=shape.width,
                                chunk_latent_frames=shape.chunk_latent_frames, temporal_stride=shape.temporal_stride)
        return ContextFrames(frames, original, fps)

    def continuation_shape(self) -> ContinuationShape:
        """Frame size from ``data.height`` / ``data.width``; the length is the generator's choice."""
        return ContinuationShape(None, int(self.data["height"]), int(self.data["width"]))


ADAPTERS: Registry[type[DatasetAdapter]] = Registry("dataset adapter", base=DatasetAdapter,
                                                  entry_point_group="cmbench.datasets")
ADAPTERS.add("official", DatasetAdapter)
ADAPTERS.add("miniworld", "cmbench.miniworld.adapter:MiniWorldAdapter")


def build_adapter(data: Any) -> DatasetAdapter:
    """The adapter a data config names (``adapter``: a registered name, else a ``_target_``-style
    import path of a :class:`DatasetAdapter` subclass; ``official`` when absent).

    Raises
    ------
    ConfigError
        Unknown name (with the closest one), or a class that is not a :class:`DatasetAdapter`.
    """
    name = str(data.get("adapter") or "official")
    cls = ADAPTERS.get(name) if name in ADAPTERS or ("." not in name and ":" not in name) else ADAPTERS.import_target(name)
    return cls(data)
