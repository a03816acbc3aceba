"""A keep pattern recorded from one run and replayed as a fixed mask: the control for what deciding costs.

:class:`KeptIds` is an ``on_chunk_end`` hook of the generation loop that records, after each chunk,
every bank's head group and the global token ids it still stores; :class:`OracleMask` replays that
record (regrouping heads where the recorded run did, then compacting each bank to its recorded ids).
Both runs then see exactly the same history, so

- their time difference is what the recorded method spent scoring and deciding (the speed benchmark);
- their outputs must be identical: anything else the recorded method did to the sequence (a probe
  that left a trace, extra writes) shows up as a difference (the method contract check).

A recorded retrieval method (one that restores stored tokens before a chunk's first model call) is
replayed with a store: the oracle moves every row it drops into it and restores, before each chunk,
the recorded ids the banks do not hold. A recorded merging method (:meth:`KVCache.merge`) is replayed
with its merges, by global id, where it made them (before the ``t = 0`` pass or after the chunk).

Neither is a registered method: the oracle needs a recording to exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from cmbench.cache import ChunkInfo, HeadGroup, HostStore, KVCache
from cmbench.methods.base import BeforeChunk, ChunkSignals, Method

BankIds = dict[tuple[int, HeadGroup], torch.Tensor]
"""``(layer, head group) -> global token ids long [n]`` of one bank after a chunk."""

Merges = list[tuple[int, HeadGroup, torch.Tensor, torch.Tensor]]
"""``(layer, head group, absorbing ids [m], absorbed ids [m])`` per merge, in order (:attr:`KVCache.merges`)."""


def replay_merges(cache: KVCache, merges: Merges) -> None:
    """Make the recorded merges again, in order, each in the bank of its layer and head group."""
    for layer, group, into, rows in merges:
        def select(bank, layer=layer, group=group, into=into, rows=rows):
            if bank.layer != layer or bank.group != group:
                empty = torch.zeros(0, dtype=torch.long)
                return empty, empty
            gid = bank.field("gid")
            return torch.searchsorted(gid, into), torch.searchsorted(gid, rows)
        cache.merge(select)


def bank_ids(cache: KVCache) -> BankIds:
    """Every bank's stored global ids, keyed by layer and head group."""
    return {(layer, bank.group): bank.field("gid").clone()
            for layer, banks in enumerate(cache.banks) for bank in banks}


class KeptIds:
    """``on_chunk_end`` hook: what every bank keeps after each chunk of the chosen phases; its
    :meth:`before_clean` (an ``on_before_clean`` hook) records what they hold right before each chunk's
    ``t = 0`` pass (a method may compact there, e.g. DeCoPrune's delayed window); :meth:`before_denoise`
    (an ``on_before_denoise`` hook) what they hold before each chunk's first model call, where a
    retrieval method has restored stored tokens.

    Parameters
    ----------
    phases : tuple of str
        ``"context"`` and / or ``"generation"`` chunks to record.

    Attributes
    ----------
    survivors : dict of int to BankIds
        Chunk index -> each bank's stored global ids after that chunk's compaction.
    before : dict of int to BankIds
        Chunk index -> each bank's stored history ids right before that chunk's ``t = 0`` pass.
    restored : dict of int to BankIds
        Chunk index -> each bank's ids before that chunk's first model call, for the chunks where the
        banks (same layer and head group) held ids they did not hold after the previous chunk (tokens were
        restored).
    merged_before, merged : dict of int to Merges
        Chunk index -> the merges made before its ``t = 0`` pass, and those made after it (chunks with
        merges only).
    """

    def __init__(self, phases: tuple[str, ...] = ("generation",)) -> None:
        self.phases = phases
        self.survivors: dict[int, BankIds] = {}
        self.before: dict[int, BankIds] = {}
        self.restored: dict[int, BankIds] = {}
        self.merged_before: dict[int, Merges] = {}
        self.merged: dict[int, Merges] = {}
        self._last: BankIds = {}

    def __call__(self, cache: KVCache, sig: ChunkSignals) -> None:
        self._last = bank_ids(cache)
        if sig.phase in self.phases:
            self.survivors[sig.chunk.index] = self._last
            after = cache.merges[len(self.merged_before.get(sig.chunk.index, [])):]
            if after:
                self.merged[sig.chunk.index] = list(after)

    def before_clean(self, cache: KVCache, chunk: ChunkInfo) -> None:
        self.before[chunk.index] = bank_ids(cache)
        if cache.merges:
            self.merged_before[chunk.index] = list(cache.merges)

    def before_denoise(self, cache: KVCache, chunk: ChunkInfo) -> None:
        ids = bank_ids(cache)
        if any(key in self._last and not bool(torch.isin(gids, self._last[key]).all()) for key, gids in ids.items()):
            self.restored[chunk.index] = ids


