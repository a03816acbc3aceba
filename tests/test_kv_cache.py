"""The KV cache runtime by hand (cache/kv_cache.py): construction, the open/closed chunk guards and their
messages, attend's shape checks, recorded queries and attention mass, visible history under probes,
marks, compaction into a host store, restore (with and without re-indexing), re-indexing in blocks,
regroup, fork/park/trim and the byte accounting every method's numbers are read from.

Every cache here has head_dim 4, 2 tokens a frame and chunks of one frame (chunk ``c`` is frame ``c``,
tokens ``2c`` and ``2c + 1``). The rotary layout puts one temporal pair in channels 0-1 with frequency 1
(a shift by ``d`` frames turns the pair ``(1, 0)`` into ``(cos d, sin d)``), one spatial pair in channels 2-3
and nothing else. Token ``g`` of layer ``l`` has key ``(1, 0, g, 10 l + head)`` in every head and value its
negation, so every expected K/V is written down from the token ids alone; queries are zero, so attention
is uniform over the keys a call sees.
"""

import math
import re
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

from cmbench.cache import kv_cache
from cmbench.cache.kv_cache import KVCache
from cmbench.cache.layout import HeadGroup
from cmbench.cache.rope import RopeAxis, RopeSpec
from cmbench.cache.store import HostStore
from cmbench.errors import ConfigError
from fakes import assert_bank_holds

T = 2  # tokens per frame (and per chunk)
D = 4  # head_dim
ROPE = RopeSpec(RopeAxis(2), RopeAxis(2), RopeAxis(0))  # channels 0-1 temporal (frequency 1), 2-3 spatial
SPLIT = [[HeadGroup((0,), "a"), HeadGroup((1,), "b")], [HeadGroup((0, 1))]]  # layer 0: two banks; layer 1: one


def kv(layer, gids, heads=(0, 1), batch=1):
    """K and V ``[batch, len(gids), len(heads), D]`` of tokens ``gids``: K = (1, 0, g, 10 layer + head), V = -K."""
    k = torch.zeros(batch, len(gids), len(heads), D)
    k[..., 0] = 1.0
    k[..., 2] = torch.tensor(gids, dtype=torch.float32)[:, None]
    k[..., 3] = 10.0 * layer + torch.tensor(heads, dtype=torch.float32)
    return k, -k


def new_cache(layers=2, layout=None, store=None, cls=KVCache, **kwargs):
    """A cache (of class ``cls``) of ``layers`` layers of 2 heads, head_dim 4, 2 tokens a frame."""
    return cls(layers, 2, D, T, ROPE, layout=layout, store=store, **kwargs)


def attend_all(cache, layers=None, batch=1):
    """Every layer (or ``layers``) of the open chunk attends with zero queries and its tokens' K/V; the outputs."""
    info = cache.current
    gids = list(range(info.gid_start, info.gid_start + info.length))
    outs = []
    for layer in range(cache.num_layers) if layers is None else layers:
        k, v = kv(layer, gids, batch=batch)
        outs.append(cache.attend(layer, torch.zeros_like(k), k, v))
    return outs


def filled(chunks, **kwargs):
    """A cache holding chunks ``0 .. chunks - 1`` (frame ``c`` each, tokens ``0 .. 2 chunks - 1``)."""
    cache = new_cache(**kwargs)
    for c in range(chunks):
        cache.begin_chunk(c, c, 1)
        attend_all(cache)
        cache.commit_chunk()
    return cache


def dropping(*gids):
    """A compaction selector keeping every history token but ``gids``."""
    return lambda bank: ~torch.isin(bank.field("gid"), torch.tensor(gids, dtype=torch.long))


