"""Quantized KV storage formats (cache/quantized.py, cache/quantized_bank.py): byte counts by hand, round
trips within their bounds, attention on decoded rows, eviction + restore + fork + re-index on a quantized
cache, the ``storage`` group's checks, labels and hashes, and whole continuations in a format on the tiny
model and on a tiny Wan DiT.

Caches here have 2 heads of head dim 32 (the Wan test: 12), 16 tokens a frame and chunks of 2 frames.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from cmbench.cache.format_check import check_format
from cmbench.cache.kv_cache import KVCache
from cmbench.cache.quantized import (ChannelGroups, StorageFormat, TokenGroups, affine, bytes_per_token, pack,
                                     quantize, storage_format, unpack)
from cmbench.cache.quantized_bank import QuantizedBank
from cmbench.cache.rope import RopeSpec, reindex_frames
from cmbench.cache.store import HostStore
from cmbench.errors import ConfigError

D, H, T = 32, 2, 16
L = 2 * T  # tokens of a chunk
KIVI = StorageFormat("kivi", bits=4, group_size=16, residual=8)
QVG = StorageFormat("qvg", bits=2, group_size=16, residual=0, stages=2, clusters=4, iters=5)
CHUNKMEAN = StorageFormat("chunkmean", bits=2, group_size=16, residual=0, stages=2)


def chunk_kv(i: int, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V ``[1, L, H, D]`` of chunk ``i`` (seeded; a few outlier channels in the keys, as real keys have)."""
    g = torch.Generator().manual_seed(100 * i + layer)
    k = torch.randn(1, L, H, D, generator=g)
    k[..., :3] *= 8.0
    return k, torch.randn(1, L, H, D, generator=g)


def new_cache(fmt: StorageFormat | None, layers: int = 1, store: bool = False) -> KVCache:
    cache = KVCache(layers, H, D, T, RopeSpec.wan(D), store=HostStore() if store else None)
    if fmt is not None:
        cache.use_storage(fmt)
    return cache


def write(cache: KVCache, chunks) -> list[torch.Tensor]:
    """Chunks ``i`` (frames ``2i, 2i + 1``) attended and committed in every layer; their outputs."""
    outs = []
    for i in chunks:
        cache.begin_chunk(i, 2 * i, 2)
        for layer in range(cache.num_layers):
            k, v = chunk_kv(i, layer)
            outs.append(cache.attend(layer, k.flip(1), k, v))
        cache.commit_chunk()
    return outs


# ----------------------------------------------------------------------------------------- bytes
def test_kivi_bytes_by_hand():
    cache = new_cache(KIVI)
    write(cache, [0])
    # rows: 32 tokens x 2 heads x (keys: 32 codes of 4 bits = 16 bytes; values: 16 bytes of codes + 2 groups
    # of 16 channels x (zero, scale) float16 = 8 bytes), the 8 of the recent window held there only
    row = 2 * (16 + 16 + 8)
    # key table: one group per 16 positions of a frame, 2 frames; per head: (zero, scale) x 32 channels float16
    table = 2 * 2 * (2 * 32 * 2)
    # recent window: the last 8 tokens' K and V in float32
    recent = 2 * 8 * 2 * 32 * 4
    assert cache.stored_bytes() == 24 * row + table + recent == 6528
    write(cache, [1])  # the window moves to chunk 1's last 8 tokens: chunk 0's are encoded
    assert cache.stored_bytes() == 56 * row + 2 * table + recent == 9600
    bank = cache.banks[0][0]
    k, v = chunk_kv(0)
    assert not torch.equal(bank.history()[0][:, 24:32], k[:, 24:]) and torch.equal(bank.pending, torch.arange(56, 64))
    assert torch.equal(bank.storage()[0][:, 56:64], torch.zeros_like(bank.storage()[0][:, 56:64]))  # held once


