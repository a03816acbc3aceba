"""WorldKV: a fixed device budget of sink, pose-retrieved chunks and a recent window; history in a host store.

The rule as WorldKV's public code runs it (cvlab-kaist/WorldKV: ``wan/image2video_fast.py``,
``WanI2VFast.generate``, and ``wan/modules/model_fast.py``, ``CausalWanSelfAttention.forward`` and
``_compress_retrieval_kv``; docs/protocol.md lists the facts and CMBench's readings):

- the device holds a fixed budget of ``sink + retrieval_frames + recent`` latent frames, the chunk being
  generated included (WorldKV: ``window_size = sink_size + retrieval_frames + recent_size`` frames, the
  rolling cache the current chunk is written into);
- while no stored chunk can be retrieved (the first chunks), the whole budget is a rolling window: the
  sink and the newest frames, up to the budget;
- once one can, a chunk sees the sink, the retrieved chunks and a recent window of ``recent_chunks``
  chunks plus itself (WorldKV's ``recent_size`` of 6 frames: its own 3-frame chunk and the one before).
  Retrieval slots left unfilled and the tokens compression removed stay free: the recent window does not
  grow into them. Candidates end one chunk before the recent window, so the chunk just before it is
  neither seen nor retrievable (WorldKV excludes ``max(1, recent_size // chunk_size)`` chunks, its recent
  window reads one);
- every chunk that leaves the device is kept in a host store, compressed against its first (anchor) frame:
  the anchor frame whole, and of the other frames the tokens whose key is least similar (cosine over all
  heads) to the anchor frame's mean key, ``ceil(keep_ratio * tokens per frame)`` per non-anchor frame,
  chosen jointly over those frames ("pooled");
- before each chunk, the stored candidates nearest the chunk's camera pose are retrieved:
  ``retrieval_frames // chunk_frames`` chunks with the smallest ``0.5 * d_t / max d_t + 0.5 * d_r / max d_r``,
  ``d_t`` the squared distance of the chunks' mean camera positions and ``d_r`` the geodesic angle between
  their mean rotation matrices.

Retrieved keys keep their own temporal positions (WorldKV's RoPE correction is off by default), as a
kept key would: CMBench restores them at their original places. :class:`StoreRetrieval` holds what this
rule shares with the fixed-window reading (:mod:`cmbench.methods.worldkv_fixed_window`) and key
retrieval (:mod:`cmbench.methods.key_retrieval`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, ClassVar

import torch

from cmbench.cache import Bank, ChunkInfo, HeadGroup, HostStore, KVCache, uniform_layout
from cmbench.cache.kv_cache import BankSelector
from cmbench.cache.store import Segment
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


@dataclass
class StoreRetrieval(Method):
    """History off the device: chunks leaving the device banks are compressed into a host store, and
    chosen stored chunks are restored before each chunk's first model call (not registered: the base of
    ``worldkv``, ``worldkv_fixed_window`` and ``key_retrieval``).

    Subclasses say what the device keeps after each chunk (:meth:`device_keep`), how large a bank may
    grow (:meth:`layout`) and where the candidates end (:meth:`candidate_stop`); the chooser is by camera
    pose (:meth:`chooser`).

    Parameters
    ----------
    retrieval_frames : int
        Retrieval budget in latent frames: ``retrieval_frames // chunk_frames`` stored chunks are brought
        back per chunk. The device budget knob.
    keep_ratio : float
        Share of each non-anchor frame's tokens a stored chunk keeps (WorldKV: 0.5).
    store_max_bytes : int or None
        Bound of the host store (oldest chunks dropped first); ``None``: unbounded, as WorldKV's bank.
    bank_on_device : bool
        Keep the store on the device, as WorldKV's own script runs (``run_retrieval_compress.sh``:
        ``--kv_bank_on_gpu``): the same rows attend and nothing moves over the host link
        (:attr:`HostStore.on_device`); its bytes are then device memory beside the banks' (the board's total
        memory column); ``False``: in host memory, the store's bytes and the bytes moved per chunk beside the
        device bytes.
    """

    family = "retrieval"
    knob: ClassVar[Knob | None] = Knob("retrieval_frames", 0, 512, increasing=False, integer=True)
    knob_minimums: ClassVar[dict[str, float]] = {"retrieval_frames": 0, "keep_ratio": 0, "store_max_bytes": 0}

    retrieval_frames: int = 18
    keep_ratio: float = 0.5
    store_max_bytes: int | None = None
    bank_on_device: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.keep_ratio <= 1.0:
            raise ConfigError(f"{self.name}: keep_ratio must be in (0, 1], got {self.keep_ratio}")

    def needs(self) -> Needs:
        return Needs(poses=True)

    def host_store(self) -> HostStore | None:
        return HostStore("cpu", self.store_max_bytes, on_device=self.bank_on_device)

    def retrieved_chunks(self, geometry) -> int:
        """Stored chunks brought back per chunk (retrieval slots)."""
        return self.retrieval_frames // geometry.chunk_frames

    def stored_tokens_per_chunk(self, geometry) -> int:
        """Tokens of a chunk the store keeps: the anchor frame and ``ceil(keep_ratio * T)`` per other frame."""
        T, f = geometry.tokens_per_frame, geometry.chunk_frames
        per_frame = max(1, math.ceil(self.keep_ratio * T))
        return f * T if per_frame >= T or f == 1 else T + (f - 1) * per_frame

    def bank_layout(self, geometry, history_tokens: int) -> list[list[HeadGroup]]:
        """One bank per layer of at most ``history_tokens`` (capped by ``max_history_tokens``)."""
        if self.max_history_tokens is not None:
            history_tokens = min(history_tokens, self.max_history_tokens)
        return uniform_layout(geometry.num_layers, geometry.num_heads, "all", history_tokens)

    # ------------------------------------------------------------------ retrieval
    def candidate_stop(self, index: int) -> int:
        """Stored chunks below this index (and not in the sink) may be retrieved for chunk ``index``
        (default: up to the recent window)."""
        return index - self.recent_chunks

    def candidates(self, cache: KVCache, chunk: ChunkInfo) -> list[int]:
        """Stored chunks that may be retrieved for ``chunk``: from the sink's end to :meth:`candidate_stop`."""
        assert cache.store is not None
        stop = self.candidate_stop(chunk.index)
        return [c for c in cache.store.stored_chunks() if self.sink_chunks <= c < stop]

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
    def device_keep(self, sig: ChunkSignals) -> BankSelector:
        """The history rows the device keeps once ``sig.chunk`` is committed (default: sink + recent window)."""
        return lambda bank: self.protected(bank, sig.chunk)

    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        """Store a compressed copy of every chunk that starts leaving the device, drop what
        :meth:`device_keep` does not keep (restored rows included: the store holds them), then enforce
        ``max_history_tokens``."""
        newest = sig.chunk
        keep = self.device_keep(sig)
        store = cache.store
        assert store is not None
        T = sig.geometry.tokens_per_frame
        masks: dict[int, torch.Tensor] = {}
        for bank in cache.all_banks():
            mask = masks[id(bank)] = keep(bank)
            chunk = bank.field("chunk")
            for c in torch.unique(chunk[~mask]).tolist():
                info = cache.chunk(c)
                rows = (chunk == c).nonzero().squeeze(1)
                if len(rows) != info.length:  # stored when its first rows left (or restored compressed)
                    continue
                keys = bank.gather(rows)[0]
                keys = keys.reshape(keys.shape[0], info.num_frames, T, *keys.shape[2:])
                kept = rows[anchor_novelty_keep(keys, self.keep_ratio, partial(head_sums, cache))]
                store.put((bank.layer, bank.group), Segment(*bank.extract(kept)))
        cache.compact(lambda bank: masks[id(bank)])
        self._enforce_limits(cache, newest)