def assert_holds(cache, layer, bank, gids, chunks=None):
    """Bank ``bank`` of ``layer`` holds tokens ``gids`` in order: K/V of its heads (unrotated), ids, frames,
    positions, temporal positions (the source frames) and chunk indices (the frames unless given)."""
    b = cache.banks[layer][bank]
    gid = torch.tensor(gids, dtype=torch.long)
    assert_bank_holds(b, gids, *kv(layer, gids, b.group.heads), tokens_per_frame=T,
                      chunks=(gid // T).tolist() if chunks is None else chunks)


def rotated(layer, gids, shifts, heads=(0, 1)):
    """Keys of ``gids`` whose temporal pair was shifted by ``shifts`` frames (one per token)."""
    k, _ = kv(layer, gids, heads)
    d = torch.tensor(shifts, dtype=torch.float64)
    k[..., 0] = d.cos().float()[:, None]
    k[..., 1] = d.sin().float()[:, None]
    return k


def exactly(message):
    """A ``pytest.raises`` pattern matching the whole message, no more."""
    return f"^{re.escape(message)}$"


# --- construction -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("build", ["direct", "from_geometry"])
def test_a_new_cache_keeps_its_arguments(build):
    """Both constructors keep the rotary layout, capacity limit (every bank's too), store and attention switch
    (on by default), and start with no chunk, no re-indexing and no fork device."""
    store = HostStore()
    if build == "direct":
        cache = KVCache(2, 2, D, T, ROPE, None, 100, store=store)
    else:
        geometry = SimpleNamespace(num_layers=2, num_heads=2, head_dim=D, tokens_per_frame=T, rope=ROPE)
        cache = KVCache.from_geometry(geometry, capacity_limit=100, store=store)
    assert (cache.num_layers, cache.num_heads, cache.head_dim, cache.tokens_per_frame) == (2, 2, D, T)
    assert cache.rope is ROPE and cache.store is store and cache.compute_attention is True
    assert cache.capacity_limit == 100 and [b.capacity_limit for b in cache.all_banks()] == [100, 100]
    assert cache.chunks == [] and cache.current is None and cache.reindexed is None and cache.fork_device is None


def test_from_geometry_passes_the_attention_switch():
    """``compute_attention=False`` reaches the cache: attend returns zeros ``[1, 2, 2, 4]``."""
    geometry = SimpleNamespace(num_layers=1, num_heads=2, head_dim=D, tokens_per_frame=T, rope=ROPE)
    cache = KVCache.from_geometry(geometry, compute_attention=False)
    cache.begin_chunk(0, 0, 1)
    assert torch.equal(attend_all(cache)[0], torch.zeros(1, 2, 2, D))


def test_layout_errors_name_the_layer():
    """A layout with the wrong number of layers, or a layer whose groups miss a head, is refused by name."""
    with pytest.raises(ValueError, match=exactly("layout has 1 layers, the cache 2")):
        new_cache(layout=[[HeadGroup((0, 1))]])
    with pytest.raises(ConfigError, match=exactly("layer 1: head groups must partition heads 0..1 exactly once, got [0]")):
        new_cache(layout=[[HeadGroup((0, 1))], [HeadGroup((0,))]])


def test_a_fresh_cache_compacts_forks_trims_parks_and_reindexes_nothing():
    """Before any chunk every operation on the (storage-less) banks is a no-op: compaction drops 0 entries,
    a fork, trim, park and re-index leave every bank without storage."""
    cache = new_cache(layout=SPLIT)
    assert cache.compact(lambda b: torch.ones(b.n, dtype=torch.bool)) == 0
    fork = cache.fork()
    cache.trim()
    cache.park()
    cache.reindex(20)
    assert cache.reindexed == (20, 8, 17.0)
    for c in (cache, fork):
        assert [b.k for b in c.all_banks()] == [None, None, None] and c.allocated_bytes() == 0


# --- the chunk timeline and its guards ----------------------------------------------------------------------

NO_CHUNK = "no open chunk: call begin_chunk first"



@pytest.mark.parametrize("call", [
    lambda c: c.commit_chunk(),
    lambda c: c.attend(0, *kv(0, [0, 1]), kv(0, [0, 1])[0]),
    lambda c: c._open_provenance(),
])
def test_calls_that_need_an_open_chunk_say_so(call):
    """Committing, attending or reading the open chunk's provenance without one raises, before the first chunk
    and after a commit."""
    for cache in (new_cache(), filled(1)):
        with pytest.raises(RuntimeError, match=exactly(NO_CHUNK)):
            call(cache)


def test_begin_chunk_refuses_a_second_open_chunk_and_empty_chunks():
    """A chunk of one frame opens; a second one while it is open, or one of no frames, is refused."""
    cache = filled(1)
    with pytest.raises(ValueError, match=exactly("chunk frames [1, +0) overlap history ending at 1")):
        cache.begin_chunk(1, 1, 0)
    info = cache.begin_chunk(1, 1, 1)
    assert (info.index, info.frame_start, info.num_frames, info.gid_start, info.length) == (1, 1, 1, 2, 2)
    with pytest.raises(RuntimeError, match=exactly("chunk 1 is still open; commit it first")):
        cache.begin_chunk(2, 2, 1)


def test_chunk_finds_the_open_and_the_committed_chunks():
    """``chunk(i)`` is the open chunk for its index and a committed one otherwise; an unknown index is named."""
    cache = filled(2)
    cache.begin_chunk(5, 4, 1)
    assert cache.chunk(5) is cache.current
    assert cache.chunk(0) is cache.chunks[0] and cache.chunk(1) is cache.chunks[1]
    with pytest.raises(KeyError, match=exactly("'no chunk 3 in the cache'")):
        cache.chunk(3)


@pytest.mark.parametrize("what, call", [
    ("fork", lambda c: c.fork()),
    ("park", lambda c: c.park()),
    ("trim", lambda c: c.trim()),
    ("regroup", lambda c: c.regroup(0, [HeadGroup((0, 1))])),
    ("re-index", lambda c: c.reindex(20)),
])
def test_operations_on_the_whole_history_refuse_an_open_chunk(what, call):
    """Fork, park, trim, regroup and re-index need a closed chunk and name the open one."""
    cache = filled(1)
    cache.begin_chunk(1, 1, 1)
    with pytest.raises(RuntimeError, match=exactly(f"cannot {what} while chunk 1 is open")):
        call(cache)


@pytest.mark.parametrize("call, message", [
    (lambda c: c.commit_chunk(), "cannot commit a chunk inside a probe"),
    (lambda c: c.compact(lambda b: torch.ones(b.n, dtype=torch.bool)), "cannot compact inside a probe"),
    (lambda c: c.restore(lambda b: torch.zeros(0, dtype=torch.long)),
     "cannot restore inside a probe (a probe leaves no trace)"),
])
def test_a_probe_refuses_commit_compact_and_restore(call, message):
    """Inside a probe nothing may change the history or end the chunk."""
    cache = filled(1, store=HostStore())
    cache.begin_chunk(1, 1, 1)
    attend_all(cache)
    with cache.probe(), pytest.raises(RuntimeError, match=exactly(message)):
        call(cache)


# --- attend ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes, message", [
    ([(1, 2, 2, 4), (1, 2, 2, 5), (1, 2, 2, 4)], "q, k, v must share one shape, got (1, 2, 2, 4), (1, 2, 2, 5), (1, 2, 2, 4)"),
    ([(1, 2, 2, 4), (1, 2, 2, 4), (1, 3, 2, 4)], "q, k, v must share one shape, got (1, 2, 2, 4), (1, 2, 2, 4), (1, 3, 2, 4)"),
    ([(1, 3, 2, 4)] * 3, "attend expects [B, 2, 2, 4] for chunk 0, got (1, 3, 2, 4)"),
    ([(1, 2, 3, 4)] * 3, "attend expects [B, 2, 2, 4] for chunk 0, got (1, 2, 3, 4)"),
    ([(1, 2, 2, 6)] * 3, "attend expects [B, 2, 2, 4] for chunk 0, got (1, 2, 2, 6)"),
])
def test_attend_refuses_other_shapes(shapes, message):
    """q, k, v must share one shape ``[B, L, H, D]`` with the open chunk's L, the cache's H and D; each wrong
    size alone is refused."""
    cache = new_cache()
    cache.begin_chunk(0, 0, 1)
    with pytest.raises(ValueError, match=exactly(message)):
        cache.attend(0, *(torch.zeros(s) for s in shapes))


