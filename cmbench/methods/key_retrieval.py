"""Key retrieval: WorldKV's store and compression, with chunks brought back by query-key similarity.

The pose-free counterpart of :mod:`cmbench.methods.worldkv_fixed_window`, on its device window (the
retrieval signal of InfLLM- and Quest-style LLM methods): before each chunk, its first denoising call is run once in a probe to read
each layer's queries, and every bank brings back the stored chunks whose keys the chunk's queries
score highest: ``mean over heads of <q_h, k_h>``, with ``q_h`` the chunk's mean query and ``k_h`` the
stored chunk's mean key of head ``h``, i.e. the mean attention logit between the chunk's queries and
that chunk's stored keys. Works on data without camera poses (the official videos).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from cmbench.cache import Bank, KVCache
from cmbench.methods.base import BeforeChunk, Needs
from cmbench.methods.registry import register
from cmbench.methods.worldkv_fixed_window import WorldKVFixedWindow
from cmbench.parallel.cache import head_sums, model_totals


@register
@dataclass
class KeyRetrieval(WorldKVFixedWindow):
    """The fixed-window WorldKV's device window, store and compression; stored chunks retrieved per layer
    by the mean attention logit of the chunk's queries (measured in a probe of its first call) to their keys.

    Parameters are :class:`~cmbench.methods.worldkv_fixed_window.WorldKVFixedWindow`'s; ``retrieval_frames``
    is the device budget knob.
    """

    name = "key_retrieval"
    description = ("`worldkv_fixed_window`'s window, store and compression without poses: each layer brings back the "
                   "stored chunks whose keys the chunk's queries (probe of its first call) score highest")
    paper = ""
    paper_title = ""

    def needs(self) -> Needs:
        return Needs(query_probe=True)

    def chooser(self, cache: KVCache, sig: BeforeChunk, candidates: list[int]) -> Callable[[Bank], list[int]]:
        """``bank -> candidates to bring back into it``, chosen per bank (:meth:`choose`)."""
        return partial(self.choose, cache, sig, candidates)

    def choose(self, cache: KVCache, sig: BeforeChunk, candidates: list[int], bank: Bank) -> list[int]:
        """The candidates whose stored keys score highest against the chunk's queries in this bank."""
        queries = sig.queries
        assert queries is not None, "the loop hands queries to a method that asks for them"
        assert cache.store is not None
        q = queries[bank.layer][:, bank.heads.to(queries[bank.layer].device)].float()  # [B, Hg, D]
        held = cache.store.chunks((bank.layer, bank.group))
        # per candidate: <q_h, k_h> summed over the batch and the bank's heads (this rank's, under a split)
        dots = torch.stack([(held[c].k.float().mean(dim=1).to(q.device) * q).sum(dim=-1).sum().cpu()
                            for c in candidates])
        (heads,) = model_totals(cache, bank.num_heads)
        scores = head_sums(cache, dots) / (q.shape[0] * heads)
        order = torch.sort(scores, descending=True, stable=True).indices[: self.retrieved_chunks(sig.geometry)]
        return sorted(candidates[i] for i in order.tolist())
