"""ForcingKV: static heads keep sink + recent; dynamic heads add the K least redundant patches."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cmbench.cache import Bank, ChunkInfo, HeadGroup, KVCache
from cmbench.errors import ConfigError
from cmbench.methods.base import ChunkSignals, ScoredMethod
from cmbench.methods.head_map import HeadMap
from cmbench.methods.registry import register


def key_dissimilarity(bank: Bank, chunk_length: int, frame_start: int, tokens_per_frame: int) -> torch.Tensor:
    """``1 - cos`` between each key of the newest chunk and the same patch's key one frame earlier.

    The newest chunk is the last ``chunk_length`` rows of ``bank`` (just committed, still dense).
    Cosine similarity is averaged over the bank's heads and the batch. A first frame whose preceding
    frame is not fully in the bank scores ``+inf``.

    Returns
    -------
    Tensor, shape ``[chunk_length]``, float32.
    """
    T = tokens_per_frame
    keys = bank.k[:, bank.n - chunk_length : bank.n].float()  # [B, L, Hg, D]
    prev_rows = (bank.field("frame") == frame_start - 1).nonzero().squeeze(1)
    if len(prev_rows) == T:
        prev = bank.k[:, prev_rows.to(keys.device)].float()
    else:
        prev = torch.full_like(keys[:, :T], float("nan"))
    before = torch.cat([prev, keys[:, :-T]], dim=1)
    score = (1.0 - F.cosine_similarity(keys, before, dim=-1, eps=1e-8)).mean(dim=(0, 2)).cpu()
    return torch.nan_to_num(score, nan=float("inf"))


@register
@dataclass
class ForcingKV(ScoredMethod):
    """Static heads: sink + recent window. Dynamic heads: also the ``k`` patches with the lowest key
    cosine similarity to the same patch in the previous frame, among the preceding ``history_chunks``
    chunks (scored per layer and bank).

    Parameters
    ----------
    head_map : str or None
        Head-map JSON (static / dynamic heads); ``None``: every head dynamic.
    k : int
        Patches kept per dynamic head beyond the sink and recent window.
    history_chunks : int
        Only chunks at most this many chunks older than the newest are candidates.
    """

    name = "forcingkv"
    description = ("static heads: sink + recent; dynamic heads: + K patches with the lowest key cosine similarity "
                   "to the previous frame")
    paper = "https://arxiv.org/abs/2605.09681"
    paper_title = "ForcingKV, arXiv 2605.09681"

    head_map: str | None = None
    k: int = 256
    history_chunks: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k < 0 or self.history_chunks < 0:
            raise ConfigError(f"{self.name}: k and history_chunks must be >= 0")
        if self.recent_chunks < 1:
            raise ConfigError(f"{self.name}: needs recent_chunks >= 1 (the previous frame's keys must still be stored)")

    def layout(self, geometry) -> list[list[HeadGroup]]:
        static_size = self.window_size(geometry)
        dyn_size = None if self.budget_mode else static_size + self.k
        if self.max_history_tokens is not None:
            dyn_size = self.max_history_tokens if dyn_size is None else min(dyn_size, self.max_history_tokens)
        if self.head_map:
            hmap = HeadMap.load_for(self.head_map, geometry, self.name)
        else:
            hmap = HeadMap.all_dynamic(geometry.num_layers, geometry.num_heads)
        return hmap.layout(dyn_size, static_size)

    def budgeted(self, bank: Bank) -> bool:
        return bank.role == "dynamic"

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        info = sig.chunk
        T = sig.geometry.tokens_per_frame
        for bank in self.scored_banks(cache):
            score = key_dissimilarity(bank, info.length, info.frame_start, T)
            cache.mark(info.index, priority=score, banks=[bank])

    def rule(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        keep = self.protected(bank, newest)
        if bank.role == "static":
            return keep
        candidates = (~keep & (bank.field("chunk") >= newest.index - self.history_chunks)).nonzero().squeeze(1)
        order = torch.sort(bank.field("priority")[candidates], descending=True, stable=True).indices
        keep[candidates[order[: self.k]]] = True
        return keep
