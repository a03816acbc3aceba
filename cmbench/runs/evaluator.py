"""One context and its tasks, end to end: context frames -> prefill -> continuation -> video -> score.

:class:`ModelEvaluator` implements :class:`cmbench.runs.runner.Evaluator` for ``python -m cmbench run``:
``prepare`` encodes and prefills a context once; ``evaluate`` forks the prefilled cache for one task,
generates its continuation, writes ``videos/<task_id>.mp4`` and scores it in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from cmbench.backbones.base import decode_continuation
from cmbench.backbones.loading import build_backbone
from cmbench.backbones.memory.run_plan import plan_run
from cmbench.data import Task, read_video, write_video
from cmbench.data.video import prepare_frames
from cmbench.generation import (
    GenerationSettings,
    PrefilledContext,
    continue_task,
    prefill,
)
from cmbench.generation.sampler import FlowMatchSampler
from cmbench.hashing import task_seed
from cmbench.methods.registry import build_method
from cmbench.scoring.references import reference_frames
from cmbench.scoring.registry import build_scorer

MINIWORLD_EXTENSION = "miniworld"


def generation_settings(cfg: DictConfig) -> GenerationSettings:
    """The loop's shared knobs from ``cfg.generation``."""
    g = cfg.generation
    return GenerationSettings(
        sampler=FlowMatchSampler(timesteps=tuple(g.timesteps), stochastic=bool(g.stochastic)),
        reindex=bool(g.rope_reindex),
        reindex_recent=int(g.reindex_recent),
        reindex_virtual_length=float(g.reindex_virtual_length),
    )


@dataclass
class PreparedContext:
    """What the tasks of one context share."""

    prefilled: PrefilledContext
    reference_source: np.ndarray  # uint8 [F, H, W, 3]: frames the reference annotations point into
    reference_fps: float
    context_latents: torch.Tensor  # [1, C, q0, h, w]: a continuation is decoded after them


class ModelEvaluator:
    """Backbone + method + scorer built from a run config.

    Parameters
    ----------
    cfg : DictConfig
        The root config (``backbone``, ``method``, ``scorer``, ``generation``, ``seed``, ...).
    run_dir : Path
        Where ``videos/`` go (when ``save_videos``).
    """

    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.method = build_method(OmegaConf.to_container(cfg.method, resolve=True))
        self.memory = plan_run(cfg, self.method)  # before loading anything: offloads, or a refusal with numbers
        self.backbone = build_backbone(self.memory.backbone_config)
        self.scorer = build_scorer(OmegaConf.to_container(cfg.scorer, resolve=True))
        self.settings = generation_settings(cfg)
        self.continuation_frames = int(cfg.generation.continuation_frames)
        self.save_videos = bool(cfg.save_videos)

    @property
    def scorer_hash(self) -> str:
        return self.scorer.config_hash

    def context_frames(self, task: Task) -> tuple[np.ndarray, np.ndarray, float]:
        """Frames to prefill, and the frames + fps the reference annotations index.

        MiniWorld rows carry lossless context frames (its mp4s are lossy at 32x32); other data is
        decoded and prepared as the authors' runtime does (resample, resize, pad to whole chunks).

        Returns
        -------
        context : ``uint8 [F, H, W, 3]``
        reference_source : ``uint8 [F', H', W', 3]``
        reference_fps : float
        """
        if MINIWORLD_EXTENSION in task.extra:
            from cmbench.miniworld import load_context

            frames, _ = load_context(task)
            return frames, frames, float(task.extra[MINIWORLD_EXTENSION].get("fps", 16))
        ctx = self.cfg.backbone.context
        original, fps = read_video(task.video_path)  # decoded once: the references index these frames
        context = prepare_frames(original, fps, fps=float(ctx.fps), height=int(ctx.height), width=int(ctx.width),
                                 chunk_latent_frames=self.backbone.geometry.chunk_frames,
                                 temporal_stride=int(ctx.temporal_stride))
        return context, original, fps

    def prepare(self, tasks: list[Task]) -> PreparedContext:
        task = tasks[0]
        context, ref_source, ref_fps = self.context_frames(task)
        latents = self.backbone.encode(torch.from_numpy(np.ascontiguousarray(context)))
        seed = task_seed(int(self.cfg.seed), task.context_id)
        prefilled = prefill(self.backbone, self.method, latents, self.backbone.condition(task), seed, self.settings)
        self.memory.settle(prefilled.cache)  # trimmed to its history, or parked in host memory (the plan)
        return PreparedContext(prefilled, ref_source, ref_fps, latents)

    def evaluate(self, task: Task, prepared: PreparedContext, seed: int) -> dict[str, Any]:
        cont = continue_task(self.backbone, prepared.prefilled, self.backbone.condition(task),
                             self.continuation_frames, seed)
        cont.cache = None  # type: ignore[assignment]  # free the task's KV cache before decoding
        frames = np.asarray(decode_continuation(self.backbone, cont.latents, prepared.context_latents))
        if self.save_videos:
            write_video(self.run_dir / "videos" / f"{task.task_id}.mp4", frames, float(self.cfg.data.fps))
        refs = reference_frames(task, prepared.reference_source, prepared.reference_fps, native=True)
        scored = self.scorer.score_task(task, frames, refs)
        ledger = cont.ledger.summary()
        context_chunks = prepared.prefilled.next_chunk
        return {
            "score": scored.score,
            "detection_rate": scored.detection_rate,
            "similarities": scored.similarities,
            "boxes": scored.boxes,
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
        }
