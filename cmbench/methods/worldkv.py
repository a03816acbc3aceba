"""WorldKV: evicted chunks kept in a host store, compressed, and brought back by camera pose.

The rule as WorldKV's public code runs it (cvlab-kaist/WorldKV, ``wan/image2video_fast.py`` and
``wan/modules/model_fast.py``; docs/protocol.md lists the facts and CMBench's readings):

- the device holds the sink, the recent window and the retrieved chunks;
- every chunk that leaves the recent window is compressed against its first (anchor) frame and kept
  in a host bank: the anchor frame whole, and of the other frames the tokens whose key is least
  similar (cosine over all heads) to the anchor frame's mean key, ``ceil(keep_ratio * tokens per
  frame)`` per non-anchor frame, chosen jointly over those frames ("pooled");
- before each chunk, the stored chunks (sink and recent window excluded) nearest the chunk's camera
  pose are retrieved: ``retrieval_frames // chunk_frames`` chunks with the smallest
  ``0.5 * d_t / max d_t + 0.5 * d_r / max d_r``, ``d_t`` the squared distance of the chunks' mean camera
  positions and ``d_r`` the geodesic angle between their mean rotation matrices.

Retrieved keys keep their own temporal positions (WorldKV's RoPE correction is off by default), as a
kept key would: CMBench restores them at their original places.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, ClassVar

import torch

from cmbench.cache import Bank, ChunkInfo, HeadGroup, HostStore, KVCache, uniform_layout
from cmbench.errors import ConfigError
from cmbench.methods.base import BeforeChunk, ChunkSignals, Method, Needs
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import register
from cmbench.parallel.cache import head_sums


def anchor_novelty_keep(keys: torch.Tensor, keep_ratio: float,
                        over_heads: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """WorldKV's store-time compression of one chunk: which tokens stay.

    Parameters
    ----------
    keys : Tensor, shape ``[B, f, T, H, D]``
        The chunk's keys by frame (``f`` frames of ``T`` tokens).
    keep_ratio : float
        Share of a frame's tokens kept per non-anchor frame (``ceil(keep_ratio * T)``, at least 1).
    over_heads : callable or None
        Turns sums over the ``H`` heads of ``keys`` (a ``[B, 2 (f - 1) T + 1]`` tensor) into sums over
        every head of the model: :func:`~cmbench.parallel.cache.head_sums` of a rank's cache under a
        split, where ``keys`` holds the rank's heads only; ``None``: ``keys`` holds every head.

    Returns
    -------
    Tensor, ``bool [f * T]``: the anchor frame (frame 0) whole, and the ``(f - 1) * ceil(keep_ratio * T)``
    tokens of the other frames least similar to the anchor frame's mean key (cosine over heads and
    channels, summed over the batch), chosen jointly over those frames.
    """
    _, f, T, _, _ = keys.shape
    keep = torch.zeros(f * T, dtype=torch.bool)
    keep[:T] = True
    per_frame = max(1, math.ceil(keep_ratio * T))
    if per_frame >= T or f == 1:
        keep[:] = True
        return keep
    centroid = keys[:, 0].float().mean(dim=1)  # [B, H, D]
    rest = keys[:, 1:].float().flatten(1, 2)  # [B, (f-1) T, H, D]
    n = rest.shape[1]
    sums = torch.cat([(rest * centroid[:, None]).sum(dim=(-2, -1)), rest.pow(2).sum(dim=(-2, -1)),
                      centroid.pow(2).sum(dim=(-2, -1))[:, None]], dim=1)  # [B, 2 (f-1) T + 1]
    if over_heads is not None:
        sums = over_heads(sums)
    dot, rest_sq, centroid_sq = sums[:, :n], sums[:, n : 2 * n], sums[:, 2 * n :]
    sim = (dot / (rest_sq.sqrt() * centroid_sq.sqrt() + 1e-8)).sum(dim=0).cpu()  # [(f-1) T]
    order = torch.sort(sim, stable=True).indices[: (f - 1) * per_frame]
    keep[T + order] = True
    return keep


def pose_distance(current: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """WorldKV's retrieval distance between mean poses.

    Parameters
    ----------
    current : Tensor, shape ``[4, 4]``
        Mean camera-to-world matrix of the chunk about to be denoised (entrywise mean over its frames).
    candidates : Tensor, shape ``[N, 4, 4]``
        The same for each stored chunk.

    Returns
    -------
    Tensor, shape ``[N]``: ``0.5 * d_t / max(d_t) + 0.5 * d_r / max(d_r)`` (a term whose maximum is 0
    stays 0), ``d_t`` the squared distance of positions, ``d_r`` the geodesic angle
    ``arccos((trace(R_c^T R) - 1) / 2)`` of the rotation blocks.
    """
    d_t = (candidates[:, :3, 3] - current[:3, 3]).pow(2).sum(dim=-1)
    rel = candidates[:, :3, :3].transpose(-1, -2) @ current[:3, :3]
    d_r = torch.acos(((rel.diagonal(dim1=-2, dim2=-1).sum(dim=-1) - 1.0) / 2.0).clamp(-1.0, 1.0))

    def scaled(d: torch.Tensor) -> torch.Tensor:
        top = d.max()
        return d / top if top > 0 else d

    return 0.5 * scaled(d_t) + 0.5 * scaled(d_r)


@register
@dataclass
class WorldKV(Method):
    """Sink + recent window on the device; older chunks compressed into a host store and retrieved by
    camera pose before each chunk.

    Parameters
    ----------
    recent_chunks : int
        Dense recent window (WorldKV: 6 latent frames, two of its 3-frame chunks).
    retrieval_frames : int
        Retrieval budget in latent frames: ``retrieval_frames // chunk_frames`` stored chunks are
        brought back per chunk (WorldKV's run script: 18). The device budget knob.
    keep_ratio : float
        Share of each non-anchor frame's tokens a stored chunk keeps (WorldKV: 0.5).
    store_max_bytes : int or None
        Bound of the host store (oldest chunks dropped first); ``None``: unbounded, as WorldKV's bank.
    """

    name = "worldkv"
    description = ("sink + recent window; older chunks compressed against their anchor frame into a host store, "
                   "the chunks nearest the camera pose brought back before each chunk")
    paper = "https://arxiv.org/abs/2605.22718"
    paper_title = "WorldKV, arXiv 2605.22718"
    knob = Knob("retrieval_frames", 0, 512, increasing=False, integer=True)

    knob_minimums: ClassVar[dict[str, float]] = {"retrieval_frames": 0, "keep_ratio": 0, "store_max_bytes": 0}

    recent_chunks: int = 2
    retrieval_frames: int = 18
    keep_ratio: float = 0.5
    store_max_bytes: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.keep_ratio <= 1.0:
            raise ConfigError(f"{self.name}: keep_ratio must be in (0, 1], got {self.keep_ratio}")

    def needs(self) -> Needs:
        return Needs(poses=True)

    def host_store(self) -> HostStore | None:
        return HostStore("cpu", self.store_max_bytes)

    def retrieved_chunks(self, geometry) -> int:
        """Stored chunks brought back per chunk."""
        return self.retrieval_frames // geometry.chunk_frames

    def stored_tokens_per_chunk(self, geometry) -> int:
        """Tokens of a chunk the store keeps: the anchor frame and ``ceil(keep_ratio * T)`` per other frame."""
        T, f = geometry.tokens_per_frame, geometry.chunk_frames
        per_frame = max(1, math.ceil(self.keep_ratio * T))
        return f * T if per_frame >= T or f == 1 else T + (f - 1) * per_frame

    def layout(self, geometry) -> list[list[HeadGroup]]:
        """One bank per layer sized for the sink, the recent window and the retrieved chunks."""
        size = (self.sink_chunks + self.recent_chunks + self.retrieved_chunks(geometry)) * geometry.tokens_per_chunk
        if self.max_history_tokens is not None:
            size = min(size, self.max_history_tokens)
        return uniform_layout(geometry.num_layers, geometry.num_heads, "all", size)

    # ------------------------------------------------------------------ retrieval
    def candidates(self, cache: KVCache, chunk: ChunkInfo) -> list[int]:
        """Stored chunks that may be retrieved for ``chunk``: outside the sink and the recent window."""
        assert cache.store is not None
        return [c for c in cache.store.stored_chunks() if self.sink_chunks <= c < chunk.index - self.recent_chunks]

    def chooser(self, cache: KVCache, sig: BeforeChunk, candidates: list[int]) -> Callable[[Bank], list[int]]:
        """``bank -> candidates to bring back into it``: the nearest by camera pose, one choice for every
        bank (chosen once per chunk)."""
        poses = sig.poses
        assert poses is not None, "the loop hands poses to a method that needs them"
        current = poses[sig.chunk.frame_start : sig.chunk.frame_end].mean(dim=0)
        stored = torch.stack([poses[cache.chunk(c).frame_start : cache.chunk(c).frame_end].mean(dim=0)
                              for c in candidates])
        dist = pose_distance(current, stored)
        order = torch.sort(dist, stable=True).indices[: self.retrieved_chunks(sig.geometry)]
        chosen = sorted(candidates[i] for i in order.tolist())
        return lambda bank: chosen

    def before_denoise(self, cache: KVCache, sig: BeforeChunk) -> None:
        """Restore the chosen stored chunks into every bank."""
        candidates = self.candidates(cache, sig.chunk)
        if not candidates or self.retrieved_chunks(sig.geometry) == 0:
            return
        store = cache.store
        assert store is not None
        choice = self.chooser(cache, sig, candidates)
        cache.restore(lambda bank: store.gids((bank.layer, bank.group), choice(bank)))

    # ------------------------------------------------------------------ eviction
    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        """Compress the chunk leaving the recent window, then move every unprotected row (that chunk and
        the retrieved ones) to the store."""
        newest = sig.chunk
        leaving = newest.index - self.recent_chunks
        if leaving >= self.sink_chunks and self.keep_ratio < 1.0:
            info = cache.chunk(leaving)
            g = sig.geometry
            masks: dict[int, torch.Tensor] = {}
            for bank in cache.all_banks():
                rows = (bank.field("chunk") == leaving).nonzero().squeeze(1)
                if len(rows) != info.length:  # already compressed (or never stored whole)
                    continue
                keys = bank.gather(rows)[0]
                keys = keys.reshape(keys.shape[0], info.num_frames, g.tokens_per_frame, *keys.shape[2:])
                keep = torch.ones(bank.n, dtype=torch.bool)
                keep[rows] = anchor_novelty_keep(keys, self.keep_ratio, partial(head_sums, cache))
                masks[id(bank)] = keep
            cache.compact(lambda bank: masks.get(id(bank), torch.ones(bank.n, dtype=torch.bool)))
        cache.compact(lambda bank: self.protected(bank, newest), to_store=True)
        self._enforce_limits(cache, newest)
