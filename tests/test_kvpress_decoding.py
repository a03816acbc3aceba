"""kvpress_decoding: the press re-scores the whole history to ``target_size`` tokens per head, as kvpress's
DecodingPress does; a token kept at one re-scoring can be taken back at the next, and the PR ledger counts
it as pruned from then on.

Geometry: 2 layers x 3 heads of 12 channels, 32 tokens per chunk (2 frames of 16); sink 1 chunk, window 2.
``target_size`` 104 = sink 32 + window 64 + 8 re-scored tokens per head.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from cmbench.cache import KVCache
from cmbench.cache.ledger import PRLedger
from cmbench.errors import ConfigError
from cmbench.hashing import derive_seed
from cmbench.methods import build_method
from cmbench.methods.base import BeforeChunk, ChunkSignals
from cmbench.methods.kvpress_adapter import kept_count
from cmbench.methods.kvpress_decoding import ratio_keeping
from fakes import fake_geometry
from test_kvpress_adapter import fed, presses, shim

needs_kvpress = pytest.mark.skipif(importlib.util.find_spec("kvpress") is None,
                                   reason="kvpress is not installed: pip install -e '.[kvpress]'")

G = fake_geometry(num_layers=2, num_heads=3, height=8, width=8)
L, SEED, TARGET = 32, 7, 104


def drive(method, chunks: int, scale=lambda c: 1.0):
    """Commit ``chunks`` chunks of random K/V (chunk ``c``'s keys scaled by ``scale(c)``), each with probe
    queries, the ledger recording what every chunk sees.

    Returns the cache, the ledger, ``{(chunk, layer): keys [1, H, L, D]}``, the values alike, the probe
    queries ``{chunk: {layer: [1, L, H, D]}}`` and, per commit, each (layer, head)'s history gids after it.
    """
    gen = torch.Generator().manual_seed(0)
    cache, ledger = KVCache.from_geometry(G, layout=method.layout(G)), PRLedger("context")
    keys, values, queries, held = {}, {}, {}, []
    for c in range(chunks):
        info = cache.begin_chunk(c, 2 * c, 2)
        queries[c] = {layer: 2 * torch.randn(1, L, G.num_heads, G.head_dim, generator=gen) for layer in range(G.num_layers)}
        method.before_denoise(cache, BeforeChunk(geometry=G, chunk=info, phase="context", probe_queries=queries[c],
                                                 queries={layer: q.mean(dim=1) for layer, q in queries[c].items()}))
        ledger.record(cache)
        for layer in range(G.num_layers):
            k, v = torch.randn(2, 1, L, G.num_heads, G.head_dim, generator=gen).unbind(0)
            k = k * scale(c)
            keys[c, layer], values[c, layer] = k.transpose(1, 2), v.transpose(1, 2)
            cache.attend(layer, torch.randn(1, L, G.num_heads, G.head_dim, generator=gen), k, v)
        info = cache.commit_chunk()
        method.after_chunk(cache, ChunkSignals(geometry=G, chunk=info, phase="context", generated_index=None,
                                               context_frames=2 * chunks, seed=SEED, x0_final=torch.zeros(1)))
        held.append({(layer, bank.group.heads[0]): bank.field("gid").tolist()
                     for layer, banks in enumerate(cache.banks) for bank in banks})
    return cache, ledger, keys, values, queries, held


def build(**knobs):
    return build_method({"name": "kvpress_decoding", "recent_chunks": 2, "target_size": TARGET, **knobs})


@pytest.mark.parametrize("tokens", [7, 10, 32, 40, 97, 1000, 4680])
def test_ratio_keeping_gives_the_press_exactly_the_kept_count(tokens):
    """For every count kept of ``tokens``, the ratio makes the press keep exactly that many (kvpress's own
    integer part), as DecodingPress's search does for its base press."""
    for kept in range(1, tokens + 1):
        assert kept_count(tokens, ratio_keeping(tokens, kept)) == kept, (tokens, kept)
    assert ratio_keeping(tokens, tokens) == 0.0


@needs_kvpress
@pytest.mark.parametrize("budget", [{}, {"target_size": 2048, "quota_tokens": TARGET}])
def test_a_token_kept_at_one_rescoring_is_taken_back_at_the_next_and_the_ledger_counts_it_pruned(budget):
    """KnormPress keeps the keys of lowest norm. Chunk 1's keys are large, chunk 2's small: at chunk 3's
    commit the 8 lowest of chunk 1 are kept (only it has left the window); at chunk 4's, chunk 2 has left
    too and takes every slot, so chunk 1's kept tokens are taken back. Each head then holds 104 history
    tokens, and the ledger's chunk 5 sees 104 of FullKV's 160 per head, not 112. A quota of 104 tokens is
    the same target."""
    method = build(press="KnormPress", **budget)
    cache, ledger, keys, _, _, held = drive(method, 6, scale=lambda c: {1: 10.0, 2: 0.1}.get(c, 1.0))
    for layer in range(G.num_layers):
        for head in range(G.num_heads):
            norms = keys[1, layer][0, head].norm(dim=-1)
            lowest = sorted(L + int(i) for i in torch.argsort(norms)[:8])
            after3, after4 = held[3][layer, head], held[4][layer, head]
            assert [g for g in after3 if L <= g < 2 * L] == lowest
            assert after3 == list(range(L)) + lowest + list(range(2 * L, 4 * L))
            assert not [g for g in after4 if L <= g < 2 * L]  # taken back
            kept2 = [g for g in after4 if 2 * L <= g < 3 * L]
            norms2 = keys[2, layer][0, head].norm(dim=-1)
            assert kept2 == sorted(2 * L + int(i) for i in torch.argsort(norms2)[:8])
            assert len(after4) == TARGET and len(held[5][layer, head]) == TARGET
    visible = [int(e.visible[0, 0]) for e in ledger.entries]
    assert visible == [0, 32, 64, 96, 104, 104]
    assert [e.full for e in ledger.entries] == [0, 32, 64, 96, 128, 160]
    heads = G.num_layers * G.num_heads
    assert ledger.pruning_ratio() == pytest.approx(1 - sum(visible) * heads / (sum(e.full for e in ledger.entries) * heads))


@needs_kvpress
def test_between_rescorings_the_chunks_leaving_the_window_are_kept_whole():
    """``compression_interval`` 2: re-scorings at the commits of chunks 3 and 5 (index + 1 even); at chunk
    4's commit chunk 2 leaves the window whole, so chunk 5 sees 32 + 8 + 32 + 64 = 136 tokens per head;
    chunk 5's commit brings each head back to 104."""
    method = build(press="KnormPress", compression_interval=2)
    _, ledger, _, _, _, held = drive(method, 6)
    assert [int(e.visible[1, 2]) for e in ledger.entries] == [0, 32, 64, 96, 104, 136]
    assert {len(h) for h in held[5].values()} == {TARGET}


@needs_kvpress
@pytest.mark.parametrize("press", presses())
def test_each_rescoring_keeps_what_decoding_press_compress_keeps(press):
    """At chunk 4's commit each head's candidates are its 8 tokens of chunk 1 kept at chunk 3 and chunk 2's
    32: the adapter keeps (per head) the tokens kvpress's own DecodingPress ``compress``, around the same
    press, keeps of those 40 at a target of 8, fed the same keys, values and probe (every query's softmax)."""
    kvpress = import_kvpress()
    method = build(press=press)
    cache, _, keys, values, queries, held = drive(method, 5)
    for layer in range(G.num_layers):
        rows = {h: [g for g in held[3][layer, h] if L <= g < 3 * L] for h in range(G.num_heads)}
        cand_k = torch.stack([torch.cat([keys[1, layer], keys[2, layer]], dim=2)[0, h, [g - L for g in rows[h]]]
                              for h in range(G.num_heads)])[None]  # [1, H, 40, D]
        cand_v = torch.stack([torch.cat([values[1, layer], values[2, layer]], dim=2)[0, h, [g - L for g in rows[h]]]
                              for h in range(G.num_heads)])[None]
        decoding = kvpress.DecodingPress(base_press=getattr(kvpress, press)(), target_size=8, compression_interval=1)
        reads = press in ("ObservedAttentionPress", "TOVAPress")
        hidden, attentions = fed(decoding.base_press, queries[4][layer], cand_k) if reads else (None, None)
        torch.manual_seed(derive_seed("kvpress", SEED, 2, layer))
        kept_k, _ = decoding.compress(shim(layer), hidden, cand_k, cand_v, attentions, {})
        for h in range(G.num_heads):
            found = (kept_k[0, h, :, None] == cand_k[0, h, None]).all(dim=-1)  # [8, 40]
            assert (found.sum(dim=-1) == 1).all()
            want = sorted(rows[h][int(i)] for i in found.any(dim=0).nonzero().flatten())
            assert [g for g in held[4][layer, h] if L <= g < 3 * L] == want, (press, layer, h)


def import_kvpress():
    from cmbench.methods.kvpress_adapter import import_kvpress as load

    return load()


@needs_kvpress
@pytest.mark.parametrize("knobs, message", [
    ({"target_size": 96}, "method.target_size=96 leaves no re-scored token: the sink and recent window hold 96 tokens"),
    ({"compression_ratio": 0.5}, "compression_ratio is set at each re-scoring from target_size"),
    ({"max_history_tokens": 500}, "target_size \\(or a quota\\) is its budget; leave out max_history_tokens"),
    ({"compression_interval": 0}, "compression_interval"),
])
def test_a_target_the_window_fills_or_a_second_budget_is_one_line(knobs, message):
    with pytest.raises(ConfigError, match=message) as err:
        build(press="KnormPress", **knobs).layout(G)
    assert "\n" not in str(err.value)
