"""Random: DeCoPrune's windows and per-chunk counts, random tokens (the paper's selection control)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from cmbench.cache import KVCache
from cmbench.errors import ConfigError
from cmbench.hashing import seeded_generator
from cmbench.methods.base import ChunkSignals, Needs
from cmbench.methods.decoprune import DeCoPrune
from cmbench.methods.registry import register


@register
@dataclass
class RandomTokens(DeCoPrune):
    """For every chunk, as many tokens as DeCoPrune's threshold keeps in it, chosen at random.

    The count comes from this run's own scores (the probe and ``gamma`` of :class:`DeCoPrune`, whose
    knobs and window timing it shares); which tokens is a seeded draw from ``(seed, run seed, chunk)``.
    This is the paper's control (the authors' harness: the keep count of DeCoPrune's mask for the
    chunk, indices from a seeded generator), so it runs at DeCoPrune's PR chunk by chunk.

    Parameters
    ----------
    keep_counts : mapping of int to int, optional
        Exact tokens kept per chunk index instead (e.g. another run's per-chunk counts, to match that
        run chunk by chunk); every chunk that gets pruned must be listed, and no probe runs. Budget
        mode (``quota_pr`` / ``quota_tokens``) keeps the highest random priorities instead.
    seed : int
        Mixed with the run seed and the chunk index.
    """

    name = "random"
    description = "random history tokens, as many per chunk as DeCoPrune's threshold keeps (the selection control)"
    paper = "https://arxiv.org/abs/2609.39096"
    paper_title = "DeCoPrune, arXiv 2609.39096"

    keep_counts: Mapping[int, int] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.keep_counts is not None:
            try:
                self.keep_counts = {int(k): int(v) for k, v in dict(self.keep_counts).items()}
            except (TypeError, ValueError) as err:
                raise ValueError(f"keep_counts={self.keep_counts!r}: expected a mapping of chunk index to tokens "
                                 f"kept, e.g. {{4: 10}}") from err

    def needs(self) -> Needs:
        """DeCoPrune's probe, unless the counts are given or quota mode draws them (no scores then)."""
        return Needs() if self.keep_counts is not None or self.quota_mode else super().needs()

    def keep_count(self, sig: ChunkSignals) -> int:
        """Tokens of the committed chunk to keep: DeCoPrune's count from the scores, or ``keep_counts``."""
        info = sig.chunk
        if self.keep_counts is None:
            return int(self.keep_mask(self.token_scores(sig), sig).sum())
        if info.index not in self.keep_counts:
            raise ConfigError(f"{self.name}: keep_counts has no entry for chunk {info.index}")
        count = self.keep_counts[info.index]
        if not 0 <= count <= info.length:
            raise ConfigError(f"{self.name}: keep_counts[{info.index}] = {count} is outside 0..{info.length}")
        return count

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        info = sig.chunk
        if info.index < self.sink_chunks:
            return
        priority = torch.rand(info.length, generator=seeded_generator("random", self.seed, sig.seed, info.index))
        keep = torch.zeros(info.length, dtype=torch.bool)
        if not self.quota_mode:
            keep[priority.argsort(descending=True)[: self.keep_count(sig)]] = True
        cache.mark(info.index, keep=keep, priority=priority, banks=self.scored_banks(cache))
