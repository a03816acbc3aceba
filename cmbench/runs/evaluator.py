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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable

import numpy as np
import torch
from omegaconf import DictConfig

from cmbench.backbones.base import decode_continuation, prefill_key
from cmbench.backbones.loading import build_backbone
from cmbench.backbones.memory.run_plan import plan_run
from cmbench.config_paths import to_dict
from cmbench.data import Task, write_video
from cmbench.data.adapter import ContextFrames, ContextShape, build_adapter
from cmbench.data.video import read_video, write_lossless_video
from cmbench.generation import (
    GenerationSettings,
    PrefilledContext,
    check_settings,
    continue_task,
    prefill,
)
from cmbench.generation.accounting import CallRecorder, attention_flops, keys_per_token
from cmbench.generation.sampler import FlowMatchSampler
from cmbench.errors import ConfigError
from cmbench.hashing import task_seed
from cmbench.methods.registry import build_method
from cmbench.runs.paths import inside
from cmbench.runs.records import metric_name, scored_fields
from cmbench.data.references import reference_frames
from cmbench.scoring.registry import build_scorer


SCORE_SOURCES = ("frames", "mp4")  # what a run scores: the decoded frames, or their saved mp4 (the authors')


def generation_settings(cfg: DictConfig) -> GenerationSettings:
    """The loop's shared knobs from ``cfg.generation``."""
    g = cfg.generation
    return GenerationSettings(
        sampler=FlowMatchSampler(timesteps=tuple(g.timesteps), stochastic=bool(g.stochastic)),
        reindex=bool(g.rope_reindex),
        reindex_recent=int(g.reindex_recent),
        reindex_virtual_length=float(g.reindex_virtual_length),
    )


def context_shape(cfg: DictConfig, backbone) -> ContextShape:
    """How ``backbone`` wants its context (``cfg.backbone.context`` and the chunk size)."""
    ctx = cfg.backbone.context
    return ContextShape(fps=float(ctx.fps), height=int(ctx.height), width=int(ctx.width),
                        chunk_latent_frames=backbone.geometry.chunk_frames,
                        temporal_stride=int(ctx.get("temporal_stride", 4)))


def encode_context(cfg: DictConfig, adapter, backbone, task: Task) -> tuple[ContextFrames, torch.Tensor]:
    """Read ``task``'s context through the dataset adapter and encode it.

    Returns
    -------
    (ContextFrames, Tensor of shape ``[1, C, q0, h, w]``): the frames as read and their latents.
    """
    context = adapter.context(task, context_shape(cfg, backbone))
    return context, backbone.encode(torch.from_numpy(np.ascontiguousarray(context.frames)))


@dataclass
class PreparedContext:
    """What the tasks of one context share: the context, and the prefill of the last conditioning asked.

    One prefill is held at a time (a real backbone's prefilled cache can fill a GPU): tasks run in
    manifest order, and a task whose prefill key differs from the held one replaces it. Every prefill of
    a context uses the context's seed, so a replaced prefill computed again is the same.
    """

    context: ContextFrames
    context_latents: torch.Tensor  # [1, C, q0, h, w]: a continuation is decoded after them
    prefilled: PrefilledContext | None = None
    key: Hashable = None  # prefill_key of ``prefilled``


