"""A split run against the one-process run on the same model and inputs (the CPU tests, the GPU check
and the benchmark use it).

:func:`run_methods` prefills a context and generates one continuation per method and returns, per method,
what a record depends on: the continuation latents, both PR ledgers' summaries, the kept tokens per
chunk, the history every (layer, global head) holds at the end and while each chunk is denoised (its
token ids: the keep masks, and the tokens a retrieval method restored), plus this
rank's own peak of stored K/V bytes and its allocated K/V bytes after every chunk (prefill, then the
task's fork). :func:`spawn_split` runs it on ``P`` processes (gloo on CPU).
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cmbench.backbones.tiny import CameraPlan, TinyWorldModel
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.methods.registry import build_method
from cmbench.parallel.sequence import SequenceGroup
from cmbench.parallel.split import split_backbone


def head_histories(cache) -> dict[tuple[int, int], list[int]]:
    """``(layer, global head) -> token ids`` the head holds, over every rank of a split cache."""
    offset = getattr(cache, "head_offset", 0)
    local = {(bank.layer, h + offset): bank.field("gid").tolist() for bank in cache.all_banks() for h in bank.group.heads}
    group = getattr(cache, "group", None)
    if group is None:
        return local
    every: list[Any] = [None] * group.size
    dist.all_gather_object(every, local, group=group.group)
    return {k: v for part in every for k, v in part.items()}


def run_methods(methods: list[dict], context_chunks: int = 4, continuation_chunks: int = 2,
                group: SequenceGroup | None = None, seed: int = 0, compute_attention: bool = True) -> dict[str, dict]:
    """Prefill and continue the committed tiny MiniWorld model under each method (split over ``group``;
    ``compute_attention=False``: the caches store and account as usual, attention outputs are zeros)."""
    backbone = TinyWorldModel.from_pretrained()
    if group is not None:
        split_backbone(backbone, group)
    g = backbone.geometry
    frames = (context_chunks + continuation_chunks) * g.chunk_frames
    plan = CameraPlan(np.arange(frames, dtype=np.int64) * 4 % 256)
    context = torch.randn(1, g.latent_channels, context_chunks * g.chunk_frames, g.latent_height, g.latent_width,
                          generator=torch.Generator().manual_seed(seed)).clamp(-1, 1)
    out = {}
    for cfg in methods:
        method = build_method({k: v for k, v in cfg.items() if k != "label"})
        peaks: dict[str, Any] = {"local": 0, "allocated": []}

        def note(cache, sig, peaks=peaks):
            local = getattr(cache, "local_stored_bytes", cache.stored_bytes)()
            peaks["local"] = max(peaks["local"], local)
            peaks["allocated"].append(sum(2 * b.k.numel() * b.k.element_size() for b in cache.all_banks()
                                          if b.k is not None))

        seen: dict[int, dict[tuple[int, int], list[int]]] = {}

        def see(cache, info, seen=seen):
            seen[info.index] = head_histories(cache)

        settings = GenerationSettings(compute_attention=compute_attention)
        pre = prefill(backbone, method, context, plan, seed, settings=settings, on_chunk_end=note,
                      on_before_denoise=see)
        cont = continue_task(backbone, pre, plan, continuation_chunks * g.chunk_frames, seed + 1, on_chunk_end=note,
                             on_before_denoise=see)
        name = cfg.get("label", cfg["name"])
        out[name] = {"latents": cont.latents, "context": pre.ledger.summary(), "generation": cont.ledger.summary(),
                     "kept": cont.kept_tokens, "heads": head_histories(cont.cache), "seen": seen, "local_peak": peaks["local"],
                     "allocated": peaks["allocated"]}
    return out


def _worker(rank: int, size: int, port: int, methods: list[dict], kwargs: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        result = run_methods(methods, group=SequenceGroup(rank, size, check_masks=True), **kwargs)
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_split(size: int, methods: list[dict], **kwargs) -> list[dict[str, dict]]:
    """:func:`run_methods` on ``size`` CPU processes (gloo); every rank's results, in rank order."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(size, free_port(), methods, kwargs, tmp), nprocs=size, join=True)
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(size)]