def test_recorded_queries_are_each_layers_every_query_of_the_chunk():
    """``record_queries`` yields, per layer, every query ``[1, 2, 2, 4]`` of the chunk's 2 tokens (the latest call)."""
    cache = new_cache()
    cache.begin_chunk(0, 0, 1)
    with cache.record_queries() as queries:
        for layer in range(2):
            k, v = kv(layer, [0, 1])
            cache.attend(layer, k, k, v)  # q = K of tokens 0 and 1: (1, 0, g, 10 layer + head)
    for layer in range(2):
        assert torch.equal(queries[layer], kv(layer, [0, 1])[0])


def three_frames_open(**kwargs):
    """Chunks 0 and 1 committed (frames 0, 1: tokens 0-3), chunk 2 (frame 2, tokens 4, 5) open."""
    cache = filled(2, **kwargs)
    cache.begin_chunk(2, 2, 1)
    return cache


PROBES = {  # probe arguments -> history token ids seen, attention mass over frames 0, 1, 2
    "none": (None, [0, 1, 2, 3], [1 / 3, 1 / 3, 1 / 3]),
    "hide": ({"hide": lambda b: b.field("frame") == 0}, [2, 3], [0.0, 0.5, 0.5]),
    "no history": ({"history": False}, [], [0.0, 0.0, 1.0]),
}