@register
@dataclass
class WorldKV(StoreRetrieval):
    """A fixed device budget as WorldKV fills it: sink + pose-retrieved chunks + recent window, the chunk
    being generated included; a rolling window of the whole budget while nothing can be retrieved.

    Parameters
    ----------
    recent_chunks : int
        Committed chunks of the recent window once retrieval runs; with the chunk being generated, WorldKV's
        ``recent_size`` (6 frames: two of its 3-frame chunks, its own and the one before). Default 1.
    retrieval_frames : int
        Retrieval budget in latent frames (``retrieval_frames // chunk_frames`` slots). Default 24: the
        run script's 18 frames are 6 of WorldKV's 3-frame chunks, 6 of CMBench's 4-frame chunks are 24.
    keep_ratio, store_max_bytes
        As :class:`StoreRetrieval`.

    The device budget (:meth:`budget_frames`) is ``sink_chunks * chunk_frames + retrieval_frames +
    (recent_chunks + 1) * chunk_frames`` latent frames: 36 by default, WorldKV's 27 frames (9 chunks of 3)
    as 9 chunks of 4.
    """

    name = "worldkv"
    description = ("a fixed device budget (current chunk included): sink + recent window + the stored chunks nearest "
                   "the camera pose, compressed against their anchor frame in a host store; a rolling window of the "
                   "whole budget until a chunk can be retrieved")
    paper = "https://arxiv.org/abs/2605.22718"
    paper_title = "WorldKV, arXiv 2605.22718"

    retrieval_frames: int = 24

    def budget_frames(self, geometry) -> int:
        """Latent frames on the device while a chunk is denoised, that chunk included."""
        return (self.sink_chunks + self.recent_chunks + 1) * geometry.chunk_frames + self.retrieval_frames

    def layout(self, geometry) -> list[list[HeadGroup]]:
        """One bank per layer sized for the budget less the chunk being generated."""
        return self.bank_layout(geometry, (self.budget_frames(geometry) - geometry.chunk_frames) * geometry.tokens_per_frame)

    def candidate_stop(self, index: int) -> int:
        """One chunk before the recent window: the chunk just before it is neither seen nor retrieved."""
        return index - self.recent_chunks - 1

    def retrieves(self, index: int, geometry) -> bool:
        """Whether chunk ``index`` retrieves: it has retrieval slots and a chunk index to retrieve."""
        return self.retrieved_chunks(geometry) > 0 and self.candidate_stop(index) > self.sink_chunks

    def device_keep(self, sig: ChunkSignals) -> BankSelector:
        """For the next chunk: sink + recent window when it retrieves, else sink + the newest frames up to
        the budget less that chunk (a rolling window)."""
        g, newest = sig.geometry, sig.chunk
        if self.retrieves(newest.index + 1, g):
            return super().device_keep(sig)
        first = newest.frame_end - (self.budget_frames(g) - (self.sink_chunks + 1) * g.chunk_frames)
        return lambda bank: (bank.field("chunk") < self.sink_chunks) | (bank.field("frame") >= first)