def test_kivi_window_rows_leaving_are_encoded_as_if_they_never_waited():
    """A window row encoded when a newer chunk pushes it out gets the codes it would have had at its commit
    (the key entries were fitted on its whole chunk): the history decodes as with no window at all."""
    held, plain = new_cache(KIVI), new_cache(StorageFormat("kivi", bits=4, group_size=16, residual=0))
    write(held, range(3))
    write(plain, range(3))
    (hk, hv), (pk, pv) = held.banks[0][0].history(), plain.banks[0][0].history()
    assert torch.equal(hk[:, :-8], pk[:, :-8]) and torch.equal(hv[:, :-8], pv[:, :-8])
    assert torch.equal(held.banks[0][0].storage()[0][:, :88], plain.banks[0][0].storage()[0][:, :88])
    k, v = chunk_kv(2)
    assert torch.equal(hk[:, -8:], k[:, -8:]) and torch.equal(hv[:, -8:], v[:, -8:])  # the window: exact
    assert held.stored_bytes() == plain.stored_bytes() - 8 * 2 * 40 + 2 * 8 * 2 * 32 * 4


def test_a_bank_shared_with_a_fork_encodes_its_window_first():
    """A fork reads its parent's rows in place: the parent encodes its window rows before sharing them (and
    then counts them twice), so the fork's commits find them encoded when they leave its window."""
    cache = new_cache(KIVI)
    write(cache, range(2))
    alone = cache.stored_bytes()
    fork = cache.fork(headroom=L)
    assert len(cache.banks[0][0].pending) == 0 and cache.stored_bytes() == alone + 8 * 2 * 40
    write(fork, [2])
    want = new_cache(KIVI)
    write(want, range(3))
    assert torch.equal(fork.banks[0][0].history()[0], want.banks[0][0].history()[0])
    assert fork.stored_bytes() == want.stored_bytes()


def test_kivi_allocated_bytes_by_hand():
    """What a KIVI bank allocates, once trimmed to its 32 rows: the slots of its 32 rows (2560; the 8 of the
    recent window hold zeros), key table 512, recent window 4096, as counted above, and the 45 bytes of
    provenance a row carries (frame, chunk, pos, gid, tpos: 8 each; keep: 1; priority: 4). The open chunk's
    full-precision slot (K and V, 32 tokens x 2 heads x 32 channels float32) is held only while the chunk is
    open: the commit releases it, and a fork holds none."""
    cache = new_cache(KIVI)
    write(cache, [0])
    cache.trim()
    held = 2560 + 512 + 4096 + 32 * 45
    assert cache.allocated_bytes() == held == 8608
    fork = cache.fork(headroom=L, share=False)
    fork.trim()
    assert fork.allocated_bytes() == held
    fork.begin_chunk(1, 2, 2)
    k, v = chunk_kv(1)
    fork.attend(0, k.flip(1), k, v)
    slot = 2 * 32 * 2 * 32 * 4
    assert fork.allocated_bytes() == held + slot
    fork.commit_chunk()  # 64 rows (80 bytes each), 4 key groups, the window, provenance; the slot released
    assert fork.allocated_bytes() == 64 * 80 + 2 * 512 + 4096 + 64 * 45 == 13120
    write(fork, [2])  # the next chunk allocates it again
    want = new_cache(KIVI)
    write(want, range(3))
    assert torch.equal(fork.banks[0][0].history()[0], want.banks[0][0].history()[0])


def test_chunkmean_bytes_by_hand():
    cache = new_cache(CHUNKMEAN)
    write(cache, [0, 1])
    # rows: 64 tokens x 2 heads x 2 sides x 2 stages x (32 codes of 2 bits = 8 bytes + 2 groups x 4 bytes)
    rows = 64 * 2 * 2 * 2 * (8 + 8)
    means = 2 * 2 * 2 * 32 * 2  # 2 chunks x 2 sides x 2 heads x 32 channels float16
    assert cache.stored_bytes() == rows + means


