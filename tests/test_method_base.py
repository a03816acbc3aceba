"""The Method base class by hand: knobs, layout, quota arithmetic, budget and eviction order, probe_hide.

Caches are filled directly (zero K/V, no attention computed) and decided by :meth:`Method.after_chunk`, as
the generation loop does. Default geometry (tests/fakes.py): 2 layers x 2 heads, 4 tokens per frame, chunks
of 2 frames (8 tokens), so chunk ``c`` holds gids ``8c .. 8c + 7``; with 8 x 8 latents a frame has 16
tokens and a chunk 32. Sink 1 chunk, recent window 1 chunk unless a test says otherwise.
"""

import re
from dataclasses import dataclass

import pytest
import torch

from cmbench.cache import ChunkInfo, HeadGroup, KVCache
from cmbench.errors import ConfigError
from cmbench.methods.base import ChunkSignals, Method, ScoredMethod
from cmbench.parallel.cache import ShardedKVCache
from cmbench.parallel.sequence import SequenceGroup
from fakes import fake_geometry, survivors
from test_methods import G, chunk_gids

BIG = fake_geometry(height=8, width=8)  # 16 tokens per frame, 32 per chunk

# priorities of a chunk's 8 tokens in order: the highest are its tokens 4 (8), 2 (7), 6 (6) and 0 (5)
PRIORITY = torch.tensor([5.0, 1.0, 7.0, 3.0, 8.0, 2.0, 6.0, 4.0])


class Plain(Method):
    """The base rules under a name (a refusal starts with it)."""

    name = "plain"


class Scored(ScoredMethod):
    """The base rules with quota mode, under a name."""

    name = "scored"


class TenPerBank(Method):
    """A method whose own limit (10 tokens per bank) is below the sink and recent window (16 tokens)."""

    name = "ten"

    def limits(self, cache, newest):
        return {id(b): 10 for b in cache.all_banks()}


@dataclass(frozen=True)
class BesideOtherRank(SequenceGroup):
    """Rank 0 of 2 without a process group: ``sum_each`` adds the counts the other rank reports."""

    other: tuple[int, ...] = ()

    def sum_each(self, values):
        return [a + b for a, b in zip(values, self.other, strict=True)]


def finish(cache: KVCache) -> ChunkInfo:
    """Commit the open chunk with K/V zeros ``[1, L, H, D]``; returns it."""
    zeros = torch.zeros(1, cache.current.length, cache.num_heads, cache.head_dim)
    for layer in range(cache.num_layers):
        cache.attend(layer, zeros, zeros, zeros)
    return cache.commit_chunk()


def commit(cache: KVCache, index: int, geometry=G) -> ChunkInfo:
    """Open and commit chunk ``index`` without deciding anything; returns it."""
    cache.begin_chunk(index, index * geometry.chunk_frames, geometry.chunk_frames)
    return finish(cache)


def signals(info: ChunkInfo, geometry=G) -> ChunkSignals:
    """A context chunk's signals, clean latents ``[1, C, f, h, w]`` of zeros."""
    frames = torch.zeros(1, geometry.latent_channels, info.num_frames, geometry.latent_height, geometry.latent_width)
    return ChunkSignals(geometry=geometry, chunk=info, phase="context", generated_index=None, context_frames=0,
                        seed=0, x0_final=frames)


def decided(method: Method, chunks: int, geometry=G) -> KVCache:
    """A cache of ``method``'s layout after chunks ``0 .. chunks - 1``, each committed then passed to
    ``method.after_chunk``."""
    cache = KVCache.from_geometry(geometry, method.layout(geometry), compute_attention=False)
    for index in range(chunks):
        method.after_chunk(cache, signals(commit(cache, index, geometry), geometry))
    return cache


def committed(chunks: int, geometry=G) -> KVCache:
    """A cache of one bank per layer holding chunks ``0 .. chunks - 1``, never compacted."""
    cache = KVCache.from_geometry(geometry, compute_attention=False)
    for index in range(chunks):
        commit(cache, index, geometry)
    return cache


