"""TempCache and the runtime's merged rows: a row standing for ``count`` tokens gets ``log(count)`` on its logit.

The math under test: ``n`` identical keys ``k`` with values ``v_1 .. v_n`` attend exactly like one key
``k`` with value ``mean(v_i)`` and ``log(n)`` added to its logit (softmax mass ``n exp(q.k)``). Caches here
have 4 heads of head_dim 8 in two banks (heads 0, 2 and 1, 3), 3 tokens a frame and chunks of one frame,
batch 2, unless a test says otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cmbench.backbones.tiny import TinyWorldModel
from cmbench.backbones.wan.offload import HostOffloadAttention
from cmbench.cache.kv_cache import KVCache
from cmbench.cache.layout import HeadGroup
from cmbench.cache.rope import RopeAxis, RopeSpec
from cmbench.cache.store import HostStore
from cmbench.method_check import check_method
from cmbench.methods import build_method
from cmbench.methods.tempcache import TempCache, key_cosine, merge_pairs

B, H, D, T = 2, 4, 8, 3
ROPE = RopeSpec(RopeAxis(2), RopeAxis(2), RopeAxis(0))
SPLIT = [HeadGroup((0, 2), "a"), HeadGroup((1, 3), "b")]


def new_cache(layers: int = 2, store: HostStore | None = None) -> KVCache:
    return KVCache(layers, H, D, T, ROPE, layout=[list(SPLIT) for _ in range(layers)], store=store)


def write(cache: KVCache, chunk: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Commit one chunk (one frame) whose every layer stores ``k, v [B, T, H, D]``."""
    cache.begin_chunk(chunk, chunk, 1)
    for layer in range(cache.num_layers):
        cache.attend(layer, k, k, v)
    cache.commit_chunk()


def query(cache: KVCache, chunk: int, seed: int = 7) -> list[torch.Tensor]:
    """Open ``chunk`` and attend with seeded random q = k = v in every layer: the outputs."""
    g = torch.Generator().manual_seed(seed)
    q = 2.0 * torch.randn(B, T, H, D, generator=g)
    cache.begin_chunk(chunk, chunk, 1)
    return [cache.attend(layer, q, q, q) for layer in range(cache.num_layers)]


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def fold_chunk(cache: KVCache, into_chunk: int, chunk: int) -> int:
    """Merge every row of ``chunk`` into the row of ``into_chunk`` at the same position, in every bank."""
    def select(bank):
        c = bank.field("chunk")
        return (c == into_chunk).nonzero().squeeze(1), (c == chunk).nonzero().squeeze(1)
    return cache.merge(select)


def count_of(bank) -> dict[int, float]:
    return dict(zip(bank.field("gid").tolist(), bank.counts().tolist()))


