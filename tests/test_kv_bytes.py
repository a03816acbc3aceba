"""Device bytes of the KV cache against FullKV's (cmbench.cache.ledger): counted by hand on a tiny cache,
FullKV's measured bytes equal to the rule that computes them, and an eviction method's ratio equal to
its kept tokens over FullKV's."""

from __future__ import annotations

import math

import pytest
import torch

from cmbench.cache import KVCache, PRLedger
from cmbench.cache.ledger import fp_bytes_per_head_token
from cmbench.generation import continue_task, prefill
from cmbench.methods.fullkv import FullKV
from cmbench.methods.streaming import Streaming
from fakes import AttentionBackbone, fake_geometry
from test_cache import split_heads_run

G = fake_geometry(num_layers=2, num_heads=4, head_dim=12)
L = G.tokens_per_chunk  # 8 tokens per chunk of 2 frames


def _qkv(seed: int, batch: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, L, 4, 12, generator=g).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("batch, dtype, itemsize", [(1, torch.float32, 4), (2, torch.float16, 2)])
def test_bytes_counted_by_hand(batch, dtype, itemsize):
    """Layer 0 splits its heads (0, 1) | (2, 3); bank (2, 3) keeps only the newest chunk, the rest keep all.

    One token of one head: K and V of 12 channels per batch row, ``2 * 12 * batch * itemsize`` bytes.
    """
    per = 2 * 12 * batch * itemsize
    cache, ledger = split_heads_run(lambda seed: _qkv(seed, batch, dtype))
    assert fp_bytes_per_head_token(cache) == per
    # head-tokens stored while chunk c was denoised: 0; 8 tokens x 8 heads; 16 x (2 + 4) heads + 8 x 2 heads
    stored = [0, 64 * per, (16 * 6 + 8 * 2) * per]
    full = [0, 8 * 8 * per, 16 * 8 * per]  # FullKV: every committed token of the 8 heads
    assert [e.stored_bytes for e in ledger.entries] == stored
    assert [e.full_bytes for e in ledger.entries] == full
    assert ledger.mean_stored_bytes() == sum(stored) / 3
    assert ledger.mean_full_bytes() == sum(full) / 3
    assert ledger.kv_bytes_ratio() == (64 + 112) / (64 + 128)
    # peaks: right after the last commit, before compaction: 24 tokens in 6 heads, 8 + 8 in bank (2, 3)
    assert ledger.peak_stored_bytes == (24 * 6 + 16 * 2) * per
    assert ledger.peak_full_bytes == 24 * 8 * per
    summary = ledger.summary()
    assert (summary["mean_stored_bytes"], summary["mean_full_bytes"], summary["peak_full_bytes"]) == (
        sum(stored) / 3, sum(full) / 3, 24 * 8 * per)
    assert summary["kv_bytes_ratio"] == ledger.kv_bytes_ratio()


def test_a_phase_without_history_has_no_ratio():
    cache = KVCache.from_geometry(G)
    ledger = PRLedger("context")
    cache.begin_chunk(0, 0, 2)
    ledger.record(cache)
    assert ledger.entries[0].full_bytes == 0 and math.isnan(ledger.kv_bytes_ratio())
    assert ledger.mean_stored_bytes() == 0.0 and math.isnan(PRLedger("generation").kv_bytes_ratio())


def test_bytes_per_token_need_a_written_bank():
    with pytest.raises(RuntimeError, match="no bank of the cache holds full-precision K/V yet"):
        fp_bytes_per_head_token(KVCache.from_geometry(G))


def _continuation(method, chunks: int = 6):
    backbone = AttentionBackbone(G, seed=0)
    ctx = torch.randn(1, G.latent_channels, 3 * G.chunk_frames, G.latent_height, G.latent_width,
                      generator=torch.Generator().manual_seed(6))
    pre = prefill(backbone, method, ctx, None, seed=0)
    return pre, continue_task(backbone, pre, None, chunks * G.chunk_frames, seed=1)


def test_fullkv_measured_bytes_equal_the_rule_and_its_ratio_is_one():
    pre, cont = _continuation(FullKV())
    ledger = cont.ledger
    per = 2 * G.head_dim * 1 * 4  # batch 1, float32
    heads = G.num_layers * G.num_heads
    assert [e.stored_bytes for e in ledger.entries] == [e.full * heads * per for e in ledger.entries]
    assert [e.full_bytes for e in ledger.entries] == [e.stored_bytes for e in ledger.entries]
    assert ledger.kv_bytes_ratio() == 1.0
    assert ledger.peak_stored_bytes == ledger.peak_full_bytes == (3 + 6) * L * heads * per
    assert pre.ledger.kv_bytes_ratio() == 1.0


def test_streaming_ratio_is_its_kept_tokens_over_fullkv_tokens():
    _, cont = _continuation(Streaming(sink_chunks=1, recent_chunks=1))
    ledger = cont.ledger
    assert ledger.visible_total < ledger.full_total  # it pruned
    assert ledger.kv_bytes_ratio() == pytest.approx(ledger.visible_total / ledger.full_total, rel=1e-15)
    assert ledger.kv_bytes_ratio() == pytest.approx(1 - ledger.pruning_ratio(), rel=1e-12)
    assert ledger.peak_stored_bytes < ledger.peak_full_bytes