def test_stored_bytes_are_the_tensors_the_bank_holds():
    """After a trim (capacity = history) and with the tables' entries all in use, the bytes counted are the
    bytes of the tensors the bank holds (slot and provenance apart)."""
    cache = new_cache(KIVI)
    write(cache, [0, 1, 2])
    cache.compact(lambda bank: bank.field("frame") != 2)  # frame 2's key entries go with its tokens
    cache.trim()
    bank = cache.banks[0][0]
    assert isinstance(bank, QuantizedBank)
    encoded = (~torch.isin(bank.field("gid"), bank.tail_gid)).nonzero().squeeze(1)  # the window's slots hold zeros
    held = [bank.k.index_select(1, encoded), bank.v.index_select(1, encoded), *bank.tail,
            *(t.data for t in bank.tables if t.data is not None)]
    assert cache.stored_bytes() == sum(t.numel() * t.element_size() for t in held)
    assert len(bank.tables[0].keys) == 5  # frames 0, 1, 3, 4, 5: one key group each


def test_quantized_history_is_smaller_than_full_precision():
    full, kivi2 = new_cache(None), new_cache(StorageFormat("kivi", bits=2, group_size=32, residual=0))
    write(full, range(4))
    write(kivi2, range(4))
    # 2-bit codes of float32 entries are 1/16 of their size; value zero/scale and key tables add the rest
    assert kivi2.stored_bytes() / full.stored_bytes() == pytest.approx(
        (8 + 8 + 4) / 256 + 8 * 2 * 32 * 2 / (128 * 256), abs=1e-9)


# ----------------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_round_trip(bits):
    codes = torch.randint(0, 2**bits, (3, 5, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(bits))
    packed = pack(codes, bits)
    assert packed.shape == (3, 5, 32 * bits // 8)
    assert torch.equal(unpack(packed, bits), codes)
    if bits == 4:  # code i of a byte in its bits [4 i, 4 i + 4)
        assert int(pack(torch.tensor([[3, 10]], dtype=torch.uint8), 4)[0, 0]) == 3 + 16 * 10


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_affine_grid_covers_the_range_and_rounds_within_half_a_step(bits):
    x = torch.randn(4000, 16, generator=torch.Generator().manual_seed(1)) * 3 + 1
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    zero, scale = affine(lo, hi, bits)
    assert bool((zero.float() <= lo).all()) and bool((zero.float() + scale.float() * (2**bits - 1) >= hi).all())
    deq = zero.float() + quantize(x, zero, scale, bits).float() * scale.float()
    assert bool(((deq - x).abs() <= scale.float() / 2 * (1 + 1e-5)).all())
    flat = torch.full((1, 4), 0.3)  # one value: the grid's step is float16's rounding of the zero point
    z, s = affine(flat.amin(-1, keepdim=True), flat.amax(-1, keepdim=True), bits)
    assert float(s) < 1e-3 and float((z.float() + quantize(flat, z, s, bits).float() * s.float() - flat).abs().max()) < 1e-3


def test_kivi_keys_are_quantized_per_channel_over_a_key_group():
    """An outlier channel does not widen the grid of the others (per channel), and a group spans 8
    positions of one frame: the key table holds each group's per-channel minimum as its zero point."""
    cache = new_cache(StorageFormat("kivi", bits=4, group_size=8, residual=0))
    write(cache, [0])
    bank = cache.banks[0][0]
    k, _ = chunk_kv(0)
    table = bank.tables[0]
    assert table.keys.tolist() == [0, 1, 2**32, 2**32 + 1]  # (frame, positions 0-7 | 8-15) for frames 0, 1
    zero, scale = table.data[:, :, :, 0].float(), table.data[:, :, :, 1].float()  # [1, 4, H, D]
    groups = k.reshape(1, 4, 8, H, D)
    assert torch.allclose(zero, groups.amin(2), atol=1e-2)
    assert torch.allclose(scale * 15, groups.amax(2) - groups.amin(2), rtol=2e-3, atol=1e-3)
    decoded, _ = bank.history()
    err = (decoded - k).abs().reshape(1, 4, 8, H, D)
    assert bool((err <= scale[:, :, None] / 2 * (1 + 1e-3) + 1e-6).all())
    assert float(scale[..., 5:].max()) < float(scale[..., :3].min())  # the outlier channels' grids are wider


def test_values_and_chunkmean_stages_within_their_bounds():
    x = torch.randn(1, 64, H, D, generator=torch.Generator().manual_seed(3))
    one, two = TokenGroups(2, 16, 1, False), TokenGroups(2, 16, 2, False)
    err1 = (one.decode(one.encode(x, None), None, torch.float32) - x).abs()
    err2 = (two.decode(two.encode(x, None), None, torch.float32) - x).abs()
    grouped = x.reshape(1, 64, H, 2, 16)
    step = (grouped.amax(-1) - grouped.amin(-1)) / 3  # a 2-bit step of each token's channel group
    assert bool((err1.reshape(grouped.shape) <= step[..., None] / 2 * 1.01 + 1e-6).all())
    assert float(err2.mean()) < 0.45 * float(err1.mean())  # the second stage quantizes what the first left
    smooth = TokenGroups(2, 16, 1, True)
    index = torch.zeros(64, dtype=torch.long)
    mean = smooth.fit(x + 5.0, index, 1)
    assert torch.allclose(mean[0, 0, :, 0].float(), (x + 5.0).mean(1)[0], atol=1e-2)
    params = mean.index_select(1, index)
    back = smooth.decode(smooth.encode(x + 5.0, params), params, torch.float32)
    assert float((back - x - 5.0).abs().mean()) < 1.2 * float(err1.mean())  # the offset costs nothing


def test_channel_groups_codec_width_and_round_trip():
    codec = ChannelGroups(4, 8)
    x = torch.randn(1, 8, H, D)
    params = codec.fit(x, torch.zeros(8, dtype=torch.long), 1).index_select(1, torch.zeros(8, dtype=torch.long))
    raw = codec.encode(x, params)
    assert raw.dtype == torch.uint8 and raw.shape == (1, 8, H, codec.width(D)) and codec.width(D) == 16
    assert float((codec.decode(raw, params, torch.float32) - x).abs().max()) <= float(params[..., 1, :].max()) / 2 + 1e-4


# ----------------------------------------------------------------------------------------- attention
def reference_attention(q, keys, values):
    return F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)).transpose(1, 2)