# ---------------------------------------------------------------------------- the runtime's exact merge
def test_identical_keys_merged_attend_exactly_like_the_unmerged_cache_and_counts_compose():
    k0 = randn(B, T, H, D, seed=1)
    values = [randn(B, T, H, D, seed=10 + i) for i in range(4)]
    keys = [k0, randn(B, T, H, D, seed=2), k0.clone(), k0.clone()]  # chunks 2 and 3 repeat chunk 0's keys
    full, merged = new_cache(), new_cache()
    for c in range(4):
        write(full, c, keys[c], values[c])
        write(merged, c, keys[c], values[c])
        if c == 2:
            assert fold_chunk(merged, 0, 2) == T * H * merged.num_layers
        if c == 3:  # a merged row absorbs a new duplicate: its count becomes 3
            fold_chunk(merged, 0, 3)
    for bank in merged.all_banks():
        assert bank.field("chunk").tolist() == [0, 0, 0, 1, 1, 1]
        assert bank.counts().tolist() == [3.0] * T + [1.0] * T
        k, v = bank.history()
        torch.testing.assert_close(v[:, :T], (values[0] + values[2] + values[3])[:, :, list(bank.group.heads)] / 3)
    for want, got in zip(query(full, 4), query(merged, 4)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert merged.stored_bytes() == full.stored_bytes() * 6 // 12 + 6 * 4 * 4  # half the rows, plus 4 counts a bank


def test_near_duplicate_keys_stay_within_the_bound_of_their_logit_change():
    k0, noise = randn(B, T, H, D, seed=1), randn(B, T, H, D, seed=3)
    k1 = k0 + 0.05 * noise
    v0, v1 = randn(B, T, H, D, seed=4), randn(B, T, H, D, seed=5)
    full, merged = new_cache(1), new_cache(1)
    for cache in (full, merged):
        write(cache, 0, k0, v0)
        write(cache, 1, k1, v1)
    fold_chunk(merged, 0, 1)
    want, got = query(full, 2)[0], query(merged, 2)[0]
    q = 2.0 * randn(B, T, H, D, seed=7)
    # the merge swaps exp(q.k1) for exp(q.k0): every softmax weight moves by a factor within exp(+-delta)
    delta = float((torch.einsum("blhd,bmhd->bhlm", q, k1 - k0) / math.sqrt(D)).abs().max())
    vmax = float(torch.cat([v0, v1, q]).abs().max())
    error = float((got - want).abs().max())
    assert 0 < error <= (math.exp(2 * delta) - 1) * vmax
    assert error < 0.2 * float((query(new_cache(1), 0)[0] - want).abs().max())  # far closer than no history


def test_a_bank_without_merges_attends_without_a_mask_and_bit_identically(monkeypatch):
    cache = new_cache(1)
    k, v = randn(B, T, H, D, seed=1), randn(B, T, H, D, seed=2)
    write(cache, 0, k, v)
    masks = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    out = query(cache, 1)[0]
    assert masks == [None, None]  # one call per bank, no mask
    q = 2.0 * randn(B, T, H, D, seed=7)
    for bank in cache.all_banks():
        assert bank.count is None and bank.logit_bias() is None
        heads = list(bank.group.heads)
        keys = torch.cat([k[:, :, heads], q[:, :, heads]], dim=1)
        values = torch.cat([v[:, :, heads], q[:, :, heads]], dim=1)
        ref = sdpa(q[:, :, heads].transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)).transpose(1, 2)
        assert torch.equal(out[:, :, heads], ref)
    merged = new_cache(1)
    write(merged, 0, k, v)
    write(merged, 1, k, v)
    fold_chunk(merged, 0, 1)
    masks.clear()
    query(merged, 2)
    assert [m.shape for m in masks] == [(B, 2, T, 2 * T)] * 2
    assert torch.allclose(masks[0][0, 0, 0], torch.tensor([math.log(2)] * T + [0.0] * T))


@pytest.mark.parametrize("frames", [None, (0, 3)], ids=["all keys", "chosen frames"])
def test_recorded_attention_mass_counts_a_merged_row_for_every_token_it_stands_for(frames):
    k0 = randn(B, T, H, D, seed=1)
    full, merged = new_cache(1), new_cache(1)
    for cache in (full, merged):
        for c, k in enumerate([k0, randn(B, T, H, D, seed=2), k0.clone()]):
            write(cache, c, k, randn(B, T, H, D, seed=30 + c))
    fold_chunk(merged, 0, 2)
    masses = []
    for cache, key_frames in ((full, None if frames is None else (0, 2, 3)), (merged, frames)):
        cache.begin_chunk(3, 3, 1)
        q = 2.0 * randn(B, T, H, D, seed=7)
        with cache.record_attention(key_frames) as stats:
            cache.attend(0, q, q, q)
        masses.append(stats.mass[0])
    want = masses[0].clone()
    want[:, 0] += want[:, 2]
    want[:, 2] = 0.0
    torch.testing.assert_close(masses[1], want, atol=1e-6, rtol=1e-5)


def test_merge_refuses_pairs_that_do_not_fold_a_later_row_into_an_earlier_one():
    cache = new_cache(1)
    for c in range(3):
        write(cache, c, randn(B, T, H, D, seed=c), randn(B, T, H, D, seed=9 + c))
    bank = cache.banks[0][0]
    for into, rows in [([3], [0]), ([0, 1], [3, 3]), ([0, 3], [3, 6]), ([0], [9])]:
        with pytest.raises(ValueError, match="merge"):
            bank.merge(torch.tensor(into), torch.tensor(rows))
    assert bank.n == 3 * T and bank.count is None


