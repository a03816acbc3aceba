"""The memory plan of a split run (``parallel.sequence``) replays the rank with the largest KV peak.

Each rank of a sequence-parallel group holds ``heads / P`` heads of every layer's banks. With a head map
that puts bounded banks on some heads and unbounded ones on others, the ranks' caches differ; the device
must fit the largest one, wherever it sits in the group.
"""

from __future__ import annotations

import math

import pytest

from cmbench.backbones.memory.kv import retention, simulate_kv
from cmbench.backbones.memory.plan import GIB
from cmbench.backbones.memory.run_plan import ModelBytes, shape_of
from cmbench.cache.layout import HeadGroup
from cmbench.methods.registry import build_method
from fakes import fake_geometry

G = fake_geometry(num_layers=2, num_heads=4, head_dim=12)  # 4 tokens per frame, chunks of 8 tokens
DIT = {"dim": 48, "ffn_dim": 96, "in_channels": 3, "out_channels": 3, "text_dim": 0, "camera_dim": 0}
MODELS = ModelBytes(dit=GIB, vae=GIB // 4, text=GIB // 2)
CONTEXT_FRAMES, CONTINUATION_FRAMES = 12, 8  # 6 context chunks, 4 continuation chunks
BYTES = 2  # bfloat16
BOUNDED = G.tokens_per_chunk  # a static bank's size: one chunk of tokens


def head_map_method(bounded: tuple[int, ...], unbounded: tuple[int, ...]):
    """FullKV with a head map: ``bounded`` heads share a bank of :data:`BOUNDED` tokens, ``unbounded``
    heads one that keeps every token.

    Parameters
    ----------
    bounded, unbounded : tuple of int
        The heads of each group (together every head of :data:`G`).

    Returns
    -------
    Method
    """
    method = build_method({"name": "fullkv"})
    groups = [HeadGroup(bounded, "static", BOUNDED), HeadGroup(unbounded, "dynamic", None)]
    method.layout = lambda geometry: [list(groups) for _ in range(geometry.num_layers)]
    return method


def shape(method, sequence: int):
    """The run shape of ``method`` on :data:`G` split over ``sequence`` ranks.

    Returns
    -------
    RunShape
    """
    return shape_of("fake", G, DIT, MODELS, method, BYTES, 32, 32, 16, 1.0, CONTEXT_FRAMES, CONTINUATION_FRAMES,
                    sequence=sequence)


def replay(method, heads_per_group: list[tuple[int, int | None]]):
    """The KV timeline of one rank's cache whose every layer holds ``heads_per_group`` (heads, max tokens).

    Returns
    -------
    KVTimeline
    """
    return simulate_kv(G.num_layers, [list(heads_per_group) for _ in range(G.num_layers)], G.head_dim, BYTES,
                       G.tokens_per_chunk, math.ceil(CONTEXT_FRAMES / G.chunk_frames),
                       math.ceil(CONTINUATION_FRAMES / G.chunk_frames), retention(method, None, G))


def peak(timeline) -> int:
    """The device's most KV bytes over a run: the prefill's peak or the prefilled cache plus a task's."""
    return max(timeline.prefill_peak, timeline.prefilled_stored + timeline.continuation_peak)


@pytest.mark.parametrize("bounded, unbounded, largest_rank", [
    ((0, 1), (2, 3), 1),  # rank 0 holds the bounded banks: rank 1 is the largest
    ((2, 3), (0, 1), 0),
])
def test_a_split_plan_replays_the_rank_with_the_largest_cache(bounded, unbounded, largest_rank):
    """Two ranks, heads 0-1 and 2-3: the bounded banks on one, the unbounded on the other. The plan's KV
    timeline is the unbounded rank's, whichever rank that is."""
    method = head_map_method(bounded, unbounded)
    small, large = replay(method, [(2, BOUNDED)]), replay(method, [(2, None)])
    assert peak(large) > peak(small)  # the case tells the ranks apart
    got = shape(method, 2)
    assert got.kv == large, f"the plan replayed a cache of {peak(got.kv)} bytes, rank {largest_rank} needs {peak(large)}"
    assert got.sequence == 2


def test_a_split_plan_is_the_same_wherever_the_largest_rank_sits():
    """Mirroring the head map over the ranks leaves the plan unchanged, and it is never below the model's
    cache split evenly."""
    first, second = shape(head_map_method((0, 1), (2, 3)), 2), shape(head_map_method((2, 3), (0, 1)), 2)
    assert first.kv == second.kv
    whole = shape(head_map_method((0, 1), (2, 3)), 1)
    assert 2 * peak(first.kv) >= peak(whole.kv)


def test_an_uneven_head_count_per_rank_plans_the_rank_holding_more_unbounded_heads():
    """One bounded head (head 0) and three unbounded: rank 0 holds one unbounded head, rank 1 two; the
    plan is rank 1's cache."""
    method = head_map_method((0,), (1, 2, 3))
    got = shape(method, 2)
    rank0, rank1 = replay(method, [(1, BOUNDED), (1, None)]), replay(method, [(2, None)])
    assert peak(rank1) > peak(rank0)
    assert got.kv == rank1
