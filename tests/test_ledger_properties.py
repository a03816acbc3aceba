"""The PR ledger (paper Eq. 4) under any sequence of chunks and compactions (hypothesis): PR in [0, 1],
what a head sees never exceeds FullKV's history, the accounting identities of the summary, and a peak
that is the running maximum of the stored bytes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cmbench.cache import HeadGroup, KVCache, PRLedger
from fakes import fake_geometry

G = fake_geometry(num_layers=2, num_heads=4, head_dim=12)
LAYOUTS = [
    None,  # one bank per layer, every head in it
    [[HeadGroup((0, 1)), HeadGroup((2, 3))], [HeadGroup((0, 1, 2, 3))]],
    [[HeadGroup((0,)), HeadGroup((1, 2, 3))], [HeadGroup((3,)), HeadGroup((0, 1)), HeadGroup((2,))]],
]


def _qkv(seed: int, length: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, length, 4, 12, generator=g) for _ in range(3)]


@settings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    chunks=st.lists(st.tuples(st.integers(1, 3), st.floats(0.0, 1.0), st.booleans()), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_ledger_identities_hold_for_any_compaction(layout, chunks, seed):
    """``chunks``: (frames, keep probability, compact or not) per chunk, kept tokens drawn per bank."""
    cache = KVCache.from_geometry(G, layout)
    ledger = PRLedger("generation")
    rng = torch.Generator().manual_seed(seed)
    stored_after_commit: list[int] = []
    frame, committed = 0, 0
    for index, (frames, keep, compact) in enumerate(chunks):
        cache.begin_chunk(index, frame, frames)
        entry = ledger.record(cache)
        assert entry.full == committed  # FullKV's history: every committed token, the open chunk excluded
        assert entry.visible.shape == (G.num_layers, G.num_heads)
        assert bool((entry.visible >= 0).all()) and bool((entry.visible <= entry.full).all())
        for layer in range(G.num_layers):
            cache.attend(layer, *_qkv(seed + index + layer, frames * G.tokens_per_frame))
        cache.commit_chunk()
        ledger.note_memory(cache)
        stored_after_commit.append(cache.stored_bytes())
        if compact:
            cache.compact(lambda b, keep=keep: torch.rand(b.n, generator=rng) < keep)
        frame += frames
        committed += frames * G.tokens_per_frame
    heads = G.num_layers * G.num_heads
    assert ledger.full_total == sum(e.full for e in ledger.entries) * heads
    assert ledger.visible_total == sum(int(e.visible.sum()) for e in ledger.entries) <= ledger.full_total
    pr = ledger.pruning_ratio()
    if ledger.full_total == 0:
        assert math.isnan(pr)
    else:
        assert 0.0 <= pr <= 1.0 and pr == 1.0 - ledger.visible_total / ledger.full_total
    if not any(compact for _, _, compact in chunks[:-1]):
        assert ledger.visible_total == ledger.full_total  # nothing dropped before the last chunk: FullKV
    assert ledger.peak_stored_bytes == max(stored_after_commit)
    summary = ledger.summary()
    assert set(summary) == {"phase", "pruning_ratio", "visible_tokens", "full_tokens", "peak_stored_bytes", "chunks",
                            "peak_store_bytes", "moved_bytes", "moved_bytes_per_chunk", "mean_stored_bytes",
                            "peak_full_bytes", "mean_full_bytes", "kv_bytes_ratio"}
    # full-precision banks: a chunk's bytes are its visible head-tokens at FullKV's bytes per head-token
    per = 2 * G.head_dim * 4
    assert [e.stored_bytes for e in ledger.entries] == [e.visible_total * per for e in ledger.entries]
    assert [e.full_bytes for e in ledger.entries] == [e.full_total * per for e in ledger.entries]
    if ledger.full_total:
        assert summary["kv_bytes_ratio"] == pytest.approx(ledger.visible_total / ledger.full_total, rel=1e-12)
    assert ledger.peak_full_bytes == committed * heads * per  # every committed token, after the last commit
    assert summary["peak_store_bytes"] == summary["moved_bytes"] == summary["moved_bytes_per_chunk"] == 0  # no store
    assert summary["phase"] == "generation"
    assert summary["pruning_ratio"] == pr or (math.isnan(pr) and math.isnan(summary["pruning_ratio"]))
    assert summary["visible_tokens"] == sum(c["visible"] for c in summary["chunks"]) == ledger.visible_total
    assert summary["full_tokens"] == sum(c["full"] for c in summary["chunks"]) == ledger.full_total
    assert summary["peak_stored_bytes"] == ledger.peak_stored_bytes
    assert [c["chunk"] for c in summary["chunks"]] == list(range(len(chunks)))
    assert all(0 <= c["min_head"] <= c["max_head"] <= c["full"] // heads for c in summary["chunks"])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=20))
def test_the_peak_is_the_running_maximum_of_any_byte_sequence(sizes):
    ledger = PRLedger("context")
    for i, size in enumerate(sizes):
        ledger.note_memory(type("Cache", (), {"stored_bytes": lambda self, s=size: s})())
        assert ledger.peak_stored_bytes == max(sizes[: i + 1]) >= size