# ---------------------------------------------------------------------------- counts aligned with rows
def test_counts_stay_with_their_rows_through_eviction_fork_restore_clone_and_regroup():
    k = [randn(B, T, H, D, seed=c) for c in range(5)]
    v = [randn(B, T, H, D, seed=20 + c) for c in range(5)]
    k[2] = k[1].clone()
    k[3] = k[1].clone()
    cache = new_cache(1, store=HostStore())
    reference = new_cache(1)  # never merged: the outputs every transformed cache must give
    for c in range(5):
        write(cache, c, k[c], v[c])
        write(reference, c, k[c], v[c])
    fold_chunk(cache, 1, 2)
    fold_chunk(cache, 1, 3)
    want = {g: 3.0 if T <= g < 2 * T else 1.0 for g in [*range(2 * T), *range(4 * T, 5 * T)]}
    assert all(count_of(b) == want for b in cache.all_banks())
    # evict chunk 0 to the store (rows before the merged ones move up), then bring it back
    fork = cache.fork(headroom=2 * T)
    fork.compact(lambda bank: bank.field("chunk") != 0, to_store=True)
    assert all(count_of(b) == {g: c for g, c in want.items() if g >= T} for b in fork.all_banks())
    fork.restore(lambda bank: torch.arange(T))
    assert all(count_of(b) == want for b in fork.all_banks())
    # the merged rows themselves go to the store and come back with their counts
    fork.compact(lambda bank: bank.field("chunk") != 1, to_store=True)
    fork.restore(lambda bank: torch.arange(T, 2 * T))
    assert all(count_of(b) == want for b in fork.all_banks())
    assert all(count_of(b) == want for b in cache.all_banks())  # the prefilled cache was not touched
    clone = cache.fork(share=False)
    clone.regroup(0, [HeadGroup((0,), "a0"), HeadGroup((2,), "a2"), HeadGroup((1, 3), "b")])
    assert all(count_of(b) == want for b in clone.all_banks())
    want_out = query(reference, 5)[0]
    for other in (fork, clone, cache):  # identical keys: every merged cache attends as the unmerged one
        torch.testing.assert_close(query(other, 5)[0], want_out, atol=1e-6, rtol=1e-5)


def test_a_merged_row_keeps_its_count_when_storage_grows_moves_and_shrinks():
    cache = new_cache(1)
    k = randn(B, T, H, D, seed=1)
    write(cache, 0, k, randn(B, T, H, D, seed=2))
    write(cache, 1, k, randn(B, T, H, D, seed=3))
    fold_chunk(cache, 0, 1)
    for c in range(2, 40):  # grows past the first allocation several times
        write(cache, c, randn(B, T, H, D, seed=c), randn(B, T, H, D, seed=50 + c))
    bank = cache.banks[0][0]
    assert bank.counts()[:T].tolist() == [2.0] * T and bank.counts()[T:].tolist() == [1.0] * (38 * T)
    cache.compact(lambda b: b.field("chunk") < 4)  # shrinks the storage (chunk 1 was merged away)
    cache.trim()
    assert bank.capacity == bank.n == 3 * T and bank.counts().tolist() == [2.0] * T + [1.0] * (2 * T)
    assert bank.field("chunk").tolist() == [0] * T + [2] * T + [3] * T


# ---------------------------------------------------------------------------- the method's rule
def test_rows_merge_into_the_first_key_of_their_position_at_the_threshold():
    cache = KVCache(1, 1, 2, 2, ROPE)  # one head of dim 2, two positions a frame
    angle = torch.tensor([0.0, 0.3, 0.6])  # position 0's key turns by 0.3 a chunk, position 1's stays
    for c in range(3):
        a = angle[c]
        k = torch.stack([torch.stack([torch.cos(a), torch.sin(a)]), torch.tensor([1.0, 0.0])])[None, :, None]
        write(cache, c, k, torch.full_like(k, float(c)))
    bank = cache.banks[0][0]
    cos_03 = float(torch.cos(torch.tensor(0.3)))
    into, rows = merge_pairs(bank, 1, cos_03)  # chunk 1 against chunk 0: both positions reach cos(0.3)
    assert into.tolist() == [0, 1] and rows.tolist() == [2, 3]
    into, rows = merge_pairs(bank, 1, cos_03 + 1e-6)  # just above: only the unchanged position merges
    assert into.tolist() == [1] and rows.tolist() == [3]
    bank.merge(*merge_pairs(bank, 1, 0.95))  # both positions of chunk 1 fold into chunk 0's rows
    assert bank.counts().tolist() == [2.0, 2.0, 1.0, 1.0]
    # chunk 2 is compared with its position's first key (angle 0), not with the absorbed one (0.3): a run
    # of small turns does not drift into one row
    into, rows = merge_pairs(bank, 2, 0.95)
    assert into.tolist() == [1] and rows.tolist() == [3]
    into, rows = merge_pairs(bank, 2, float(torch.cos(torch.tensor(0.6))))
    assert into.tolist() == [0, 1] and rows.tolist() == [2, 3]
    assert merge_pairs(bank, 5, -1.0)[0].tolist() == []


