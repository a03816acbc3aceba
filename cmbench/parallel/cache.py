"""The KV cache of one rank of a sequence-parallel group: ``heads / P`` heads of every layer.

Methods see the same interface as on one process and decide from replicated signals (the gathered
``x0`` predictions, provenance), so a token mask is the same on every rank and each rank compacts its
own heads. What depends on every head is reduced over the group first:

- head groups (DeCoPrune-HS, ForcingKV, DummyForcing) are given with global head indices; each rank
  keeps the part of every group that falls in its heads (:func:`local_layout`, :meth:`regroup`);
- :meth:`frame_keys` gathers every rank's heads, :meth:`record_attention` gathers every rank's per-head
  attention mass before the method reads it;
- :func:`model_totals` sums a method's per-head counts over the group (quota mode's allowance), and
  :func:`head_sums` a method's per-head partial sums (the retrieval methods' cosine to an anchor
  frame and mean query-key logit);
- :meth:`visible_counts` (the PR ledger) is the global ``[layers, heads]`` table and :meth:`stored_bytes`
  the sum over ranks; the host store's bytes are a rank's times :meth:`store_shares` (equal shares), so a
  record equals the one-process run's;
  :meth:`local_stored_bytes` is this rank's own.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

from cmbench.cache.attention_stats import AttentionStats
from cmbench.cache.bank import Bank
from cmbench.cache.kv_cache import KVCache
from cmbench.cache.layout import HeadGroup, Layout, uniform_layout
from cmbench.parallel.sequence import SequenceGroup, check_heads


def local_groups(groups: Sequence[HeadGroup], first: int, count: int) -> list[HeadGroup]:
    """The part of each global head group in heads ``first .. first + count - 1``, as local indices."""
    out = []
    for g in groups:
        heads = tuple(h - first for h in g.heads if first <= h < first + count)
        if heads:
            out.append(HeadGroup(heads, g.role, g.max_tokens))
    return out


def local_layout(layout: Layout, first: int, count: int) -> list[list[HeadGroup]]:
    """:func:`local_groups` of every layer."""
    return [local_groups(groups, first, count) for groups in layout]


def model_totals(cache: KVCache, *counts: int) -> tuple[int, ...]:
    """``counts`` of ``cache``'s heads as totals over every head of the model: summed over the ranks of a
    :class:`ShardedKVCache`, unchanged on one process (for a decision that weighs heads against each
    other, e.g. a quota shared by the budgeted heads)."""
    if isinstance(cache, ShardedKVCache):
        return tuple(cache.group.sum_each(list(counts)))
    return counts


def head_sums(cache: KVCache, partial: torch.Tensor) -> torch.Tensor:
    """Sums over ``cache``'s heads (``partial``, any shape) as sums over every head of the model: summed
    elementwise over the ranks of a :class:`ShardedKVCache`, unchanged on one process (for a decision
    that reduces over heads, e.g. a cosine over heads and channels or a mean logit over heads; the
    caller divides the totals as one process does)."""
    if isinstance(cache, ShardedKVCache):
        return cache.group.sum_tensor(partial)
    return partial


class ShardedKVCache(KVCache):
    """A :class:`KVCache` of one rank's heads (see the module docstring).

    Parameters
    ----------
    geometry : Geometry
        The whole model's (global head count).
    layout : Layout or None
        The method's head groups with global head indices (default: one group of every head).
    group : SequenceGroup
    capacity_limit, compute_attention
        As for :class:`KVCache`.
    """

    def __init__(self, geometry, layout: Layout | None, group: SequenceGroup, capacity_limit: int | None = None,
                 compute_attention: bool = True) -> None:
        check_heads(geometry.num_heads, geometry.tokens_per_frame, group.size)
        self.group = group
        self.global_heads = geometry.num_heads
        self.local_heads = geometry.num_heads // group.size
        self.head_offset = group.rank * self.local_heads
        layout = uniform_layout(geometry.num_layers, geometry.num_heads) if layout is None else layout
        super().__init__(geometry.num_layers, self.local_heads, geometry.head_dim, geometry.tokens_per_frame,
                         geometry.rope, local_layout(layout, self.head_offset, self.local_heads), capacity_limit,
                         compute_attention)
        self.first_head = layout[0][0].heads[0]  # a head of layer 0's first (global) group: kept_per_chunk's bank

    @classmethod
    def factory(cls, group: SequenceGroup):
        """A ``from_geometry``-like constructor for :func:`cmbench.generation.prefill` (``backbone.make_cache``)."""
        def make(geometry, layout: Layout | None = None, capacity_limit: int | None = None,
                 compute_attention: bool = True) -> "ShardedKVCache":
            return cls(geometry, layout, group, capacity_limit, compute_attention)
        return make

    def global_heads_of(self, bank: Bank) -> tuple[int, ...]:
        """The global head indices of a bank of this rank."""
        return tuple(h + self.head_offset for h in bank.group.heads)

    # ------------------------------------------------------------------ decisions
    def mark_tokens(self, gids: torch.Tensor, keep: torch.Tensor | None = None, priority: torch.Tensor | None = None,
                    banks: Sequence[Bank] | None = None) -> None:
        """:meth:`KVCache.mark_tokens`; the decision is checked to be the same on every rank (debug check)."""
        self.group.check_same("a keep mask", gids, keep, priority)
        super().mark_tokens(gids, keep=keep, priority=priority, banks=banks)

    def regroup(self, layer: int, groups: Sequence[HeadGroup]) -> None:
        """Split a layer's banks into new head groups given with global head indices."""
        self.group.check_same(f"layer {layer}'s head groups",
                              torch.tensor([h for g in groups for h in g.heads], dtype=torch.long))
        super().regroup(layer, local_groups(groups, self.head_offset, self.local_heads))
        if layer == 0:
            self.first_head = groups[0].heads[0]

    # ------------------------------------------------------------------ reads over every head
    def frame_keys(self, layer: int, frames: Sequence[int], role: str | None = None) -> torch.Tensor | None:
        """:meth:`KVCache.frame_keys` over every rank's heads (global head order), ``None`` if any rank
        lacks a frame; ranks without a bank of the role contribute no heads."""
        local = super().frame_keys(layer, frames, role)
        has_role = any(role is None or b.role == role for b in self.banks[layer])
        ok = torch.tensor([[int(local is not None or not has_role), int(has_role)]], dtype=torch.long)
        flags = self.group.all_gather(ok, 0)
        if not bool(flags[:, 0].all()) or not bool(flags[:, 1].any()):
            return None
        heads = torch.tensor([[local.shape[3] if local is not None else 0]], dtype=torch.long)
        counts = self.group.all_gather(heads, 0)[:, 0].tolist()
        T = self.tokens_per_frame
        stored = next(b.k for b in self.banks[layer] if b.k is not None)
        like = local if local is not None else stored.new_zeros(stored.shape[0], len(list(frames)), T, 0, self.head_dim)
        widest = max(counts)
        padded = torch.zeros(like.shape[0], like.shape[1], T, widest, self.head_dim, dtype=like.dtype,
                             device=like.device)
        padded[..., : like.shape[3], :] = like
        every = self.group.all_gather(padded[None], 0)
        return torch.cat([every[r, ..., : counts[r], :] for r in range(self.group.size)], dim=3)

    @contextmanager
    def record_attention(self, key_frames: Sequence[int] | None = None) -> Iterator[AttentionStats]:
        """:meth:`KVCache.record_attention`, whose per-head mass is gathered over the group on exit
        (``mass[layer]`` is then ``[heads, F]`` over every head)."""
        with super().record_attention(key_frames) as stats:
            yield stats
        for layer in sorted(stats.mass):
            stats.mass[layer] = self.group.all_gather(stats.mass[layer], 0)

    # ------------------------------------------------------------------ accounting over the group
    def visible_counts(self) -> torch.Tensor:
        """History tokens each head sees, ``[num_layers, heads]`` over every rank's heads."""
        return self.group.all_gather(super().visible_counts(), 1)

    def kept_per_chunk(self, bank: Bank | None = None) -> dict[int, int]:
        """Tokens of every committed chunk still stored in layer 0's first (global) head group, read on
        the rank that holds its first head (``bank``: a bank of this rank instead)."""
        if bank is not None:
            return super().kept_per_chunk(bank)
        owner = self.first_head // self.local_heads
        counts = torch.zeros(len(self.chunks), dtype=torch.long)
        if owner == self.group.rank:
            local = self.first_head - self.head_offset
            mine = next(b for b in self.banks[0] if local in b.group.heads)
            counts = torch.tensor(list(super().kept_per_chunk(mine).values()), dtype=torch.long)
        every = self.group.all_gather(counts[None], 0)
        return {info.index: int(every[owner, i]) for i, info in enumerate(self.chunks)}

    def store_shares(self) -> int:
        """The group's size: every rank holds the same tokens of ``heads / P`` heads (the host store's bound
        and its byte counts are the model's: :meth:`KVCache.store_bytes`)."""
        return self.group.size

    def local_stored_bytes(self) -> int:
        """Bytes of stored history K and V on this rank."""
        return super().stored_bytes()

    def stored_bytes(self) -> int:
        """Bytes of stored history K and V summed over the group (what one process would store)."""
        return self.group.sum(super().stored_bytes())