@pytest.mark.parametrize("fmt", [KIVI, QVG, CHUNKMEAN], ids=["kivi", "qvg", "chunkmean"])
def test_attention_of_a_quantized_bank_is_attention_on_its_decoded_rows(fmt):
    """Attention over a quantized bank equals attention over the decoded history followed by the chunk's
    own full-precision K/V; the decoded history is near the original and not the original."""
    cache = new_cache(fmt)
    write(cache, [0, 1, 2])
    bank = cache.banks[0][0]
    decoded_k, decoded_v = bank.history()
    originals = [chunk_kv(i) for i in range(3)]
    orig_k, orig_v = torch.cat([k for k, _ in originals], 1), torch.cat([v for _, v in originals], 1)
    assert not torch.equal(decoded_k, orig_k)
    coarse = 0.3 if fmt.name == "qvg" else 0.2  # qvg's symmetric 2-bit grid has 3 levels, not 4
    assert float((decoded_k - orig_k).norm() / orig_k.norm()) < coarse
    if fmt.residual:  # the recent window is exact
        assert torch.equal(decoded_k[:, -fmt.residual:], orig_k[:, -fmt.residual:])
        assert torch.equal(decoded_v[:, -fmt.residual:], orig_v[:, -fmt.residual:])
        assert not torch.equal(decoded_k[:, -fmt.residual - 1], orig_k[:, -fmt.residual - 1])
    cache.begin_chunk(3, 6, 2)
    k, v = chunk_kv(3)
    q = torch.randn(1, L, H, D, generator=torch.Generator().manual_seed(9))
    out = cache.attend(0, q, k, v)
    want = reference_attention(q, torch.cat([decoded_k, k], 1), torch.cat([decoded_v, v], 1))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    exact = reference_attention(q, torch.cat([orig_k, k], 1), torch.cat([orig_v, v], 1))
    assert 0 < float((out - exact).norm() / exact.norm()) < 0.5  # random keys with outlier channels: coarse


