"""One context and its tasks, end to end: context frames -> prefill -> continuation -> video -> score.

:class:`ModelEvaluator` implements :class:`cmbench.runs.runner.Evaluator` for ``python -m cmbench run``:
``prepare`` reads a context through the dataset's adapter and encodes it once; ``evaluate`` prefills it
under the task's own conditioning (tasks whose prefill reads the same conditioning, e.g. MiniWorld's
tasks of one context, share one prefill: :func:`cmbench.backbones.base.prefill_key`), forks the
prefilled cache for the task, generates its continuation, saves it (``videos/<task_id>.mp4``
to look at, and a lossless ``videos/<task_id>.mkv`` when frames are small, which ``score`` reads to
reproduce the run's scores exactly) and scores it in memory (``score_source: mp4``: the saved mp4
decoded again, as the authors score their ``continuation.mp4``). The continuation runs through a
:class:`cmbench.generation.accounting.CallRecorder`, so every record also carries the attention work
the method left (FLOPs and keys read per generated token): a cost no machine load can move.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable

import numpy as np
import torch

from cmbench.backbones.base import decode_continuation, prefill_key
from cmbench.backbones.loading import build_backbone
from cmbench.backbones.memory.run_plan import RunPlan, plan_run
from cmbench.data import Task, write_video
from cmbench.data.adapter import ContextFrames, ContextShape, build_adapter
from cmbench.data.video import read_video, write_lossless_video
from cmbench.generation import Continuation, GenerationSettings, PrefilledContext, check_settings, continue_task, prefill
from cmbench.generation.accounting import CallRecorder, attention_flops, keys_per_token
from cmbench.config_schema import SCORE_SOURCES
from cmbench.errors import ConfigError
from cmbench.hashing import task_seed
from cmbench.methods.base import Method
from cmbench.parallel import SequenceGroup, check_heads, split_backbone
from cmbench.identity.paths import inside
from cmbench.runs import atomic
from cmbench.runs.records import metric_name, scored_fields
from cmbench.data.references import reference_frames
from cmbench.miniworld.readers import camera_plan
from cmbench.scoring.continuity import continuity_fields
from cmbench.scoring.registry import build_scorer
from cmbench.spec import DataSpec, GenerationSpec, RunSpec, plan_inputs


def context_shape(context: Mapping[str, Any], backbone) -> ContextShape:
    """How ``backbone`` wants its context: the backbone config's ``context`` block and the chunk size."""
    return ContextShape(fps=float(context["fps"]), height=int(context["height"]), width=int(context["width"]),
                        chunk_latent_frames=backbone.geometry.chunk_frames,
                        temporal_stride=int(context.get("temporal_stride", 4)))


def encode_context(context: Mapping[str, Any], adapter, backbone, task: Task) -> tuple[ContextFrames, torch.Tensor]:
    """Read ``task``'s context through the dataset adapter and encode it (``context``: the backbone
    config's ``context`` block).

    Returns
    -------
    (ContextFrames, Tensor of shape ``[1, C, q0, h, w]``): the frames as read and their latents.
    """
    frames = adapter.context(task, context_shape(context, backbone))
    return frames, backbone.encode(torch.from_numpy(np.ascontiguousarray(frames.frames)))


@dataclass
class HeldPrefill:
    """A context's latents and its prefill under the last conditioning asked (:func:`prefilled_for`).

    One prefill is held at a time (a real backbone's prefilled cache can fill a GPU): tasks run in
    manifest order, and a task whose prefill key differs from the held one replaces it. Every prefill of
    a context uses the context's seed, so a replaced prefill computed again is the same.
    """

    context_latents: torch.Tensor  # [1, C, q0, h, w]: a continuation is decoded after them
    prefilled: PrefilledContext | None = None
    key: Hashable = None  # prefill_key of ``prefilled``


@dataclass
class PreparedContext(HeldPrefill):
    """What the tasks of one context share: the context as read, its latents and its held prefill."""

    context: ContextFrames = field(kw_only=True)


def prefilled_for(held: HeldPrefill, task: Task, cond: Any, *, backbone, method: Method,
                  settings: GenerationSettings, memory: RunPlan, seed: int) -> PrefilledContext:
    """The context prefilled under ``task``'s conditioning ``cond``: the held prefill when its key
    (:func:`cmbench.backbones.base.prefill_key`) is the task's, else a new one, which replaces it.

    Parameters
    ----------
    held : HeldPrefill
        The context's latents ``[1, C, q0, h, w]`` and the prefill held so far (updated in place).
    task : Task
        A task of that context; its context's seed (from the global ``seed``) seeds the prefill.
    cond : Any
        ``backbone.condition(task)``.
    memory : RunPlan
        Settles each new prefill (trimmed to its history, or parked in host memory).
    """
    key = prefill_key(backbone, cond, int(held.context_latents.shape[2]), task.task_id)
    if held.prefilled is None or held.key != key:
        held.prefilled = None  # free the previous prefill before building the next
        prefilled = prefill(backbone, method, held.context_latents, cond, task_seed(seed, task.context_id), settings)
        memory.settle(prefilled.cache)
        held.prefilled, held.key = prefilled, key
    return held.prefilled


