"""Keep the K tokens of every chunk whose keys have the largest norm."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cmbench.cache import KVCache
from cmbench.methods.base import ChunkSignals, ScoredMethod
from cmbench.methods.knobs import Knob


@dataclass
class KeyNorm(ScoredMethod):
    """Per chunk, keep the ``k`` tokens whose keys (at ``layer``, mean over heads) have the largest L2 norm.

    Parameters
    ----------
    k : int
        Tokens kept per chunk when it leaves the recent window.
    layer : int
        Layer whose stored keys are scored.
    """

    name = "key_norm"
    description = "the k tokens per chunk with the largest key norm"
    # the knob that sets its pruning ratio, for `calibrate`, `curves` and method.target_pr:
    # whole values from 1 to 65536 searched on a log scale; a larger k keeps more (prunes less)
    knob = Knob("k", 1, 2**16, increasing=False, log=True, integer=True)

    k: int = 64
    layer: int = 0

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        info = sig.chunk
        # [B, f, T, H, D]: the chunk's keys at one layer, every head
        keys = cache.frame_keys(self.layer, range(info.frame_start, info.frame_end))
        if keys is None:  # part of the chunk is not stored in this layer
            return
        norm = keys.float().norm(dim=-1).mean(dim=(0, 3)).flatten()  # [f * T] = [L], token order
        keep = torch.zeros(info.length, dtype=torch.bool)
        keep[norm.topk(min(self.k, info.length)).indices] = True
        cache.mark(info.index, keep=keep, priority=norm, banks=self.scored_banks(cache))