# ----------------------------------------------------------------------------------------- cache operations
def evicted(bank) -> torch.Tensor:
    return (bank.field("gid") % 3) != 0


@pytest.mark.parametrize("fmt", [KIVI, QVG, CHUNKMEAN], ids=["kivi", "qvg", "chunkmean"])
def test_evict_restore_fork_on_a_quantized_cache(fmt):
    cache = new_cache(fmt, layers=2, store=True)
    write(cache, range(4))
    before = [b.history() for b in cache.all_banks()]
    bytes_before = cache.stored_bytes()
    cache.compact(evicted, to_store=True)
    assert cache.banks[0][0].n == 128 - 43 and cache.stored_bytes() < bytes_before
    for (k, v), bank in zip(before, cache.all_banks()):  # kept rows decode as before
        keep = (torch.arange(128) % 3) != 0
        now_k, now_v = bank.history()
        assert torch.equal(now_k, k[:, keep]) and torch.equal(now_v, v[:, keep])
    fork = cache.fork(headroom=2 * L)
    parent = [b.history() for b in cache.all_banks()]
    assert fork.restore(lambda bank: torch.arange(0, 128, 3)) == 43 * 2 * H
    window = torch.arange(128) >= 128 - fmt.residual  # restored window rows come back quantized
    for layer, ((k, v), bank) in enumerate(zip(before, fork.all_banks())):
        assert bank.n == 128 and torch.equal(bank.field("gid"), torch.arange(128))
        now_k, now_v = bank.history()
        if fmt.name == "kivi":  # encoded again on the key entries still in the bank: the same codes
            torch.testing.assert_close(now_k[:, ~window], k[:, ~window], atol=1e-6, rtol=0)
            torch.testing.assert_close(now_v[:, ~window], v[:, ~window], atol=1e-6, rtol=0)
        else:  # per-token grids fitted again on decoded rows: within one more rounding of the originals
            orig = torch.cat([chunk_kv(i, layer)[1] for i in range(4)], 1)
            assert float((now_v - orig).norm() / orig.norm()) < 2 * float((v - orig).norm() / orig.norm())
        assert not torch.equal(now_k[:, window], k[:, window]) or not fmt.residual
    lost = int((torch.arange(128 - fmt.residual, 128) % 3 == 0).sum())  # window rows evicted and restored
    # 2 layers: a lost window row's float32 K and V held no more, its encoded row held instead; the kept window
    # rows were encoded by the parent before it shared them, so the fork holds those twice
    row = H * fmt.row_bytes(D)
    assert fork.stored_bytes() == bytes_before - 2 * lost * (2 * H * D * 4 - row) + 2 * (fmt.residual - lost) * row
    write(fork, [5])
    for (k, v), bank in zip(parent, cache.all_banks()):  # the fork never wrote its parent
        assert bank.n == 85 and torch.equal(bank.history()[0], k) and torch.equal(bank.history()[1], v)


def test_a_shared_fork_attends_as_a_copy_and_drops_unused_table_entries():
    cache = new_cache(KIVI)
    write(cache, range(3))
    shared, copied = cache.fork(headroom=L), cache.fork(headroom=L, share=False)
    assert shared.banks[0][0].shared is not None and copied.banks[0][0].shared is None
    assert shared.stored_bytes() == copied.stored_bytes() == cache.stored_bytes()
    for fork in (shared, copied):
        fork.compact(lambda bank: bank.field("frame") >= 2)
    assert len(shared.banks[0][0].tables[0].keys) == 4 and len(cache.banks[0][0].tables[0].keys) == 6
    out_shared, out_copied = write(shared, [3]), write(copied, [3])
    torch.testing.assert_close(out_shared[0], out_copied[0], atol=0, rtol=0)


def test_regroup_and_move_keep_the_format():
    cache = new_cache(QVG)
    write(cache, range(2))
    k, v = cache.banks[0][0].history()
    from cmbench.cache.layout import HeadGroup

    cache.regroup(0, [HeadGroup((0,), "a"), HeadGroup((1,), "b")])
    for head, bank in enumerate(cache.banks[0]):
        assert isinstance(bank, QuantizedBank)
        hk, hv = bank.history()
        assert torch.equal(hk, k[:, :, head : head + 1]) and torch.equal(hv, v[:, :, head : head + 1])
    cache.park("cpu")
    assert torch.equal(cache.fork().banks[0][1].history()[0], k[:, :, 1:2])


