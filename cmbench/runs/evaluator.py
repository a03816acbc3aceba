"""One context and its tasks, end to end: context frames -> prefill -> continuation -> video -> score.

:class:`ModelEvaluator` implements :class:`cmbench.runs.runner.Evaluator` for ``python -m cmbench run``:
``prepare`` reads a context through the dataset's adapter, encodes and prefills it once; ``evaluate``
forks the prefilled cache for one task, generates its continuation, saves it (``videos/<task_id>.mp4``
to look at, and a lossless ``videos/<task_id>.mkv`` when frames are small, which ``score`` reads to
reproduce the run's scores exactly) and scores it in memory. The continuation runs through a
:class:`cmbench.generation.accounting.CallRecorder`, so every record also carries the attention work
the method left (FLOPs and keys read per generated token): a cost no machine load can move.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cmbench.backbones.base import decode_continuation
from cmbench.backbones.loading import build_backbone
from cmbench.backbones.memory.run_plan import plan_run
from cmbench.data import Task, write_video
from cmbench.data.adapter import ContextFrames, ContextShape, build_adapter
from cmbench.data.video import write_lossless_video
from cmbench.generation import PrefilledContext, check_settings, continue_task, prefill
from cmbench.generation.accounting import CallRecorder, attention_flops, keys_per_token
from cmbench.hashing import task_seed
from cmbench.methods.base import Method
from cmbench.runs.paths import inside
from cmbench.runs.records import metric_name, scored_fields
from cmbench.data.references import reference_frames
from cmbench.scoring.registry import build_scorer
from cmbench.spec import DataSpec, GenerationSpec


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
class PreparedContext:
    """What the tasks of one context share."""

    prefilled: PrefilledContext
    context: ContextFrames
    context_latents: torch.Tensor  # [1, C, q0, h, w]: a continuation is decoded after them


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

    Raises
    ------
    ConfigError
        A memory plan that does not fit, a bad scorer or backbone config, before anything heavy is built.
    """

    def __init__(self, method: Method, generation: GenerationSpec, data: DataSpec, backbone: Mapping[str, Any],
                 scorer: Mapping[str, Any], *, seed: int, videos: VideoOutput | None = None):
        self.method = method
        self.settings = generation.settings
        check_settings(self.method, self.settings)
        # before loading anything: offloads, or a refusal with numbers
        self.memory = plan_run({"backbone": backbone, "data": data.config, "scorer": scorer,
                                "generation": {"continuation_frames": generation.continuation_frames}}, self.method)
        self.scorer = build_scorer(scorer)
        self.metric = metric_name(scorer)
        self.adapter = build_adapter(data.config)
        self.backbone = build_backbone(self.memory.backbone_config)
        self.context = backbone["context"]
        self.continuation_frames = generation.continuation_frames
        self.seed = seed
        self.videos = videos

    @property
    def scorer_hash(self) -> str:
        return self.scorer.config_hash

    def context_shape(self) -> ContextShape:
        """How this backbone wants its context (``backbone.context`` and the chunk size)."""
        return context_shape(self.context, self.backbone)

    def prepare(self, tasks: list[Task]) -> PreparedContext:
        task = tasks[0]
        context, latents = encode_context(self.context, self.adapter, self.backbone, task)
        seed = task_seed(self.seed, task.context_id)
        prefilled = prefill(self.backbone, self.method, latents, self.backbone.condition(task), seed, self.settings)
        self.memory.settle(prefilled.cache)  # trimmed to its history, or parked in host memory (the plan)
        return PreparedContext(prefilled, context, latents)

    def save(self, task: Task, frames: np.ndarray) -> str | None:
        """Write the continuation: an mp4 to look at, and a lossless copy when frames have at most
        ``lossless_max_pixels`` pixels. Returns the scored video's path relative to the run
        directory (the lossless copy when written), or None when videos are not saved.

        Parameters
        ----------
        frames : ndarray, ``uint8 [F, H, W, 3]``
        """
        out = self.videos
        if out is None:
            return None
        write_video(inside(out.run_dir, "videos", f"{task.task_id}.mp4"), frames, out.fps)
        if frames.shape[1] * frames.shape[2] > out.lossless_max_pixels:
            return f"videos/{task.task_id}.mp4"
        write_lossless_video(inside(out.run_dir, "videos", f"{task.task_id}.mkv"), frames, out.fps)
        return f"videos/{task.task_id}.mkv"

    def evaluate(self, task: Task, prepared: PreparedContext, seed: int) -> dict[str, Any]:
        recorder = CallRecorder(self.backbone)
        cont = continue_task(recorder, prepared.prefilled, self.backbone.condition(task),
                             self.continuation_frames, seed)
        geometry = self.backbone.geometry
        generated_tokens = int(cont.latents.shape[2]) * geometry.tokens_per_frame
        cont.cache = None  # type: ignore[assignment]  # free the task's KV cache before decoding
        frames = np.asarray(decode_continuation(self.backbone, cont.latents, prepared.context_latents))
        video = self.save(task, frames)
        context = prepared.context
        refs = reference_frames(task, context.reference_source, context.reference_fps, native=True)
        scored = self.scorer.score_task(task, frames, refs)
        ledger = cont.ledger.summary()
        context_chunks = prepared.prefilled.next_chunk
        return {
            **scored_fields(scored),
            "metric": self.metric,
            "video": video,
            "pr": ledger["pruning_ratio"],
            "target_pr": getattr(self.method, "target_pr", None),
            "context_pr": prepared.prefilled.ledger.pruning_ratio(),
            "kept_tokens": int(sum(cont.kept_tokens.values())),
            "kept_context_tokens": int(sum(v for c, v in cont.kept_tokens.items() if c < context_chunks)),
            "peak_kv_bytes": int(ledger["peak_stored_bytes"]),
            "prefill_seconds": prepared.prefilled.seconds,
            "continuation_seconds": cont.seconds,
            "continuation_frames": int(frames.shape[0]),
            "continuation_fps": frames.shape[0] / cont.seconds if cont.seconds > 0 else None,
            "attention_flops": attention_flops(recorder.calls, geometry, int(cont.latents.shape[0]), recorder.lengths),
            "attention_keys_per_token": keys_per_token(recorder.calls, geometry, generated_tokens, recorder.lengths),
        }