def test_knobs_are_every_dataclass_field_with_its_value():
    assert Plain(sink_chunks=2, max_history_tokens=40).knobs() == {
        "sink_chunks": 2, "recent_chunks": 1, "max_history_tokens": 40}
    assert Scored(recent_chunks=3, quota_pr=0.25).knobs() == {
        "sink_chunks": 1, "recent_chunks": 3, "max_history_tokens": None, "quota_pr": 0.25, "quota_tokens": None}


def test_layout_is_one_bank_of_every_head_per_layer_sized_by_max_history_tokens():
    assert Plain(max_history_tokens=20).layout(fake_geometry(num_layers=3)) == [[HeadGroup((0, 1), "all", 20)]] * 3
    assert Plain().layout(G) == [[HeadGroup((0, 1), "all", None)]] * 2


def test_quota_pr_takes_zero_and_refuses_one_saying_why():
    """The range is [0, 1): 0 (keep everything FullKV keeps) is a quota, 1 (keep nothing) is not."""
    assert Scored(quota_pr=0.0).quota_mode
    with pytest.raises(ConfigError, match=re.escape("scored: quota_pr must be in [0, 1), got 1.0")):
        Scored(quota_pr=1.0)


def test_quota_pr_allowance_shares_the_target_among_budgeted_heads_by_hand():
    """3 committed chunks (24 tokens) over 4 heads, all budgeted: ``(1 - 0.25) * 24 * 4 / 4 = 18`` per head,
    24 with the 8 tokens of an open chunk counted (``incoming``), none counted by default."""
    cache = committed(3)
    method = Scored(quota_pr=0.25)
    assert method.allowance(cache, cache.chunks[-1]) == 18
    assert method.allowance(cache, cache.chunks[-1], 8) == 24


def test_quota_pr_allowance_rounds_below_half_a_token_to_nothing():
    """``(1 - 0.99) * 24 = 0.24`` tokens per head rounds to 0: no token is promised."""
    cache = committed(3)
    assert Scored(quota_pr=0.99).allowance(cache, cache.chunks[-1]) == 0


def test_quota_pr_allowance_of_a_single_budgeted_head_is_its_whole_target():
    """One layer of one head: ``0.5 * 24 * 1 = 12`` tokens, divided by that one head."""
    g = fake_geometry(num_layers=1, num_heads=1)
    cache = committed(3, g)
    assert Scored(quota_pr=0.5).allowance(cache, cache.chunks[-1]) == 12


def test_quota_pr_allowance_of_a_split_cache_counts_every_rank():
    """Rank 0 of 2 holds head 0 of both layers (2 budgeted heads, 24 committed tokens); rank 1 holds head 1
    of both, outside the budget, with 16 tokens each. Over the model: ``0.5 * 24 * 4 = 48`` tokens, less the
    other rank's 32, shared by the 2 budgeted heads: 8 (rank 0's counts alone would give 12)."""
    group = BesideOtherRank(0, 2, other=(2, 32, 0))  # (heads, fixed token-heads, budgeted heads)
    cache = ShardedKVCache(G, None, group, compute_attention=False)
    for index in range(3):
        commit(cache, index)
    assert Scored(quota_pr=0.5).allowance(cache, cache.chunks[-1]) == 8


def test_budget_keeps_the_highest_priorities_of_the_chunk_leaving_the_window():
    """Chunks 0-3 stored (32 rows), chunk 3 newest: chunk 2 leaves the window. An allowance of 28 leaves
    ``28 - (32 - 8) = 4`` of its rows: gids 16, 18, 20, 22 (priorities 5, 7, 8, 6) stay. Counting the 8
    incoming tokens of an open chunk leaves none of them; every other chunk's row stays."""
    cache = committed(4)
    cache.mark(2, priority=PRIORITY)
    bank = cache.banks[0][0]
    method = Scored(quota_tokens=28)
    keep = method.budget_keep(bank, cache.chunks[-1], 28)
    assert bank.field("gid")[keep].tolist() == chunk_gids(0) + chunk_gids(1) + [16, 18, 20, 22] + chunk_gids(3)
    keep = method.budget_keep(bank, cache.chunks[-1], 28, incoming=8)
    assert bank.field("gid")[keep].tolist() == chunk_gids(0) + chunk_gids(1) + chunk_gids(3)