def test_reindex_rotates_quantized_keys_like_full_precision_ones():
    """Re-indexed quantized keys are the re-indexed decoded keys up to one more rounding (fresh key
    entries); the recent window (40 tokens: the last 8 of frame 5, which moves, and frames 6, 7) is rotated
    exactly; values are untouched."""
    fmt = StorageFormat("kivi", bits=8, group_size=16, residual=40)
    cache = new_cache(fmt)
    write(cache, range(4))
    k, v = cache.banks[0][0].history()
    full = new_cache(None)
    full.begin_chunk(0, 0, 8)
    full.attend(0, k, k, v)
    full.commit_chunk()
    full.reindex(8, 2, 3.0)
    cache.reindex(8, 2, 3.0)
    want, _ = full.banks[0][0].history()
    got, got_v = cache.banks[0][0].history()
    assert not torch.allclose(got, k, atol=1e-2)  # the keys did move
    torch.testing.assert_close(got, want, atol=0.15, rtol=0)  # half an 8-bit step of the outlier channels
    assert not torch.allclose(want[:, -40:-32], k[:, -40:-32], atol=1e-2)  # frame 5's part of the window moved
    torch.testing.assert_close(got[:, -40:], want[:, -40:], atol=1e-5, rtol=0)
    assert torch.equal(got_v, v)
    assert torch.equal(cache.banks[0][0].field("tpos"), full.banks[0][0].field("tpos"))


def test_reindex_moves_every_quantized_layer_and_rewrites_no_key_it_does_not_move(monkeypatch):
    """Every bank of every layer gets its new temporal positions; a re-index that moves no frame (every frame
    among the recent ones) rewrites no key: the codes stay as they were."""
    cache = new_cache(KIVI, layers=2)
    write(cache, range(4))
    rekeyed: list[int] = []
    rekey = QuantizedBank.rekey
    monkeypatch.setattr(QuantizedBank, "rekey", lambda self, *a, **kw: rekeyed.append(self.layer) or rekey(self, *a, **kw))
    untouched = [bank.storage()[0].clone() for bank in cache.all_banks()]
    cache.reindex(8, 8, 3.0)  # 8 recent frames of 8: nothing moves
    assert rekeyed == []
    assert all(torch.equal(bank.storage()[0], k) for bank, k in zip(cache.all_banks(), untouched))
    cache.reindex(8, 2, 3.0)
    assert rekeyed == [0, 1]
    want = reindex_frames(torch.arange(8).repeat_interleave(T), 8, 2, 3.0)
    for bank in cache.all_banks():
        assert torch.equal(bank.field("tpos"), want)


def test_the_storage_format_is_chosen_before_the_first_chunk_and_keeps_the_capacity_limit():
    cache = KVCache(1, H, D, T, RopeSpec.wan(D), capacity_limit=40)
    cache.use_storage(KIVI)
    assert [bank.capacity_limit for bank in cache.all_banks()] == [40]
    write(cache, [0])
    assert cache.banks[0][0].capacity <= 40
    with pytest.raises(RuntimeError, match=r"^the storage format is chosen before the first chunk$"):
        cache.use_storage(QVG)  # a chunk is committed, none is open


def test_merging_is_refused_in_a_quantized_format():
    cache = new_cache(KIVI)
    write(cache, range(2))
    with pytest.raises(ValueError, match="cannot be merged in storage=kivi"):
        cache.banks[0][0].merge(torch.tensor([0]), torch.tensor([1]))