def test_within_a_chunk_each_frame_is_compared_with_its_positions_first_key_not_the_one_it_absorbed():
    cache = KVCache(1, 1, 2, 1, ROPE)  # one head of dim 2, one token a frame
    turns = [[0.0], [0.3, 0.6, 0.62]]  # chunk 0: one frame; chunk 1: three frames turning away from it
    for c, angles in enumerate(turns):
        a = torch.tensor(angles)
        k = torch.stack([torch.cos(a), torch.sin(a)], -1)[None, :, None]  # [1, f, 1, 2]
        cache.begin_chunk(c, c, len(angles))
        cache.attend(0, k, k, torch.zeros_like(k))
        cache.commit_chunk()
    into, rows = merge_pairs(cache.banks[0][0], 1, 0.95)
    # 0.3 folds into 0.0 (cos 0.955); 0.6 is compared with 0.0 (cos 0.825): kept, and 0.62 folds into it
    assert into.tolist() == [0, 2] and rows.tolist() == [1, 3]


def test_key_cosine_is_the_lowest_over_the_batch_and_spans_every_head():
    a = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]], [[[1.0, 0.0], [0.0, 1.0]]]])  # [2, 1, 2, 2]
    b = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]], [[[1.0, 0.0], [0.0, 1.0]]]])
    assert key_cosine(a, b).tolist() == pytest.approx([0.5])  # sample 0: one head of two agrees


def test_tempcache_merges_only_the_chunk_leaving_the_window_never_the_sink():
    method = TempCache(threshold=0.999, sink_chunks=1, recent_chunks=2)
    cache = new_cache(1)
    k = randn(B, T, H, D, seed=1)
    for c in range(6):  # every chunk repeats the same keys
        write(cache, c, k, randn(B, T, H, D, seed=10 + c))
        pairs = method.merge_selector(cache.chunks[-1])(cache.banks[0][0])
        leaving = c - 2
        assert [int(x) for x in cache.banks[0][0].field("chunk")[pairs[1]].unique()] == (
            [leaving] if leaving >= 1 else [])
        cache.merge(method.merge_selector(cache.chunks[-1]))
    bank = cache.banks[0][0]
    # chunks 1 .. 3 folded into the sink's rows (the latest earlier row of their position)
    assert bank.field("chunk").tolist() == [0] * T + [4] * T + [5] * T
    assert bank.counts().tolist() == [4.0] * T + [1.0] * (2 * T)


# ---------------------------------------------------------------------------- every backbone path
@pytest.fixture(scope="module")
def tiny():
    return TinyWorldModel.random(0)


def _history(tiny, chunks: int) -> KVCache:
    """A FullKV cache of ``chunks`` chunks of random clean latents through the tiny model, whose chunk 1
    repeats, in every bank, the keys of frame 3 (the sink chunk's last frame) at each position."""
    g = tiny.geometry
    f = g.chunk_frames
    cache = KVCache.from_geometry(g)
    latents = randn(1, g.latent_channels, chunks * f, g.latent_height, g.latent_width, seed=3)
    with torch.no_grad():
        for c in range(chunks):
            cache.begin_chunk(c, c * f, f)
            frames = np.arange(c * f, (c + 1) * f, dtype=np.float64)
            tiny.predict(latents[:, :, c * f : (c + 1) * f], torch.zeros(1, f), np.zeros(f, dtype=np.int64), frames,
                         cache)
            cache.commit_chunk()
    tpf = g.tokens_per_frame
    for bank in cache.all_banks():
        k, _ = bank.history()
        k[:, f * tpf : 2 * f * tpf] = k[:, (f - 1) * tpf : f * tpf].repeat(1, f, 1, 1)
    return cache