def test_budget_ties_keep_the_earliest_rows_among_32():
    """32 tokens per chunk, every priority tied (unscored): chunk 2 leaves the window with room for 3 of its
    rows (allowance 99, 128 - 32 = 96 others), the first three, gids 64-66. (torch's unstable CPU sort
    would keep rows 16, 31, 30 of the 32 equal values.)"""
    cache = committed(4, BIG)
    bank = cache.banks[0][0]
    keep = Scored(quota_tokens=99).budget_keep(bank, cache.chunks[-1], 99)
    assert bank.field("gid")[keep].tolist() == list(range(64)) + [64, 65, 66] + list(range(96, 128))


def test_probe_hides_what_the_compaction_after_the_open_chunk_drops():
    """``quota_pr = 0.25``, chunks 0-1 decided (nothing dropped: chunk 0 is the sink), chunk 2 open. Its 8
    tokens count: ``0.75 * (16 + 8) = 18`` tokens per head leave chunk 1 room for ``18 - 16 = 2`` rows, so the
    probe hides all but gids 12 and 10 (priorities 8, 7), ``bool [16]``; the compaction after chunk 2 drops
    exactly those."""
    method = Scored(quota_pr=0.25)
    cache = decided(method, 2)
    cache.mark(1, priority=PRIORITY)
    cache.begin_chunk(2, 4, 2)
    hide = method.probe_hide(cache)(cache.banks[0][0])
    assert hide.tolist() == [False] * 8 + [True, True, False, True, False, True, True, True]
    method.after_chunk(cache, signals(finish(cache)))
    assert survivors(cache) == chunk_gids(0) + [10, 12] + chunk_gids(2)


def test_probe_hide_needs_an_open_chunk():
    """Between chunks there is nothing to probe: refused, saying so."""
    method = Plain()
    with pytest.raises(AssertionError, match="^the post-prune probe runs while a chunk is open$"):
        method.probe_hide(decided(method, 1))


def test_max_history_tokens_below_the_sink_and_recent_window_is_refused_with_their_size():
    """Chunks 0-2 stored undecided, then decided after chunk 2: the sink (chunk 0) and the recent window
    (chunk 2) hold 16 tokens per head, over the cap of 12 even with chunk 1's 8 tokens evicted."""
    cache = committed(3)
    with pytest.raises(ConfigError, match=re.escape(
            "plain: max_history_tokens=12 is smaller than the sink and recent window (16 tokens per head); "
            "raise it or shrink the windows")):
        Plain(max_history_tokens=12).after_chunk(cache, signals(cache.chunks[-1]))


def test_a_limit_below_the_sink_and_recent_window_evicts_every_unprotected_row():
    """A limit of 10 with 24 tokens stored: all 8 unprotected rows (chunk 1) go and the 16 protected stay,
    with no refusal, since max_history_tokens (16) holds them."""
    cache = decided(TenPerBank(max_history_tokens=16), 3)
    assert survivors(cache) == chunk_gids(0) + chunk_gids(2)


def test_bounded_memory_evicts_the_oldest_of_32_tied_rows_first():
    """32 tokens per chunk, all unscored (tied): after chunk 2, 96 tokens exceed the cap of 67 by 29, and
    chunk 1's oldest 29 rows go, leaving gids 61-63. (torch's unstable CPU sort would evict 48, 63, 62, ...)"""
    cache = decided(Plain(max_history_tokens=67), 3, BIG)
    assert survivors(cache) == list(range(32)) + [61, 62, 63] + list(range(64, 96))