class ModelEvaluator:
    """Backbone + method + scorer built from a run config.

    Parameters
    ----------
    cfg : DictConfig
        The root config (``data``, ``backbone``, ``method``, ``scorer``, ``generation``, ``seed``,
        ``save_videos``, ``lossless_max_pixels``).
    run_dir : Path
        Where ``videos/`` go (when ``save_videos``).

    Raises
    ------
    ConfigError
        A method knob the method rejects, before anything heavy is built.
    """

    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.method = build_method(to_dict(cfg.method))  # first: its knob checks fail fast
        self.settings = generation_settings(cfg)
        check_settings(self.method, self.settings)
        self.memory = plan_run(cfg, self.method)  # before loading anything: offloads, or a refusal with numbers
        scorer_cfg = to_dict(cfg.scorer)
        self.scorer = build_scorer(scorer_cfg)
        self.metric = metric_name(scorer_cfg)
        self.adapter = build_adapter(cfg.data)
        self.backbone = build_backbone(self.memory.backbone_config)
        self.continuation_frames = int(cfg.generation.continuation_frames)
        self.save_videos = bool(cfg.save_videos)
        self.lossless_max_pixels = int(cfg.get("lossless_max_pixels") or 0)
        self.score_source = str(cfg.get("score_source") or "frames")
        if self.score_source not in SCORE_SOURCES:
            raise ConfigError(f"score_source must be one of {', '.join(SCORE_SOURCES)}, got {self.score_source!r}")

    @property
    def scorer_hash(self) -> str:
        return self.scorer.config_hash

    def context_shape(self) -> ContextShape:
        """How this backbone wants its context (``backbone.context`` and the chunk size)."""
        return context_shape(self.cfg, self.backbone)

    def prepare(self, tasks: list[Task]) -> PreparedContext:
        """Read and encode the context of ``tasks`` (one context), and prefill it for the first task."""
        context, latents = encode_context(self.cfg, self.adapter, self.backbone, tasks[0])
        prepared = PreparedContext(context, latents)
        self.prefilled_for(tasks[0], self.backbone.condition(tasks[0]), prepared)
        return prepared

    def prefilled_for(self, task: Task, cond: Any, prepared: PreparedContext) -> PrefilledContext:
        """The context prefilled under ``task``'s conditioning ``cond``: the held prefill when its key is
        the task's, else a new one (replacing it)."""
        key = prefill_key(self.backbone, cond, int(prepared.context_latents.shape[2]), task.task_id)
        if prepared.prefilled is None or prepared.key != key:
            prepared.prefilled = None  # free the previous prefill before building the next
            seed = task_seed(int(self.cfg.seed), task.context_id)
            prefilled = prefill(self.backbone, self.method, prepared.context_latents, cond, seed, self.settings)
            self.memory.settle(prefilled.cache)  # trimmed to its history, or parked in host memory (the plan)
            prepared.prefilled, prepared.key = prefilled, key
        return prepared.prefilled

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
        if self.save_videos:
            return read_video(inside(self.run_dir, "videos", f"{task.task_id}.mp4"))[0]
        with tempfile.TemporaryDirectory(dir=self.run_dir) as tmp:
            path = write_video(Path(tmp) / "continuation.mp4", frames, float(self.cfg.data.fps))
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
        if not self.save_videos:
            return None
        fps = float(self.cfg.data.fps)
        write_video(inside(self.run_dir, "videos", f"{task.task_id}.mp4"), frames, fps)
        if self.score_source == "mp4" or frames.shape[1] * frames.shape[2] > self.lossless_max_pixels:
            return f"videos/{task.task_id}.mp4"
        write_lossless_video(inside(self.run_dir, "videos", f"{task.task_id}.mkv"), frames, fps)
        return f"videos/{task.task_id}.mkv"

    def evaluate(self, task: Task, prepared: PreparedContext, seed: int) -> dict[str, Any]:
        recorder = CallRecorder(self.backbone)
        cond = self.backbone.condition(task)
        prefilled = self.prefilled_for(task, cond, prepared)
        cont = continue_task(recorder, prefilled, cond, self.continuation_frames, seed)
        geometry = self.backbone.geometry
        generated_tokens = int(cont.latents.shape[2]) * geometry.tokens_per_frame
        cont.cache = None  # type: ignore[assignment]  # free the task's KV cache before decoding
        frames = np.asarray(decode_continuation(self.backbone, cont.latents, prepared.context_latents))
        video = self.save(task, frames)
        context = prepared.context
        refs = reference_frames(task, context.reference_source, context.reference_fps, native=True)
        scored = self.scorer.score_task(task, frames if self.score_source == "frames" else self.mp4_frames(task, frames),
                                        refs)
        ledger = cont.ledger.summary()
        context_chunks = prefilled.next_chunk
        return {
            **scored_fields(scored),
            "metric": self.metric,
            "video": video,
            "pr": ledger["pruning_ratio"],
            "context_pr": prefilled.ledger.pruning_ratio(),
            "kept_tokens": int(sum(cont.kept_tokens.values())),
            "kept_context_tokens": int(sum(v for c, v in cont.kept_tokens.items() if c < context_chunks)),
            "peak_kv_bytes": int(ledger["peak_stored_bytes"]),
            "prefill_seconds": prefilled.seconds,
            "continuation_seconds": cont.seconds,
            "continuation_frames": int(frames.shape[0]),
            "continuation_fps": frames.shape[0] / cont.seconds if cont.seconds > 0 else None,
            "attention_flops": attention_flops(recorder.calls, geometry, int(cont.latents.shape[0]), recorder.lengths),
            "attention_keys_per_token": keys_per_token(recorder.calls, geometry, generated_tokens, recorder.lengths),
        }