@pytest.mark.parametrize("offload", [False, True], ids=["kv_cache", "host_offload"])
def test_exact_duplicates_merged_by_tempcache_give_fullkvs_prediction_on_the_wan_dit(tiny, offload):
    g = tiny.geometry
    f = g.chunk_frames
    full = _history(tiny, 3)
    merged = full.fork(share=False)
    method = TempCache(threshold=1.0 - 1e-5, sink_chunks=1, recent_chunks=1)
    dropped = merged.merge(method.merge_selector(merged.chunks[-1]))
    assert dropped == f * g.tokens_per_frame * g.num_heads * g.num_layers  # all of chunk 1, nothing else
    assert all(b.counts().max() == f + 1 for b in merged.all_banks())
    x = randn(1, g.latent_channels, f, g.latent_height, g.latent_width, seed=5)
    outs = []
    for cache in (full, merged):
        cache.begin_chunk(3, 3 * f, f)
        attention = HostOffloadAttention(cache) if offload else cache
        with torch.no_grad():
            outs.append(tiny.predict(x, torch.full((1, f), 0.6), np.zeros(f, dtype=np.int64),
                                     np.arange(3 * f, 4 * f, dtype=np.float64), attention))
    torch.testing.assert_close(outs[1], outs[0], atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------- the method contract
def test_tempcache_meets_the_method_contract_with_merges_replayed():
    results = check_method(build_method({"name": "tempcache", "threshold": 0.5}), context_chunks=4,
                           continuation_chunks=3)
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    pr = next(r for r in results if r.name == "PR accounted").detail
    assert float(pr.split()[1].rstrip(',')) > 0.1  # merges happened, and the replay made them too


def _duplicated(caches: int, chunks: int) -> tuple[list[KVCache], list[torch.Tensor], list[torch.Tensor]]:
    """``caches`` caches holding ``chunks`` committed chunks whose chunks 2, 3, ... repeat chunk 0's keys."""
    k0 = randn(B, T, H, D, seed=1)
    keys = [k0, randn(B, T, H, D, seed=2), *(k0.clone() for _ in range(chunks - 2))]
    values = [randn(B, T, H, D, seed=10 + i) for i in range(chunks)]
    out = [new_cache() for _ in range(caches)]
    for c in range(chunks):
        for cache in out:
            write(cache, c, keys[c], values[c])
    return out, keys, values


def test_a_probe_over_merged_rows_biases_only_the_rows_it_shows():
    """A probe hiding chunk 1 over a cache whose chunk 2 was folded into chunk 0: each shown key's logit
    carries its own log(count), so attention equals the unmerged cache's with chunk 1 hidden."""
    (full, merged), _, _ = _duplicated(2, 3)
    fold_chunk(merged, 0, 2)
    q = 2.0 * randn(B, T, H, D, seed=7)
    outs = []
    for cache in (full, merged):
        cache.begin_chunk(3, 3, 1)
        with cache.probe(hide=lambda bank: bank.field("chunk") == 1):
            outs.append([cache.attend(layer, q, q, q) for layer in range(cache.num_layers)])
    for want, got in zip(*outs):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_a_merge_with_a_chunk_open_moves_the_written_slot_along():
    """Folding chunk 2 into chunk 0 while chunk 3 is open, after layer 0 wrote its slot and before layer 1
    did: the chunk commits the same rows as when the fold came before the chunk opened, and layer 1 attends
    the same; a merge inside a probe is refused."""
    (early, late), _, _ = _duplicated(2, 3)
    fold_chunk(early, 0, 2)
    q = 2.0 * randn(B, T, H, D, seed=7)
    for cache in (early, late):
        cache.trim()  # no free row past the history: only a written layer's slot has rows to move
        cache.begin_chunk(3, 3, 1)
        cache.attend(0, q, q, q)
    fold_chunk(late, 0, 2)
    outs = [cache.attend(1, q, q, q) for cache in (early, late)]
    torch.testing.assert_close(outs[1], outs[0], atol=0, rtol=0)
    for cache in (early, late):
        cache.commit_chunk()
    for a, b in zip(early.all_banks(), late.all_banks()):
        assert a.field("gid").tolist() == b.field("gid").tolist()
        assert torch.equal(a.history()[0], b.history()[0]) and torch.equal(a.history()[1], b.history()[1])
        assert a.counts().tolist() == b.counts().tolist()
    late.begin_chunk(4, 4, 1)
    with late.probe(), pytest.raises(RuntimeError, match=r"^cannot merge inside a probe$"):
        fold_chunk(late, 0, 1)