@pytest.mark.parametrize("mode", list(PROBES))
def test_visible_history_and_attention_mass_under_probes(mode):
    """What a call sees (all history, what ``hide`` leaves, or only the chunk) is what ``visible_history``
    reports for every bank and where the recorded attention mass goes: zero queries spread it evenly over
    the keys seen (2 tokens a frame), for every head of both layers."""
    probe, gids, mass = PROBES[mode]
    cache = three_frames_open(layout=SPLIT)
    attend_all(cache)
    with cache.probe(**probe) if probe is not None else nullcontext():
        for bank in cache.all_banks():
            seen = cache.visible_history(bank)
            assert seen.dtype == torch.long and seen.tolist() == gids
        with cache.record_attention() as stats:
            attend_all(cache)
        for layer in range(2):
            torch.testing.assert_close(stats.mass[layer], torch.tensor([mass, mass]))


@pytest.mark.parametrize("layout", [None, SPLIT])
def test_an_accounting_cache_writes_every_bank_and_records_the_same_mass(layout):
    """Without attention arithmetic attend returns zeros ``[1, 2, 2, 4]`` but writes every bank's slot (the
    history equals the attention cache's) and records the same attention mass."""
    caches = [three_frames_open(layout=layout, compute_attention=compute) for compute in (True, False)]
    masses = []
    for cache in caches:
        with cache.record_attention() as stats:
            outs = attend_all(cache)
        masses.append(stats.stacked())
        cache.commit_chunk()
    assert all(torch.equal(o, torch.zeros(1, 2, 2, D)) for o in outs)
    torch.testing.assert_close(masses[1], masses[0])
    torch.testing.assert_close(masses[1], torch.full((2, 2, 3), 1 / 3))
    for layer, banks in enumerate(caches[1].banks):
        for b in range(len(banks)):
            assert_holds(caches[1], layer, b, [0, 1, 2, 3, 4, 5])


# --- marks and compaction -----------------------------------------------------------------------------------

def test_mark_only_the_banks_asked_and_keep_flags_of_any_dtype():
    """``mark(chunk, banks=[...])`` changes only those banks; keep flags given as floats are stored as bools."""
    cache = filled(2, layout=SPLIT)
    chosen = cache.banks[0][1]
    cache.mark(1, keep=torch.tensor([0.0, 1.0]), priority=torch.tensor([5, 6]), banks=[chosen])
    assert chosen.field("keep").tolist() == [True, True, False, True]
    assert chosen.field("priority").tolist() == [-math.inf, -math.inf, 5.0, 6.0]
    for bank in (cache.banks[0][0], cache.banks[1][0]):
        assert bank.field("keep").tolist() == [True] * 4
        assert bank.field("priority").tolist() == [-math.inf] * 4