# ----------------------------------------------------------------------------------------- the storage group
@pytest.mark.parametrize("block, message", [
    ({"name": "kivi", "bits": 3}, "storage.bits=3: expected one of 2, 4, 8"),
    ({"name": "kivi", "bits": 4, "group_size": 0}, "storage.group_size=0: expected a whole number >= 1"),
    ({"name": "kivi", "residual": -1}, "storage.residual=-1: expected a whole number of tokens >= 0"),
    ({"name": "qvg", "stages": 0}, r"storage.stages=0: expected a whole number in \[1, 4\]"),
    ({"name": "int3"}, "storage.name='int3': expected one of fp, kivi, qvg"),
    ({"name": "kivi", "bitz": 2}, "storage.bitz: not a storage knob"),
])
def test_bad_storage_knobs_are_one_line(block, message):
    with pytest.raises(ConfigError, match=message):
        storage_format(block)


def test_group_size_must_divide_the_head_dim():
    with pytest.raises(ConfigError, match="storage.group_size=12: must divide the head dim 32"):
        new_cache(StorageFormat("kivi", group_size=12))
    assert StorageFormat("kivi", group_size=12).check(24).group_size == 12


# ----------------------------------------------------------------------------------------- `check`
@pytest.mark.parametrize("fmt", [KIVI, QVG, CHUNKMEAN, StorageFormat("kivi", bits=2, group_size=8, residual=40),
                                 StorageFormat("qvg", bits=8, group_size=32, residual=5, stages=1, clusters=8, iters=3),
                                 StorageFormat("qvg", bits=4, group_size=8, residual=20, stages=3, clusters=2, iters=1),
                                 StorageFormat("chunkmean", bits=8, group_size=32, residual=5, stages=1)],
                         ids=["kivi4", "qvg2x2", "chunkmean2x2", "kivi2", "qvg8", "qvg4x3", "chunkmean8"])
def test_the_format_check_passes_on_every_format(fmt):
    checks = check_format(fmt)
    assert [c.name for c in checks] == ["round trip", "bytes"] and all(c.passed for c in checks), checks


def test_the_format_check_sees_a_coarse_round_trip_and_uncounted_bytes(monkeypatch):
    from cmbench.cache import quantized

    floor = lambda x, zero, scale, bits: torch.floor((x - zero.float()) / torch.where(  # noqa: E731
        scale.float() > 0, scale.float(), 1.0)).clamp_(0, 2**bits - 1).to(torch.uint8)
    monkeypatch.setattr(quantized, "quantize", floor)  # a whole step off instead of half
    trip, size = check_format(KIVI)
    assert not trip.passed and size.passed
    monkeypatch.undo()
    monkeypatch.setattr(QuantizedBank, "_side_bytes", lambda self: sum(t.nbytes() for t in self.tables))
    trip, size = check_format(KIVI)  # the recent window left out of stored_bytes
    assert trip.passed and not size.passed and "stored_bytes" in size.detail


def test_check_command_checks_the_format_and_refuses_a_bad_knob_in_one_line(capsys):
    from cmbench.cli.main import main

    assert main(["check", "method=fullkv", "storage=qvg", "check.context_chunks=1",
                 "check.continuation_chunks=1"]) == 0
    out = capsys.readouterr().out
    assert "storage qvg (bits=2, group_size=32, stages=1, residual=0): format checks" in out
    assert "PASS  round trip" in out and "PASS  bytes" in out
    assert main(["check", "method=fullkv", "storage=kivi", "storage.bits=3"]) != 0
    err = capsys.readouterr()
    assert "storage.bits=3: expected one of 2, 4, 8" in err.out + err.err and "Traceback" not in err.out + err.err


# ----------------------------------------------------------------------------------------- `plan`
def plan_lines(capsys, *overrides: str) -> str:
    from cmbench.cli.main import main

    main(["plan", "backbone=lingbot_world_v2_14b", "data=cmbench", "method=fullkv", *overrides])
    return capsys.readouterr().out


def test_rows_sharing_a_key_table_entry():
    """KIVI's key entry holds a key group of one frame's positions, QVG's smoothed entry a chunk, an unsmoothed
    codec none (one row each); values' entries do not bound a re-index (it rewrites keys only)."""
    assert StorageFormat("kivi", bits=4, group_size=32).codecs()[0].entry_rows(1560, 6240) == 32
    assert StorageFormat("kivi", bits=4, group_size=32).codecs()[0].entry_rows(16, 64) == 16
    assert QVG.codecs()[0].entry_rows(1560, 6240) == CHUNKMEAN.codecs()[0].entry_rows(1560, 6240) == 6240
    assert StorageFormat("kivi", bits=4, group_size=32).codecs()[1].entry_rows(1560, 6240) == 1


