"""Random: DeCoPrune's windows with random history tokens (the selection control)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from cmbench.cache import KVCache
from cmbench.errors import ConfigError
from cmbench.methods.base import ChunkSignals, ScoredMethod
from cmbench.methods.registry import register
from cmbench.hashing import seeded_generator


@register
@dataclass
class RandomTokens(ScoredMethod):
    """Keep a random subset of each chunk when it leaves the window; deterministic by seed.

    Parameters
    ----------
    keep_ratio : float
        Fraction of each chunk's tokens kept (``round(keep_ratio * L)``).
    keep_counts : mapping of int to int, optional
        Exact tokens kept per chunk index (e.g. another method's per-chunk counts, to match its pruning
        ratio chunk by chunk); every chunk that gets pruned must be listed.
    seed : int
        Mixed with the run seed and the chunk index.
    """

    name = "random"
    description = "random history tokens with DeCoPrune's windows (the selection control)"
    paper = "https://arxiv.org/abs/2609.39096"
    paper_title = "DeCoPrune, arXiv 2609.39096"

    keep_ratio: float = 0.15
    keep_counts: Mapping[int, int] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.keep_ratio <= 1.0:
            raise ConfigError(f"{self.name}: keep_ratio must be in [0, 1], got {self.keep_ratio}")
        if self.keep_counts is not None:
            self.keep_counts = {int(k): int(v) for k, v in dict(self.keep_counts).items()}

    def keep_count(self, chunk: int, length: int) -> int:
        if self.keep_counts is None:
            return round(self.keep_ratio * length)
        if chunk not in self.keep_counts:
            raise ConfigError(f"{self.name}: keep_counts has no entry for chunk {chunk}")
        count = self.keep_counts[chunk]
        if not 0 <= count <= length:
            raise ConfigError(f"{self.name}: keep_counts[{chunk}] = {count} is outside 0..{length}")
        return count

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        info = sig.chunk
        if info.index < self.sink_chunks:
            return
        priority = torch.rand(info.length, generator=seeded_generator("random", self.seed, sig.seed, info.index))
        keep = torch.zeros(info.length, dtype=torch.bool)
        if not self.budget_mode:
            keep[priority.argsort(descending=True)[: self.keep_count(info.index, info.length)]] = True
        cache.mark(info.index, keep=keep, priority=priority)
