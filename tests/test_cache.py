"""KVCache: attention over physical history, compaction, probes, forks, stats, growth."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from cmbench.cache import HeadGroup, KVCache, PRLedger
from fakes import fake_geometry


G = fake_geometry(num_layers=2, num_heads=4, head_dim=12)
T = G.tokens_per_frame  # 4
L = G.tokens_per_chunk  # 8


def qkv(seed: int, length: int = L, heads: int = 4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, length, heads, 12, generator=g) for _ in range(3)]


def fill(cache: KVCache, chunks: int, seed: int = 0, first_chunk: int = 0):
    """Commit ``chunks`` chunks of random K/V; returns {layer: (k_all, v_all)} of what was written."""
    written = {layer: ([], []) for layer in range(cache.num_layers)}
    for c in range(first_chunk, first_chunk + chunks):
        cache.begin_chunk(c, c * G.chunk_frames, G.chunk_frames)
        for layer in range(cache.num_layers):
            q, k, v = qkv(seed * 1000 + c * 10 + layer)
            cache.attend(layer, q, torch.randn_like(k), v)  # a noisy call, overwritten below
            cache.attend(layer, q, k, v)
            written[layer][0].append(k)
            written[layer][1].append(v)
        cache.commit_chunk()
    return {layer: (torch.cat(ks, 1), torch.cat(vs, 1)) for layer, (ks, vs) in written.items()}


def reference(q, k_hist, v_hist, k, v, visible):
    """SDPA over the full history with dropped keys masked out. visible: bool [H, N_hist]."""
    keys = torch.cat([k_hist, k], 1).transpose(1, 2)
    vals = torch.cat([v_hist, v], 1).transpose(1, 2)
    mask = torch.cat([visible, torch.ones(visible.shape[0], k.shape[1], dtype=torch.bool)], 1)
    return F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=mask[None, :, None, :]).transpose(1, 2)


def test_first_chunk_attends_to_itself_only():
    cache = KVCache.from_geometry(G)
    cache.begin_chunk(0, 0, 2)
    q, k, v = qkv(1)
    out = cache.attend(0, q, k, v)
    expect = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(out, expect)


@pytest.mark.parametrize("grouped", [False, True])
def test_attention_over_compacted_equals_masked_full(grouped):
    layout = None
    if grouped:
        layout = [[HeadGroup((0, 2), "a"), HeadGroup((1, 3), "b")], [HeadGroup((0, 1, 2, 3))]]
    cache = KVCache.from_geometry(G, layout)
    written = fill(cache, 3)
    n = 3 * L
    g = torch.Generator().manual_seed(7)
    keep = {id(b): torch.rand(n, generator=g) < 0.5 for b in cache.all_banks()}
    visible = torch.zeros(2, 4, n, dtype=torch.bool)
    for b in cache.all_banks():
        visible[b.layer][b.heads] = keep[id(b)]
    dropped = cache.compact(lambda b: keep[id(b)])
    assert dropped == int((~visible).sum())
    cache.begin_chunk(3, 6, 2)
    for layer in range(2):
        q, k, v = qkv(99 + layer)
        out = cache.attend(layer, q, k, v)
        expect = reference(q, *written[layer], k, v, visible[layer])
        torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)
    assert torch.equal(cache.visible_counts(), visible.sum(-1))


def test_compaction_keeps_provenance_in_order():
    cache = KVCache.from_geometry(G)
    fill(cache, 4)
    cache.compact(lambda b: (b.field("gid") % 3) != 0)
    for bank in cache.all_banks():
        gid = bank.field("gid")
        assert torch.all(gid[1:] > gid[:-1])
        expect = torch.tensor([i for i in range(4 * L) if i % 3])
        assert torch.equal(gid, expect)
        assert torch.equal(bank.field("frame"), expect // T)
        assert torch.equal(bank.field("pos"), expect % T)
        assert torch.equal(bank.field("chunk"), expect // L)


def test_compaction_gathers_the_right_rows():
    cache = KVCache.from_geometry(G)
    written = fill(cache, 2)
    cache.compact(lambda b: b.field("pos") == 1)  # keep token position 1 of every frame
    k_hist, v_hist = cache.banks[1][0].history()
    rows = torch.arange(1, 2 * L, T)
    torch.testing.assert_close(k_hist, written[1][0][:, rows])
    torch.testing.assert_close(v_hist, written[1][1][:, rows])


def test_marks_follow_tokens_through_compaction():
    """Decisions are stored per token, so a later compaction never applies them to the wrong rows."""
    cache = KVCache.from_geometry(G)
    fill(cache, 3)
    cache.compact(lambda b: b.field("chunk") != 0)  # drop chunk 0: offsets of chunk 2 shift by L
    keep = torch.tensor([True, False] * (L // 2))
    cache.mark(2, keep=keep, priority=torch.arange(L, dtype=torch.float32))
    cache.compact(lambda b: b.field("keep"))
    for bank in cache.all_banks():
        expect = torch.cat([torch.arange(L, 2 * L), torch.arange(2 * L, 3 * L, 2)])
        assert torch.equal(bank.field("gid"), expect)
        assert torch.equal(bank.field("priority")[L:], torch.arange(0, L, 2, dtype=torch.float32))
        assert torch.all(torch.isinf(bank.field("priority")[:L]))


def snapshot(cache: KVCache):
    state = []
    for b in cache.all_banks():
        state.append((b.n, b.capacity, b.k.clone(), b.v.clone(), {n: b.field(n).clone() for n in b.PROVENANCE}))
    return state, list(cache._written), cache.current, list(cache.chunks)


def assert_same(a, b):
    (banks_a, wa, ca, cha), (banks_b, wb, cb, chb) = a, b
    assert wa == wb and ca == cb and cha == chb
    for (na, _, ka, va, pa), (nb, _, kb, vb, pb) in zip(banks_a, banks_b):
        assert na == nb
        assert torch.equal(ka[:, : na + L], kb[:, : nb + L]) and torch.equal(va[:, : na + L], vb[:, : nb + L])
        for name in pa:
            assert torch.equal(pa[name], pb[name])


@pytest.mark.parametrize("mode", ["plain", "hide", "no_history"])
def test_probe_leaves_no_trace(mode):
    cache = KVCache.from_geometry(G, [[HeadGroup((0, 1)), HeadGroup((2, 3))]] * 2)
    written = fill(cache, 2)
    cache.begin_chunk(2, 4, 2)
    q, k, v = qkv(5)
    for layer in range(2):
        cache.attend(layer, q, k, v)  # the chunk's pending K/V
    before = snapshot(cache)
    hide = {"plain": None, "hide": lambda b: b.field("frame") % 2 == 0, "no_history": None}[mode]
    with cache.probe(hide=hide, history=mode != "no_history"):
        qp, kp, vp = qkv(6)
        out = cache.attend(0, qp, kp, vp)
        cache.attend(1, qp, kp, vp)
    visible = torch.ones(4, 2 * L, dtype=torch.bool)
    if mode == "hide":
        visible[:] = (torch.arange(2 * L) // T) % 2 == 1
    if mode == "no_history":
        visible[:] = False
    torch.testing.assert_close(out, reference(qp, *written[0], kp, vp, visible), rtol=1e-5, atol=1e-6)
    assert_same(before, snapshot(cache))
    cache.commit_chunk()
    torch.testing.assert_close(cache.banks[0][0].history()[0][:, 2 * L :], k[:, :, :2])


def test_probe_before_any_attend_leaves_layers_unwritten():
    cache = KVCache.from_geometry(G)
    cache.begin_chunk(0, 0, 2)
    with cache.probe():
        for layer in range(2):
            cache.attend(layer, *qkv(layer))
    with pytest.raises(RuntimeError, match="never called attend"):
        cache.commit_chunk()


def test_commit_requires_every_layer_and_order():
    cache = KVCache.from_geometry(G)
    cache.begin_chunk(0, 0, 2)
    cache.attend(0, *qkv(0))
    with pytest.raises(RuntimeError, match=r"layers \[1\]"):
        cache.commit_chunk()
    cache.attend(1, *qkv(1))
    cache.commit_chunk()
    with pytest.raises(ValueError, match="overlap"):
        cache.begin_chunk(1, 1, 2)
    with pytest.raises(ValueError, match="does not follow"):
        cache.begin_chunk(0, 2, 2)
    cache.begin_chunk(1, 2, 2)
    with pytest.raises(ValueError, match=r"attend expects \[B, 8, 4, 12\]"):
        cache.attend(0, *qkv(0, length=4))


def test_fork_is_independent():
    cache = KVCache.from_geometry(G)
    fill(cache, 2)
    child = cache.fork()
    fill(child, 1, seed=3, first_chunk=2)
    child.compact(lambda b: b.field("chunk") > 0)
    assert cache.banks[0][0].n == 2 * L and len(cache.chunks) == 2
    assert child.banks[0][0].n == 2 * L and len(child.chunks) == 3
    assert torch.equal(cache.banks[0][0].field("gid"), torch.arange(2 * L))


def test_storage_grows_geometrically():
    cache = KVCache(1, 4, 12, T, G.rope)
    bank = cache.banks[0][0]
    capacities = set()
    for c in range(200):
        cache.begin_chunk(c, 2 * c, 2)
        cache.attend(0, *qkv(c))
        cache.commit_chunk()
        capacities.add(bank.capacity)
    assert bank.n == 200 * L
    assert len(capacities) <= math.ceil(math.log(200 * L / 64, 1.5)) + 2


def test_capacity_limit_bounds_allocation():
    cache = KVCache(1, 4, 12, T, G.rope, capacity_limit=3 * L)
    for c in range(10):
        cache.begin_chunk(c, 2 * c, 2)
        cache.attend(0, *qkv(c))
        cache.commit_chunk()
        cache.compact(lambda b, c=c: b.field("chunk") >= c - 1)
        assert cache.banks[0][0].capacity <= 3 * L


def test_max_tokens_is_checked_when_a_chunk_begins():
    cache = KVCache.from_geometry(G, [[HeadGroup((0, 1, 2, 3), max_tokens=L)]] * 2)
    fill(cache, 2)
    with pytest.raises(RuntimeError, match="over its size"):
        cache.begin_chunk(2, 4, 2)


def test_attention_stats_mass_per_frame():
    cache = KVCache.from_geometry(G, [[HeadGroup((0, 3)), HeadGroup((1, 2))]] * 2)
    written = fill(cache, 2)
    cache.compact(lambda b: b.field("frame") != 1)
    cache.begin_chunk(2, 4, 2)
    q, k, v = qkv(11)
    with cache.record_attention() as stats:
        cache.attend(0, q, k, v)
    mass = stats.mass[0]
    assert mass.shape == (4, 6)
    torch.testing.assert_close(mass.sum(1), torch.ones(4))
    assert torch.all(mass[:, 1] == 0)
    keys = torch.cat([written[0][0][:, [i for i in range(2 * L) if i // T != 1]], k], 1)
    w = torch.einsum("blhd,bnhd->bhln", q, keys).div(math.sqrt(12)).softmax(-1).mean((0, 2))  # [H, N]
    frames = torch.tensor([0] * T + [2] * T + [3] * T + [4] * T + [5] * T)
    expect = torch.zeros(4, 6).index_add_(1, frames, w)
    torch.testing.assert_close(mass, expect, rtol=1e-5, atol=1e-6)
    assert 1 not in stats.mass


def test_attention_stats_over_chosen_key_frames():
    """``record_attention(key_frames=...)``: the softmax runs over those frames' keys only (renormalised per
    query) while the attention output is the full one."""
    cache = KVCache.from_geometry(G, [[HeadGroup((0, 3)), HeadGroup((1, 2))]] * 2)
    written = fill(cache, 2)
    cache.begin_chunk(2, 4, 2)
    q, k, v = qkv(12)
    full = cache.attend(0, q, k, v)
    with cache.record_attention(key_frames=(0, 2, 4, 5)) as stats:
        out = cache.attend(0, q, k, v)
    torch.testing.assert_close(out, full)
    keys = torch.cat([written[0][0][:, [i for i in range(2 * L) if i // T in (0, 2)]], k], 1)
    w = torch.einsum("blhd,bnhd->bhln", q, keys).div(math.sqrt(12)).softmax(-1).mean((0, 2))
    frames = torch.tensor([0] * T + [2] * T + [4] * T + [5] * T)
    torch.testing.assert_close(stats.mass[0], torch.zeros(4, 6).index_add_(1, frames, w), rtol=1e-5, atol=1e-6)


def test_compaction_with_an_open_chunk_moves_its_slot():
    """A compaction between a chunk's denoising calls and its t = 0 pass: the history shrinks, the chunk's
    K/V written so far move along (attention unchanged but for the dropped keys), and the commit stores
    the chunk after the kept history."""
    cache = KVCache.from_geometry(G)
    written = fill(cache, 2)
    cache.begin_chunk(2, 4, 2)
    q, k, v = qkv(13)
    for layer in range(2):
        cache.attend(layer, q, k, v)
    cache.compact(lambda b: b.field("chunk") != 0)
    out = cache.attend(0, q, k, v)  # layer 0 written again (the t = 0 pass); layer 1 keeps the moved slot
    visible = torch.cat([torch.zeros(4, L, dtype=torch.bool), torch.ones(4, L, dtype=torch.bool)], 1)
    torch.testing.assert_close(out, reference(q, *written[0], k, v, visible))
    cache.commit_chunk()
    for layer in range(2):
        bank = cache.banks[layer][0]
        assert bank.field("gid").tolist() == list(range(L, 3 * L))
        torch.testing.assert_close(bank.history()[0], torch.cat([written[layer][0][:, L:], k], 1))
    cache.begin_chunk(3, 6, 2)
    with cache.probe(), pytest.raises(RuntimeError, match="inside a probe"):
        cache.compact(lambda b: torch.ones(b.n, dtype=torch.bool))


def test_mark_tokens_and_frame_keys():
    """Marks by global id reach any chunk's tokens in every bank; ``frame_keys`` returns whole stored
    frames with the heads of the chosen banks in head order, or None when a frame is incomplete."""
    cache = KVCache.from_geometry(G, [[HeadGroup((0, 3), "dynamic"), HeadGroup((1, 2), "static")]] * 2)
    written = fill(cache, 2)
    gids = torch.tensor([3, 9, 10, 50])  # 50 is not stored
    cache.mark_tokens(gids, keep=torch.tensor([False, True, False, True]), priority=torch.tensor([1.0, 2.0, 3.0, 4.0]))
    for bank in cache.all_banks():
        assert (~bank.field("keep")).nonzero().flatten().tolist() == [3, 10]
        assert bank.field("priority")[[3, 9, 10]].tolist() == [1.0, 2.0, 3.0]
    keys = cache.frame_keys(1, [1, 3])
    assert keys.shape == (1, 2, T, 4, 12)
    torch.testing.assert_close(keys[:, 0], written[1][0][:, T : 2 * T])
    torch.testing.assert_close(keys[:, 1], written[1][0][:, 3 * T : 4 * T])
    dynamic = cache.frame_keys(1, [1], role="dynamic")
    torch.testing.assert_close(dynamic[:, 0], written[1][0][:, T : 2 * T][:, :, [0, 3]])
    cache.compact(lambda b: b.field("gid") != 5)
    assert cache.frame_keys(1, [1]) is None and cache.frame_keys(1, [2]) is not None
    assert cache.frame_keys(1, [2], role="missing") is None


def test_accounting_cache_stores_what_the_attention_cache_stores():
    """``compute_attention=False``: the same rows, provenance, bytes and visible counts; outputs are zeros;
    recorded attention statistics are still computed."""
    caches = [KVCache.from_geometry(G, compute_attention=flag) for flag in (True, False)]
    for cache in caches:
        fill(cache, 2)
        cache.compact(lambda b: b.field("pos") != 2)
        cache.begin_chunk(2, 4, 2)
    q, k, v = qkv(14)
    outs, masses = [], []
    for cache in caches:
        with cache.record_attention() as stats:
            outs.append(cache.attend(0, q, k, v))
        cache.attend(1, q, k, v)
        cache.commit_chunk()
        masses.append(stats.mass[0])
    assert torch.all(outs[1] == 0) and not torch.all(outs[0] == 0)
    torch.testing.assert_close(masses[0], masses[1])
    for a, b in zip(*(c.all_banks() for c in caches)):
        assert torch.equal(a.history()[0], b.history()[0]) and torch.equal(a.field("gid"), b.field("gid"))
    assert torch.equal(caches[0].visible_counts(), caches[1].visible_counts())
    assert caches[0].stored_bytes() == caches[1].stored_bytes()


def test_regroup_splits_banks_without_changing_attention():
    cache = KVCache.from_geometry(G)
    fill(cache, 2)
    cache.compact(lambda b: b.field("gid") % 2 == 0)
    cache.begin_chunk(2, 4, 2)
    q, k, v = qkv(3)
    for layer in range(2):
        before = cache.attend(layer, q, k, v)
    cache.commit_chunk()
    cache.regroup(1, [HeadGroup((1,), "x"), HeadGroup((0, 2, 3), "y")])
    assert [b.group.heads for b in cache.banks[1]] == [(1,), (0, 2, 3)]
    cache.compact(lambda b: b.field("chunk") < 2)  # undo the last chunk for a like-for-like call
    cache.begin_chunk(3, 6, 2)
    for layer in range(2):
        after = cache.attend(layer, q, k, v)
    torch.testing.assert_close(after, before)
    cache.commit_chunk()
    with pytest.raises(ValueError, match="span several banks"):
        cache.regroup(1, [HeadGroup((0, 1, 2, 3))])


def split_heads_run(qkv_of) -> tuple[KVCache, PRLedger]:
    """Three chunks of 8 tokens through a cache whose layer 0 splits its heads (0, 1) | (2, 3): bank (2, 3)
    keeps only the newest chunk, every other bank keeps all. ``qkv_of(seed)`` gives each layer's q, k, v;
    the ledger records each chunk and notes memory after each commit and each compaction."""
    cache = KVCache.from_geometry(G, [[HeadGroup((0, 1)), HeadGroup((2, 3))], [HeadGroup((0, 1, 2, 3))]])
    ledger = PRLedger("generation")
    for c in range(3):
        cache.begin_chunk(c, 2 * c, 2)
        ledger.record(cache)
        for layer in range(2):
            cache.attend(layer, *qkv_of(c + layer))
        cache.commit_chunk()
        ledger.note_memory(cache)
        cache.compact(lambda b, c=c: torch.ones(b.n, dtype=torch.bool) if b.group.heads != (2, 3) else b.field("chunk") == c)
        ledger.note_memory(cache)
    return cache, ledger


def test_ledger_by_hand_with_head_groups():
    """Eq. 4 over chunks, layers and heads; the chunk being denoised counts in neither term."""
    _, ledger = split_heads_run(qkv)
    visible = [e.visible.tolist() for e in ledger.entries]
    assert visible == [[[0] * 4, [0] * 4], [[8, 8, 8, 8], [8] * 4], [[16, 16, 8, 8], [16] * 4]]
    assert [e.full for e in ledger.entries] == [0, 8, 16]
    # sum k = 0 + 64 + (16*2 + 8*2 + 16*4) = 176; sum k_full = (0 + 8 + 16) * 8 heads = 192
    assert ledger.pruning_ratio() == pytest.approx(1 - 176 / 192)
    assert ledger.peak_stored_bytes == (24 * 2 + 16 * 2 + 24 * 4) * 12 * 4 * 2
    summary = ledger.summary()
    assert summary["visible_tokens"] == 176 and summary["full_tokens"] == 192
    assert summary["chunks"][2] == {"chunk": 2, "frame_start": 4, "visible": 112, "full": 128, "min_head": 8, "max_head": 16}
    assert math.isnan(PRLedger("context").pruning_ratio())


def test_the_ledger_peak_is_the_running_maximum_when_memory_falls():
    """Compaction frees memory: the peak stays at the largest size seen, not the last one."""
    ledger = PRLedger("generation")
    for stored in (100, 300, 200, 50):
        ledger.note_memory(SimpleNamespace(stored_bytes=lambda stored=stored: stored))
    assert ledger.peak_stored_bytes == 300
    assert ledger.summary()["peak_stored_bytes"] == 300


def test_the_ledger_records_only_an_open_chunk():
    cache = KVCache.from_geometry(G)
    with pytest.raises(RuntimeError, match=r"^the ledger records an open chunk; call begin_chunk first$"):
        PRLedger("context").record(cache)