def test_plan_sizes_the_cache_in_its_storage_format(capsys):
    """14B LingBot, FullKV on one H200: full precision keeps the KV in host memory; 2-bit KIVI (96 bytes a
    head-token against 512) fits it on the device, and the plan says so with the decode workspace."""
    fp = plan_lines(capsys)
    kivi2 = plan_lines(capsys, "storage=kivi", "storage.bits=2")
    assert "one H200 (139 GiB): yes (all KV in host RAM" in fp and "storage" not in fp.split("method fullkv")[1][:200]
    assert "storage kivi 2-bit (group 32, recent window 128): 96.1 bytes per head-token vs 512 in full precision" in kivi2
    assert "one H200 (139 GiB): yes (as configured)" in kivi2
    # 2 x 1024 x 40 x 128 x 2 B of K and V, and the logits' bound off a CPU; a re-index span ends at the first
    # table entry boundary at or past 1024 rows: KIVI's key groups hold 32 rows, QVG's chunk means a chunk's 6240
    assert "attention decodes 1024 history tokens at a time: 20.0 MiB of workspace and at most 64 MiB" in kivi2
    assert "the re-index at most 1055 tokens at a time (20.6 MiB); not in the KV peak" in kivi2
    qvg = plan_lines(capsys, "storage=qvg")
    assert "the re-index at most 7263 tokens at a time (141.9 MiB); not in the KV peak" in qvg
    basis = "cmbench/backbones/weights/tiny_miniworld_dynamic_key_basis.safetensors"
    lowrank = plan_lines(capsys, "storage=lowrank", "storage.rank=4", f"storage.basis={basis}")
    # its knobs, not kivi's bits and group it does not use: 4 float16 coefficients + 128 float16 values
    assert "storage lowrank rank 4 (keys on the calibrated basis, values float16, recent window 0): 264.0 bytes " \
           "per head-token vs 512" in lowrank and "-bit" not in lowrank
    assert bytes_per_token(StorageFormat("kivi", bits=4, group_size=32), 128, 2, 1560, 4680) == pytest.approx(
        64 + 64 + 16 + 2 * 128 * 2 * 49 * 3 / 4680)  # codes, value zero/scale, key table (49 groups a frame)


def test_the_plan_counts_the_open_chunks_full_precision_slot():
    """A call ends with its chunk open: a quantized cache holds every layer's full-precision slot then, beside the
    codes of the chunks before (what the replay calls ``open_slot``), and releases it at the commit; the replay's
    peak counts it, full precision's (written into the rows) does not."""
    from cmbench.backbones.memory.kv import Retention, simulate_kv

    cache = new_cache(KIVI, layers=2)
    write(cache, [0])
    before = cache.allocated_bytes()
    cache.begin_chunk(1, 2, 2)
    for layer in range(2):
        k, v = chunk_kv(1, layer)
        cache.attend(layer, k, k, v)
    slot = 2 * 2 * L * H * D * 4  # 2 layers x (K and V) x one chunk's rows in float32
    assert cache.allocated_bytes() - before == slot
    token = bytes_per_token(KIVI, D, 4, T, L)
    ret = Retention()  # FullKV
    plain, held = (simulate_kv(2, [[(H, None)]] * 2, D, 4, L, 3, 2, ret, token_bytes=token, slot_bytes=s)
                   for s in (0, 2 * D * 4))
    assert (plain.open_slot, held.open_slot) == (0, slot)
    assert held.continuation_peak == plain.continuation_peak + slot  # the prefill's peak here: the re-index, slots gone
    assert held.parked_continuation_peak == plain.parked_continuation_peak + slot
    assert held.after_chunk == plain.after_chunk  # after a commit the slot is gone