@dataclass(frozen=True)
class VideoOutput:
    """Where and how continuations are saved.

    Attributes
    ----------
    run_dir : Path
        ``videos/`` go here.
    fps : float
    lossless_max_pixels : int
        Also write a lossless copy when a frame has at most this many pixels.
    """

    run_dir: Path
    fps: float
    lossless_max_pixels: int = 0


class ModelEvaluator:
    """Backbone + method + scorer of a run (the typed pieces of :class:`cmbench.spec.RunSpec`).

    Parameters
    ----------
    method : Method
        Built and checked (:func:`cmbench.spec.resolve_run`).
    generation : GenerationSpec
    data : DataSpec
        Its adapter reads contexts and references.
    backbone, scorer : mapping
        The resolved backbone and scorer configs.
    seed : int
        The global seed (a context's prefill seed derives from it).
    videos : VideoOutput or None
        Save each continuation (None: do not).
    sequence : int
        Ranks the model will be split over (``parallel.sequence``): the memory plan is one rank's, and
        :meth:`split` splits the backbone once the ranks have joined.

    Raises
    ------
    ConfigError
        A memory plan that does not fit, a bad scorer or backbone config, before anything heavy is built.
    """

    def __init__(self, method: Method, generation: GenerationSpec, data: DataSpec, backbone: Mapping[str, Any],
                 scorer: Mapping[str, Any], *, seed: int, videos: VideoOutput | None = None,
                 score_source: str = "frames", sequence: int = 1):
        self.method = method
        self.settings = generation.settings
        check_settings(self.method, self.settings)
        # before loading anything: offloads, or a refusal with numbers
        self.memory = plan_run(plan_inputs(backbone, data, scorer, generation, sequence), self.method)
        self.scorer = build_scorer(scorer)
        self.metric = metric_name(scorer)
        self.adapter = build_adapter(data.config)
        self.backbone = build_backbone(self.memory.backbone_config)
        check_heads(self.backbone.geometry.num_heads, self.backbone.geometry.tokens_per_frame, sequence)
        self.group: SequenceGroup | None = None
        self.context = backbone["context"]
        self.continuation_frames = generation.continuation_frames
        self.seed = seed
        self.videos = videos
        self.fps = data.fps
        if score_source not in SCORE_SOURCES:
            raise ConfigError(f"score_source must be one of {', '.join(SCORE_SOURCES)}, got {score_source!r}")
        self.score_source = score_source

    @classmethod
    def from_spec(cls, spec: RunSpec, videos: VideoOutput | None = None) -> ModelEvaluator:
        """The evaluator of a resolved run (:func:`cmbench.spec.resolve_run`)."""
        return cls(spec.method, spec.generation, spec.data, spec.backbone, spec.scorer, seed=spec.selection.seed,
                   videos=videos, score_source=spec.score_source, sequence=spec.parallel.sequence)

    def split(self, group: SequenceGroup) -> None:
        """Run the backbone split over ``group`` (Ulysses sequence parallelism: :mod:`cmbench.parallel`)."""
        split_backbone(self.backbone, group)
        self.group = group

    @property
    def scorer_hash(self) -> str:
        return self.scorer.config_hash

    def context_shape(self) -> ContextShape:
        """How this backbone wants its context (``backbone.context`` and the chunk size)."""
        return context_shape(self.context, self.backbone)

    def prepare(self, tasks: list[Task]) -> PreparedContext:
        """Read and encode the context of ``tasks`` (one context), and prefill it for the first task."""
        context, latents = encode_context(self.context, self.adapter, self.backbone, tasks[0])
        prepared = PreparedContext(latents, context=context)
        self.prefilled_for(tasks[0], self.backbone.condition(tasks[0]), prepared)
        return prepared

    def prefilled_for(self, task: Task, cond: Any, prepared: PreparedContext) -> PrefilledContext:
        """The context prefilled under ``task``'s conditioning ``cond`` (:func:`prefilled_for`)."""
        return prefilled_for(prepared, task, cond, backbone=self.backbone, method=self.method, settings=self.settings,
                             memory=self.memory, seed=self.seed)

    def mp4_frames(self, task: Task, frames: np.ndarray) -> np.ndarray:
        """``frames`` as the saved mp4 holds them (``score_source: mp4``, as the authors score their
        ``continuation.mp4``): the run's ``videos/<task_id>.mp4``, or a temporary one when videos are
        not saved.

        Parameters
        ----------
        frames : ndarray, ``uint8 [F, H, W, 3]``

        Returns
        -------
        ndarray, ``uint8 [F, H, W, 3]``: decoded from the mp4.
        """
        if self.videos is not None:
            return read_video(inside(self.videos.run_dir, "videos", f"{task.task_id}.mp4"))[0]
        with tempfile.TemporaryDirectory() as tmp:
            path = write_video(Path(tmp) / "continuation.mp4", frames, self.fps)
            return read_video(path)[0]

    def save(self, task: Task, frames: np.ndarray) -> str | None:
        """Write the continuation: an mp4 to look at, and a lossless copy when frames have at most
        ``lossless_max_pixels`` pixels (and the scored source is the frames). Returns the scored
        video's path relative to the run directory (the lossless copy when written), or None when
        videos are not saved.

        Parameters
        ----------
        frames : ndarray, ``uint8 [F, H, W, 3]``
        """
        out = self.videos
        if out is None:
            return None
        run_dir, fps = out.run_dir, out.fps

        def write_new(name: str, write: Callable[[Path, np.ndarray, float], Path]) -> None:
            """A new file renamed over ``videos/<name>``: a link or a hard-linked file there is replaced,
            never written through."""
            path = inside(run_dir, "videos", name)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_with(path, lambda tmp: write(tmp, frames, fps), keep_suffix=True)

        write_new(f"{task.task_id}.mp4", write_video)
        if self.score_source == "mp4" or frames.shape[1] * frames.shape[2] > out.lossless_max_pixels:
            return f"videos/{task.task_id}.mp4"
        write_new(f"{task.task_id}.mkv", write_lossless_video)
        return f"videos/{task.task_id}.mkv"

    def generate(self, task: Task, prepared: PreparedContext, seed: int) -> tuple[PrefilledContext, Continuation,
                                                                                 CallRecorder]:
        """The model's part of a task (every rank of a split model runs it): the prefill under the task's
        conditioning, its continuation, and the attention work logged at every call (summed over the
        ranks of a split model: every head's)."""
        recorder = CallRecorder(self.backbone)
        cond = self.backbone.condition(task)
        prefilled = self.prefilled_for(task, cond, prepared)
        cont = continue_task(recorder, prefilled, cond, self.continuation_frames, seed)
        if self.group is not None:
            recorder.calls = self.group.sum_each(recorder.calls)
        return prefilled, cont, recorder

    def evaluate(self, task: Task, prepared: PreparedContext, seed: int) -> dict[str, Any]:
        prefilled, cont, recorder = self.generate(task, prepared, seed)
        geometry = self.backbone.geometry
        generated_tokens = int(cont.latents.shape[2]) * geometry.tokens_per_frame
        retrieval = cont.cache.store is not None  # a host store: its peak and transfers are recorded
        cache_dtype = str(cont.cache.row_dtype).removeprefix("torch.")
        cont.cache = None  # type: ignore[assignment]  # free the task's KV cache before decoding
        frames = np.asarray(decode_continuation(self.backbone, cont.latents, prepared.context_latents))
        video = self.save(task, frames)
        context = prepared.context
        refs = reference_frames(task, context.reference_source, context.reference_fps, native=True)
        scored = self.scorer.score_task(task, frames if self.score_source == "frames" else self.mp4_frames(task, frames),
                                        refs, frames_defined=int(frames.shape[0]))  # the frames generated
        ledger = cont.ledger.summary()
        context_chunks = prefilled.next_chunk
        return {
            **scored_fields(scored),
            **continuity_fields(camera_plan(task), lambda: context.reference_source, frames),
            "metric": self.metric,
            "video": video,
            "pr": ledger["pruning_ratio"],
            "context_pr": prefilled.ledger.pruning_ratio(),
            "kept_tokens": int(sum(cont.kept_tokens.values())),
            "kept_context_tokens": int(sum(v for c, v in cont.kept_tokens.items() if c < context_chunks)),
            "peak_kv_bytes": int(ledger["peak_stored_bytes"]),
            "mean_kv_bytes": ledger["mean_stored_bytes"],
            "fullkv_kv_bytes": ledger["mean_full_bytes"],
            "fullkv_peak_kv_bytes": int(ledger["peak_full_bytes"]),
            "kv_bytes_ratio": ledger["kv_bytes_ratio"],  # None when FullKV would store nothing
            "ledger": cont.ledger.rows(),
            "cache_dtype": cache_dtype,
            **({"peak_store_bytes": int(ledger["peak_store_bytes"]), "moved_bytes_per_chunk": ledger["moved_bytes_per_chunk"]}
               if retrieval else {}),
            "prefill_seconds": prefilled.seconds,
            "continuation_seconds": cont.seconds,
            "continuation_frames": int(frames.shape[0]),
            "continuation_fps": frames.shape[0] / cont.seconds if cont.seconds > 0 else None,
            "attention_flops": attention_flops(recorder.calls, geometry, int(cont.latents.shape[0]), recorder.lengths),
            "attention_keys_per_token": keys_per_token(recorder.calls, geometry, generated_tokens, recorder.lengths),
        }