def test_compaction_moves_the_evicted_rows_into_the_store():
    """``compact(select, to_store=True)`` keeps the selected rows and puts the others, K/V and provenance,
    into the store under (layer, head group), one segment per source chunk; it returns the (token, head)
    entries dropped."""
    store = HostStore()
    cache = filled(3, layout=SPLIT, store=store)
    assert cache.compact(dropping(0, 1, 3), to_store=True) == 3 * 4
    for layer, banks in enumerate(cache.banks):
        for b, bank in enumerate(banks):
            assert_holds(cache, layer, b, [2, 4, 5])
            chunks = store.chunks((layer, bank.group))
            assert sorted(chunks) == [0, 1]
            for chunk, gids in ((0, [0, 1]), (1, [3])):
                seg = chunks[chunk]
                k, v = kv(layer, gids, bank.group.heads)
                assert torch.equal(seg.k, k) and torch.equal(seg.v, v)
                assert seg.prov["gid"].tolist() == gids and seg.prov["frame"].tolist() == [g // 2 for g in gids]
                assert seg.prov["tpos"].tolist() == [float(g // 2) for g in gids]
    assert store.bytes_out == 3 * 4 * (2 * D * 4)  # 3 tokens of 4 heads, K and V of 4 float32 channels


def test_compaction_without_to_store_deletes_and_to_store_needs_a_store():
    """A plain compaction of a cache with a store leaves the store empty; ``to_store`` without a store is
    refused by name."""
    store = HostStore()
    cache = filled(2, store=store)
    assert cache.compact(dropping(1)) == 2 * 2
    assert store.segments == {} and store.bytes_out == 0
    with pytest.raises(RuntimeError, match=exactly("this cache has no store to move evicted rows into")):
        filled(1).compact(dropping(0), to_store=True)


def test_compaction_with_an_open_chunk_moves_only_the_written_slots():
    """With a chunk open, a layer that attended keeps its slot (moved along, storage never shrunk), a layer
    that has not has no slot to keep: its storage shrinks as after a closed compaction.

    Chunk 0 is 36 frames (72 tokens, storage of 72 rows); chunk 1 grows layer 0's storage to 108 rows.
    Keeping tokens 0-3 shrinks layer 1 to 64 rows (under a quarter used) and leaves layer 0 at 108."""
    cache = new_cache()
    cache.begin_chunk(0, 0, 36)
    attend_all(cache)
    cache.commit_chunk()
    cache.begin_chunk(1, 36, 1)
    attend_all(cache, layers=[0])
    cache.compact(lambda b: b.field("gid") < 4)
    assert [b.capacity for b in cache.all_banks()] == [108, 64]
    attend_all(cache, layers=[1])
    cache.commit_chunk()
    for layer in range(2):
        assert_holds(cache, layer, 0, [0, 1, 2, 3, 72, 73], chunks=[0, 0, 0, 0, 1, 1])


# --- restore ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("only_second", [False, True])
def test_restore_puts_stored_tokens_back_in_order(only_second):
    """Restoring tokens 0 and 3 (of 0-5, with 0, 1, 3 in the store) puts them back at their places with
    their K/V and provenance in every bank asked (a bank asked for nothing is skipped, not the end of its
    layer: here layer 0's first bank when only its second is asked), counts (token, head) entries, and the
    store keeps them."""
    store = HostStore()
    cache = filled(3, layout=SPLIT, store=store)
    cache.compact(dropping(0, 1, 3), to_store=True)
    second = cache.banks[0][1]
    wanted = torch.tensor([0, 3])
    restored = cache.restore(lambda b: wanted if (b is second or not only_second) else wanted[:0])
    assert restored == (2 if only_second else 8)  # 2 tokens x 1 head of that bank, or x (1 + 1 + 2) heads
    for layer, b in ((0, 0), (0, 1), (1, 0)):
        back = (layer, b) == (0, 1) or not only_second
        assert_holds(cache, layer, b, [0, 2, 3, 4, 5] if back else [2, 4, 5])
    assert store.gids((0, second.group)).tolist() == [0, 1, 3]


def test_restore_before_the_chunks_first_call_only():
    """A restore may run with a chunk open before its first attend; after it, the chunk is named."""
    cache = filled(2, store=HostStore())
    cache.compact(dropping(0, 1), to_store=True)
    cache.begin_chunk(2, 2, 1)
    assert cache.restore(lambda b: torch.tensor([1])) == 1 * 2 * 2  # 1 token x 2 heads x 2 layers
    attend_all(cache)
    with pytest.raises(RuntimeError, match=exactly("restore runs before chunk 2's first model call")):
        cache.restore(lambda b: torch.tensor([0]))
    cache.commit_chunk()
    assert_holds(cache, 1, 0, [1, 2, 3, 4, 5])


def test_restore_needs_a_store():
    with pytest.raises(RuntimeError, match=exactly("this cache has no store to restore from")):
        filled(1).restore(lambda b: torch.tensor([0]))


def test_restore_never_goes_over_a_banks_size():
    """A bank of configured size 4 may be restored up to 4 history tokens, not one more."""
    layout = [[HeadGroup((0, 1), "all", 4)]]
    cache = filled(3, layers=1, layout=layout, store=HostStore())
    cache.compact(dropping(0, 1, 2, 3), to_store=True)
    assert cache.restore(lambda b: torch.tensor([0, 1])) == 2 * 2  # 2 + 2 = 4 tokens
    with pytest.raises(RuntimeError, match=exactly("layer 0 bank 'all': restoring 1 tokens to 4 goes over its size 4")):
        cache.restore(lambda b: torch.tensor([2]))


@pytest.mark.parametrize("frame, shift", [(0, 1.5), (1, 1.0)])
def test_a_restored_key_moves_to_the_reindexed_position(frame, shift):
    """Frames 0 and 1 go to the store; ``reindex(4, 1, 2.5)`` moves frames 0, 1, 2, 3 to 1.5, 2, 2.5, 3. A
    restored token of frame 0 (or 1) comes back rotated by 1.5 (or 1) frames, at the position a token kept
    all along carries: its key and temporal position equal those of a cache that never evicted it."""
    cache = filled(4, store=HostStore())
    cache.compact(dropping(0, 1, 2, 3), to_store=True)
    cache.reindex(4, 1, 2.5)
    cache.restore(lambda b: torch.tensor([2 * frame, 2 * frame + 1]))
    kept = filled(4)
    kept.reindex(4, 1, 2.5)
    gids = [2 * frame, 2 * frame + 1, 4, 5, 6, 7]
    for layer in range(2):
        bank = cache.banks[layer][0]
        want = rotated(layer, gids, [shift, shift, 0.5, 0.5, 0.0, 0.0])
        torch.testing.assert_close(bank.history()[0], want)
        assert torch.equal(bank.history()[1], kv(layer, gids)[1])
        assert bank.field("tpos").tolist() == [2.0 - 0.5 * (1 - frame)] * 2 + [2.5, 2.5, 3.0, 3.0]
        keep = torch.isin(kept.banks[layer][0].field("gid"), torch.tensor(gids))
        torch.testing.assert_close(bank.history()[0], kept.banks[layer][0].history()[0][:, keep])


# --- re-indexing --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block_rows", [None, 0, 3])
def test_reindex_by_hand_in_any_block_size(block_rows, monkeypatch):
    """``reindex(4, 1, 2.5)`` of frames 0-3: t~ = 4 - [1 + (4 - t - 1) * 1.5 / 3] for t < 3, so 1.5, 2, 2.5, 3.
    Each key's temporal pair turns by t~ - t, spatial channels and values stay, and the temporal positions
    and ``reindexed`` record it. Re-indexed in blocks of 1 or 3 rows (a smaller block budget), the result is
    the same; applying it again changes nothing."""
    cache = filled(4)
    if block_rows is not None:
        row_bytes = 2 * D * 4  # one row of a [1, n, 2, 4] float32 bank
        monkeypatch.setattr(kv_cache, "REINDEX_BLOCK_BYTES", block_rows * row_bytes)
    shifts = [1.5, 1.5, 1.0, 1.0, 0.5, 0.5, 0.0, 0.0]
    for _ in range(2):
        cache.reindex(4, 1, 2.5)
        for layer in range(2):
            bank = cache.banks[layer][0]
            torch.testing.assert_close(bank.history()[0], rotated(layer, list(range(8)), shifts))
            assert torch.equal(bank.history()[1], kv(layer, list(range(8)))[1])
            assert bank.field("tpos").tolist() == [1.5, 1.5, 2.0, 2.0, 2.5, 2.5, 3.0, 3.0]
        assert cache.reindexed == (4, 1, 2.5)


def test_reindex_defaults_squeeze_into_17_frames_keeping_8():
    """``reindex(25)``: n_recent 8, l_virt 17, so frame 0 goes to 25 - 17 = 8 and frame 1 to
    25 - [8 + 16 * 9 / 17] = 145 / 17."""
    cache = filled(2)
    cache.reindex(25)
    bank = cache.banks[0][0]
    torch.testing.assert_close(bank.field("tpos"), torch.tensor([8.0, 8.0, 145 / 17, 145 / 17], dtype=torch.float64))
    torch.testing.assert_close(bank.history()[0], rotated(0, [0, 1, 2, 3], [8.0, 8.0, 128 / 17, 128 / 17]))


def test_reindex_skips_an_emptied_bank_and_moves_a_bank_of_one_token():
    """Layer 0's first bank kept nothing and its second bank only token 0: re-indexing skips the empty bank
    and still moves the next one's single key (frame 0 -> 1.5)."""
    cache = filled(4, layout=SPLIT)
    cache.compact(lambda b: torch.zeros(b.n, dtype=torch.bool) if b.role == "a" else b.field("gid") == 0)
    cache.reindex(4, 1, 2.5)
    assert cache.banks[0][0].n == 0
    second = cache.banks[0][1]
    torch.testing.assert_close(second.history()[0], rotated(0, [0], [1.5], heads=(1,)))
    assert second.field("tpos").tolist() == [1.5]


# --- regroup ----------------------------------------------------------------------------------------------------

def test_regroup_splits_or_keeps_a_bank_but_never_merges():
    """A layer's bank may be regrouped into the same heads or split; heads from two banks cannot merge and a
    partition missing a head is refused by layer."""
    cache = filled(2, layout=SPLIT)
    cache.regroup(1, [HeadGroup((0, 1), "same")])
    assert [b.role for b in cache.banks[1]] == ["same"]
    assert_holds(cache, 1, 0, [0, 1, 2, 3])
    cache.regroup(1, [HeadGroup((1,)), HeadGroup((0,))])
    assert [b.group.heads for b in cache.banks[1]] == [(1,), (0,)]
    assert torch.equal(cache.banks[1][1].history()[0], kv(1, [0, 1, 2, 3], heads=(0,))[0])
    with pytest.raises(ValueError, match=exactly("layer 0: heads (0, 1) span several banks and cannot be merged")):
        cache.regroup(0, [HeadGroup((0, 1))])
    with pytest.raises(ConfigError, match=exactly("layer 1: head groups must partition heads 0..1 exactly once, got [0]")):
        cache.regroup(1, [HeadGroup((0,))])


# --- accounting -------------------------------------------------------------------------------------------------

def test_visible_counts_per_layer_and_head():
    """History tokens each head sees, long ``[2 layers, 2 heads]``: layer 0's banks kept 3 and 1 tokens."""
    cache = filled(2, layout=SPLIT)
    cache.compact(lambda b: b.field("gid") < (3 if b.role == "a" else 1))
    counts = cache.visible_counts()
    assert counts.dtype == torch.long and counts.tolist() == [[3, 1], [1, 1]]


def test_kept_per_chunk_counts_every_committed_chunk():
    """Tokens of each committed chunk still stored, by chunk index (0 for a chunk dropped entirely, the last
    one included), in layer 0's first bank unless a bank is given."""
    cache = filled(3, layout=SPLIT)
    cache.compact(lambda b: {"a": (b.field("gid") != 1) & (b.field("gid") < 4), "b": b.field("gid") < 4, "all": b.field("gid") == 5}[b.role])
    assert cache.kept_per_chunk() == {0: 1, 1: 2, 2: 0}
    assert cache.kept_per_chunk(cache.banks[0][1]) == {0: 2, 1: 2, 2: 0}
    assert cache.kept_per_chunk(cache.banks[1][0]) == {0: 0, 1: 0, 2: 1}


def test_kept_per_chunk_with_chunk_indices_that_skip_numbers():
    """Chunk indices only have to increase (0, then 2, then 5): every committed chunk is counted, also when the
    highest-numbered ones kept no token in the bank."""
    cache = new_cache(layers=1)
    for index, frame in ((0, 0), (2, 1), (5, 2)):
        cache.begin_chunk(index, frame, 1)
        attend_all(cache)
        cache.commit_chunk()
    cache.compact(lambda b: b.field("gid") < 3)
    assert cache.kept_per_chunk() == {0: 2, 2: 1, 5: 0}


def test_kept_per_chunk_of_a_cache_without_chunks_is_empty():
    """Before the first chunk there is nothing to count (no last chunk index to size the counts by)."""
    assert new_cache().kept_per_chunk() == {}


class HalfOfTheHeads(KVCache):
    """A cache holding one of two equal shares of the model's history (as a rank of a split does)."""

    def store_shares(self) -> int:
        return 2


@pytest.mark.parametrize("cls, shares", [(KVCache, 1), (HalfOfTheHeads, 2)])
def test_store_bytes_are_the_peak_and_the_traffic_both_ways(cls, shares):
    """One layer of 2 heads: a token's K and V are 2 x 2 heads x 4 float32 = 64 bytes. Moving 3 tokens out
    and 2 back: peak 192 bytes, traffic 192 + 128, for this cache's store; the model's store is that times
    the shares (a plain cache holds the whole model's: one share). Without a store both are 0."""
    cache = filled(3, layers=1, store=HostStore(), cls=cls)
    cache.compact(dropping(0, 1, 3), to_store=True)
    cache.restore(lambda b: torch.tensor([0, 3]))
    assert cache.store_shares() == shares
    assert cache.store_bytes() == (192 * shares, 320 * shares)
    assert filled(1, cls=cls).store_bytes() == (0, 0)


def test_allocated_and_shared_bytes_of_a_cache_and_its_forks():
    """Two layers of one bank of 2 heads holding 4 tokens in 64 rows: K and V 2 x 64 x 2 x 4 x 4 = 4096 bytes,
    provenance 64 x 45 bytes. A sharing fork allocates only one chunk's rows (2 x 2 x 2 x 4 x 4 + 6 x 45)
    and reads 4 rows in place (2 x 4 x 2 x 4 x 4 bytes); a copying fork allocates 6 rows and shares none."""
    cache = filled(2)
    assert cache.allocated_bytes() == 2 * (4096 + 64 * 45) and cache.shared_bytes() == 0
    shared, copied = cache.fork(), cache.fork(share=False)
    assert shared.allocated_bytes() == 2 * (128 + 6 * 45) and shared.shared_bytes() == 2 * 256
    assert copied.allocated_bytes() == 2 * (384 + 6 * 45) and copied.shared_bytes() == 0
    assert cache.stored_bytes() == shared.stored_bytes() == copied.stored_bytes() == 2 * 256


def test_trim_and_park_keep_exactly_the_history():
    """Trimming or parking (to the host, by default the CPU) reallocates every bank to its history rows; a
    cache parked where it already is keeps no fork device, so its forks still share its rows."""
    for op in (lambda c: c.trim(), lambda c: c.park(), lambda c: c.park("cpu")):
        cache = filled(2, layout=SPLIT)
        op(cache)
        assert [b.capacity for b in cache.all_banks()] == [4, 4, 4]
        for layer, b in ((0, 0), (0, 1), (1, 0)):
            assert_holds(cache, layer, b, [0, 1, 2, 3])
        assert cache.fork_device is None
        assert cache.fork().shared_bytes() == 2 * 4 * D * 4 * (1 + 1 + 2)  # K and V of 4 rows of 1, 1 and 2 heads


def test_park_moves_the_banks_to_the_host_and_remembers_their_device():
    """Parking on another device (``meta`` stands in for host memory on a CPU-only machine) moves every bank
    there, trimmed to its 2 history rows, and records the CPU the banks came from as where forks go; parking
    again where they already are keeps that device."""
    cache = filled(1, layout=SPLIT)
    for _ in range(2):
        cache.park("meta")
        assert [(b.k.device.type, b.v.device.type, b.capacity) for b in cache.all_banks()] == [("meta", "meta", 2)] * 3
        assert cache.fork_device == torch.device("cpu")


# --- fork -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("share", [True, False])
def test_fork_allocates_its_headroom(share):
    """A fork's own rows per bank: ``max(headroom, largest chunk)`` more tokens (2 by default, 10 asked), no
    more than a configured size 5 allows (5 + one chunk of 2 = 7 rows in all)."""
    for max_tokens, headroom, rows in ((None, 0, 6), (None, 10, 14), (5, 10, 7)):
        cache = filled(2, layers=1, layout=[[HeadGroup((0, 1), "all", max_tokens)]])
        fork = cache.fork(headroom, share=share) if headroom else cache.fork(share=share)
        bank = fork.banks[0][0]
        assert bank.capacity == rows and (bank.base == 4) == share
        assert bank.k.shape[1] == (rows - 4 if share else rows)


def test_a_fork_is_a_fresh_independent_cache():
    """A fork shares rows by default, has no fork device, its own unwritten layers (it compacts before any
    chunk) and its own store holding the same segments with counters at zero; re-indexing or compacting the
    fork leaves the prefilled cache as it was."""
    store = HostStore()
    cache = filled(3, store=store)
    cache.compact(dropping(0), to_store=True)
    fork = cache.fork()
    assert fork.fork_device is None and fork.shared_bytes() == 2 * 2 * (5 * 2 * D * 4)
    assert fork.store is not store and fork.store.segments is not store.segments
    assert all(fork.store.chunks(key)[c] is seg for key, held in store.segments.items() for c, seg in held.items())
    assert (fork.store.bytes_out, fork.store.peak_bytes) == (0, store.stored_bytes)
    fork.reindex(4, 1, 2.5)
    assert fork.compact(dropping(2)) == 1 * 2 * 2
    for layer in range(2):
        assert_holds(cache, layer, 0, [1, 2, 3, 4, 5])
    assert cache.reindexed is None and fork.reindexed == (4, 1, 2.5)
    assert fork.restore(lambda b: torch.tensor([0])) == 4
    assert store.bytes_in == 0
