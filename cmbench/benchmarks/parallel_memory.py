"""The memory behind splitting a model and sharing the prefill (``scripts/bench_parallel_memory.py``).

- :func:`fork_rows`: one task's fork of a prefilled cache, reading the prefilled K/V in place against a
  whole copy: the bytes each allocates, and the bytes of the task's own continuation chunks (the target:
  a shared fork adds only those, plus the prefilled chunks its compaction touches);
- :func:`split_rows`: the most K/V bytes one rank stores when the tiny MiniWorld model runs split over
  ``P`` CPU processes (gloo), against the one-process run (the target: ``1/P`` within 10%).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cmbench.backbones.tiny import CameraPlan, TinyWorldModel
from cmbench.cache import KVCache
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.methods.registry import build_method
from cmbench.benchmarks.split_runs import run_methods, spawn_split

FORK_FIELDS = ("method", "context_chunks", "continuation_chunks", "prefilled_bytes", "copy_fork_bytes",
               "shared_fork_bytes", "own_chunks_bytes", "shared_over_own")
SPLIT_FIELDS = ("method", "ranks", "context_chunks", "one_process_peak_bytes", "rank_peak_bytes", "ratio",
                "target", "within_10pct")


def _kv(cache: KVCache) -> int:
    return sum(2 * b.k.numel() * b.k.element_size() for b in cache.all_banks() if b.k is not None)


def fork_rows(methods: list[dict], context_chunks: int = 24, continuation_chunks: int = 4) -> list[dict]:
    """Per method: the prefilled cache (trimmed), a whole-copy fork and a shared fork, in K/V bytes after
    the continuation (compaction included), with the bytes of the continuation's own chunks."""
    backbone = TinyWorldModel.from_pretrained()
    g = backbone.geometry
    frames = (context_chunks + continuation_chunks) * g.chunk_frames
    plan = CameraPlan(np.arange(frames, dtype=np.int64) * 4 % 256)
    context = torch.randn(1, g.latent_channels, context_chunks * g.chunk_frames, g.latent_height, g.latent_width,
                          generator=torch.Generator().manual_seed(0)).clamp(-1, 1)
    settings = GenerationSettings(compute_attention=False)
    rows = []
    for cfg in methods:
        method = build_method({k: v for k, v in cfg.items() if k != "label"})
        pre = prefill(backbone, method, context, plan, 0, settings=settings)
        pre.cache.trim()
        shared = continue_task(backbone, pre, plan, continuation_chunks * g.chunk_frames, 1)
        copied = continue_task(backbone, pre, plan, continuation_chunks * g.chunk_frames, 1, share_prefill=False)
        row = 2 * g.num_heads * g.head_dim * 4 * g.num_layers  # K and V of a token over every layer, float32
        own = continuation_chunks * g.tokens_per_chunk * row
        rows.append({"method": cfg.get("label", cfg["name"]), "context_chunks": context_chunks,
                     "continuation_chunks": continuation_chunks, "prefilled_bytes": _kv(pre.cache),
                     "copy_fork_bytes": _kv(copied.cache), "shared_fork_bytes": _kv(shared.cache),
                     "own_chunks_bytes": own, "shared_over_own": round(_kv(shared.cache) / own, 4)})
    return rows


def split_rows(methods: list[dict], sizes: tuple[int, ...] = (2, 4), context_chunks: int = 16,
               continuation_chunks: int = 2) -> list[dict]:
    """Per method and group size: the largest per-rank peak of stored K/V over the one-process peak."""
    shape: dict[str, Any] = {"context_chunks": context_chunks, "continuation_chunks": continuation_chunks,
                             "compute_attention": False}
    one = run_methods(methods, **shape)
    rows = []
    for size in sizes:
        ranks = spawn_split(size, methods, **shape)
        for name, ref in one.items():
            peak = max(rank[name]["local_peak"] for rank in ranks)
            ratio = peak / ref["local_peak"]
            rows.append({"method": name, "ranks": size, "context_chunks": context_chunks,
                         "one_process_peak_bytes": ref["local_peak"], "rank_peak_bytes": peak,
                         "ratio": round(ratio, 4), "target": round(1 / size, 4),
                         "within_10pct": abs(ratio * size - 1) <= 0.1})
    return rows