@dataclass
class OracleMask(Method):
    """Keeps, after each recorded chunk, exactly what a recorded run kept: a keep pattern with no scoring.

    Parameters
    ----------
    survivors : mapping of int to BankIds
        Chunk index -> ``(layer, head group) -> ids`` (:attr:`KeptIds.survivors` of the recorded run).
        Chunks not in the mapping are left as they are.
    initial_layout : sequence of sequence of HeadGroup, optional
        The recorded method's bank layout at the start (``method.layout(geometry)``); one bank per layer
        when omitted.
    before : mapping of int to BankIds
        Chunk index -> ids right before that chunk's ``t = 0`` pass (:attr:`KeptIds.before`); replayed
        there. Chunks not in the mapping are left as they are.
    restored : mapping of int to BankIds
        Chunk index -> ids before that chunk's first model call (:attr:`KeptIds.restored`): the ids
        missing from a bank there are restored from the store (with any, every dropped row is stored).
    merged_before, merged : mapping of int to Merges
        Chunk index -> merges to make again right before its ``t = 0`` pass, and after it (before its
        compaction) (:attr:`KeptIds.merged_before`, :attr:`KeptIds.merged`).
    """

    name = "oracle_mask"
    family = "eviction"
    description = "Replay of a recorded keep pattern (benchmark and contract control)"

    survivors: Mapping[int, BankIds] = field(default_factory=dict)
    initial_layout: Sequence[Sequence[HeadGroup]] | None = None
    before: Mapping[int, BankIds] = field(default_factory=dict)
    restored: Mapping[int, BankIds] = field(default_factory=dict)
    merged_before: Mapping[int, Merges] = field(default_factory=dict)
    merged: Mapping[int, Merges] = field(default_factory=dict)

    def host_store(self) -> HostStore | None:
        return HostStore() if self.restored else None

    def before_denoise(self, cache: KVCache, sig: BeforeChunk) -> None:
        recorded = self.restored.get(sig.chunk.index)
        if recorded is None:
            return
        where = {id(bank): (layer, bank.group) for layer, banks in enumerate(cache.banks) for bank in banks}

        def missing(bank) -> torch.Tensor:
            ids = recorded[where[id(bank)]]
            return ids[~torch.isin(ids, bank.field("gid"))]

        cache.restore(missing)

    def layout(self, geometry) -> list[list[HeadGroup]]:
        if self.initial_layout is None:
            return super().layout(geometry)
        return [list(groups) for groups in self.initial_layout]

    def before_clean(self, cache: KVCache, chunk: ChunkInfo) -> None:
        replay_merges(cache, self.merged_before.get(chunk.index, []))
        recorded = self.before.get(chunk.index)
        if recorded is not None:
            where = {id(bank): (layer, bank.group) for layer, banks in enumerate(cache.banks) for bank in banks}
            cache.compact(lambda bank: torch.isin(bank.field("gid"), recorded[where[id(bank)]]),
                          to_store=cache.store is not None)

    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        replay_merges(cache, self.merged.get(sig.chunk.index, []))
        recorded = self.survivors.get(sig.chunk.index)
        if recorded is None:
            return
        for layer in range(cache.num_layers):
            groups = [group for (lay, group) in recorded if lay == layer]
            if groups != [bank.group for bank in cache.banks[layer]]:
                cache.regroup(layer, groups)
        where = {id(bank): (layer, bank.group) for layer, banks in enumerate(cache.banks) for bank in banks}
        cache.compact(lambda bank: torch.isin(bank.field("gid"), recorded[where[id(bank)]]),
                          to_store=cache.store is not None)
