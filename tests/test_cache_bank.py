"""One KV bank by hand (cache/bank.py): its growth and shrink policy, rows and byte accounting, provenance,
the chunk slot, compaction order, extract/insert, sharing a prefilled bank's rows with copy on write, and
clone/move/select_heads.

Every bank here is layer 3's group of heads (1, 4, 6) with batch 2 and head_dim 2, so K/V are
``[2, rows, 3, 2]``. Token ``g`` sits in frame ``g // 2`` at position ``g % 2`` (2 tokens a frame) and its keys
are ``1000 * b + 10 * g + head`` in batch ``b`` (values the negation), so the expected K/V of any list of
tokens is written down from the token ids alone.
"""

import pytest
import torch

from cmbench.cache import KVCache
from cmbench.cache.bank import Bank, grown_capacity, shrunk_capacity
from cmbench.cache.layout import HeadGroup
from fakes import assert_bank_holds, fake_geometry

LAYER = 3
HEADS = (1, 4, 6)
BATCH, DIM = 2, 2
PROVENANCE = ("frame", "chunk", "pos", "gid", "tpos", "keep", "priority")


def kv(gids, heads=HEADS):
    """K and V ``[BATCH, len(gids), len(heads), DIM]`` of tokens ``gids``: K = 1000 b + 10 g + head, V = -K."""
    b = torch.arange(BATCH, dtype=torch.float32)[:, None, None, None]
    g = torch.tensor(gids, dtype=torch.float32)[None, :, None, None]
    h = torch.tensor(heads, dtype=torch.float32)[None, None, :, None]
    k = (1000 * b + 10 * g + h).expand(BATCH, len(gids), len(heads), DIM).contiguous()
    return k, -k


def new_bank(max_tokens=None, limit=None):
    return Bank(LAYER, HeadGroup(HEADS, "all", max_tokens), limit)


def commit(bank, chunk, gids, device="cpu"):
    """Write the slot with tokens ``gids`` (K/V on ``device``) and make it history as chunk ``chunk``."""
    bank.write_slot(*(t.to(device) for t in kv(gids)))
    gid = torch.tensor(gids, dtype=torch.long)
    bank.commit(gid // 2, chunk, gid % 2, gid)


def filled(*chunks, max_tokens=None, limit=None):
    """A bank holding ``chunks`` (lists of token ids), committed as chunks 0, 1, ..."""
    bank = new_bank(max_tokens, limit)
    for c, gids in enumerate(chunks):
        commit(bank, c, gids)
    return bank


def prefilled():
    """The bank a task forks from: tokens 0-3 (chunk 0) and 4-7 (chunk 1)."""
    return filled([0, 1, 2, 3], [4, 5, 6, 7])


def task():
    """A task's bank sharing the prefilled rows 0-7 (own storage for 4 rows), then chunk 2 (tokens 8-11)
    committed into its own rows; returns (task, prefilled)."""
    source = prefilled()
    bank = source.share(4)
    commit(bank, 2, [8, 9, 10, 11])
    return bank, source


def assert_holds(bank, gids, chunks=None):
    """The history is tokens ``gids`` in this order: K/V, ids, frames and positions (and chunk indices)."""
    assert_bank_holds(bank, gids, *kv(gids), tokens_per_frame=2, chunks=chunks)


def mask(n, dropped):
    keep = torch.ones(n, dtype=torch.bool)
    keep[list(dropped)] = False
    return keep


# --- the growth and shrink policy ------------------------------------------------------------------------

@pytest.mark.parametrize("capacity, rows, limit, expected", [
    (0, 10, None, 64),      # the first allocation is at least MIN_CAPACITY
    (64, 64, None, 64),     # exactly full: no growth
    (64, 65, None, 96),     # 1.5 x
    (100, 200, None, 200),  # rows beyond 1.5 x are what is allocated
    (0, 10, 16, 16),        # a limit caps the minimum
    (64, 65, 80, 80),       # ... and the growth
    (64, 100, 80, 100),     # but never below the rows needed
])
def test_grown_capacity(capacity, rows, limit, expected):
    """The growth policy the memory planner replays: geometric by 1.5, at least 64 rows, capped by a limit
    but never below the rows asked for."""
    assert grown_capacity(capacity, rows, limit) == expected


@pytest.mark.parametrize("capacity, rows, expected", [
    (200, 40, 80),    # under a quarter: twice the rows
    (200, 49, 98),
    (200, 10, 64),    # never below MIN_CAPACITY
    (200, 0, 64),
    (200, 50, 200),   # exactly a quarter: kept
    (100, 24, 64),
    (100, 25, 100),
    (100, 30, 100),
    (64, 10, 64),     # at MIN_CAPACITY: kept
    (32, 2, 32),      # below MIN_CAPACITY (a limited bank): never grown by a shrink
])
def test_shrunk_capacity(capacity, rows, expected):
    """After a compaction leaves ``rows`` rows, storage shrinks to max(2 rows, 64) only when they use less than
    a quarter of a capacity above 64."""
    assert shrunk_capacity(capacity, rows) == expected


# --- a new bank, provenance, the slot -------------------------------------------------------------------

def test_a_new_bank_holds_nothing_and_allocates_nothing():
    """Before its first chunk a bank has no K/V storage, no provenance rows and no bytes; asking for its
    storage names the layer."""
    bank = new_bank()
    assert (bank.layer, bank.role, bank.num_heads, bank.n, bank.capacity) == (LAYER, "all", 3, 0, 0)
    assert bank.heads.tolist() == [1, 4, 6] and bank.heads.dtype == torch.long
    assert bank.k is None and bank.v is None and bank.shared is None
    assert [len(getattr(bank, name)) for name in PROVENANCE] == [0] * 7
    assert (bank.stored_bytes(), bank.shared_bytes(), bank.allocated_bytes()) == (0, 0, 0)
    with pytest.raises(RuntimeError) as err:
        bank.storage()
    assert str(err.value) == "bank of layer 3 has no K/V storage yet (no chunk was written)"


@pytest.mark.parametrize("default_dtype", [torch.float32, torch.float64])
def test_provenance_dtypes_and_bytes_per_row(default_dtype):
    """Provenance is long ids, float64 temporal positions, bool keep and float32 priorities whatever torch's
    default dtype: 4 * 8 + 8 + 1 + 4 = 45 bytes a row, which the memory planner charges per allocated row."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(default_dtype)
    try:
        bank = filled([0, 1, 2, 3])
        assert Bank.provenance_row_bytes() == 45
    finally:
        torch.set_default_dtype(before)
    dtypes = [bank.field(name).dtype for name in PROVENANCE]
    assert dtypes == [torch.long] * 4 + [torch.float64, torch.bool, torch.float32]
    assert [len(getattr(bank, name)) for name in PROVENANCE] == [bank.capacity] * 7


def test_commit_records_provenance_and_resets_decisions():
    """Committed tokens carry their frame, chunk, position and id, a temporal position equal to the frame,
    keep=True and priority -inf, whatever the slot's rows held before."""
    bank = filled([0, 1, 2, 3])
    bank.keep[4], bank.priority[4] = False, 2.0  # leftovers in the slot's rows
    commit(bank, 1, [4, 5])
    assert_holds(bank, [0, 1, 2, 3, 4, 5], chunks=[0, 0, 0, 0, 1, 1])
    assert bank.field("keep").tolist() == [True] * 6
    assert bank.field("priority").tolist() == [float("-inf")] * 6


@pytest.mark.parametrize("shape", [(1, 4, 3, 2), (2, 4, 3, 5)])
def test_write_slot_refuses_another_batch_or_head_dim(shape):
    """A chunk whose batch or head_dim differs from the stored K/V (``[2, capacity, 3, 2]``) is refused with
    both numbers; either mismatch alone is enough."""
    bank = filled([0, 1])
    with pytest.raises(ValueError) as err:
        bank.write_slot(torch.zeros(shape), torch.zeros(shape))
    assert str(err.value) == f"bank of layer 3 stores batch 2 and head_dim 2, got k of shape {shape}"


def test_history_survives_growth_and_reserve_keeps_storage_with_room():
    """A bank with 1 row that receives 70 more grows 64 -> 96 rows and keeps its first row and provenance;
    reserving rows it already has (up to exactly its capacity) keeps the same storage."""
    bank = filled([0])
    assert bank.capacity == 64
    commit(bank, 1, list(range(1, 71)))
    assert bank.capacity == 96
    assert_holds(bank, list(range(71)), chunks=[0] + [1] * 70)
    k = bank.storage()[0]
    bank.reserve(bank.n, k)
    bank.reserve(96, k)
    assert bank.storage()[0] is k
    bank.reserve(97, k)
    assert bank.capacity == 144 and bank.storage()[0] is not k


# --- reading rows ----------------------------------------------------------------------------------------

def test_gather_reads_rows_of_an_own_bank():
    bank = prefilled()
    k, v = bank.gather(torch.tensor([1, 4, 6]))
    want_k, want_v = kv([1, 4, 6])
    assert torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.parametrize("rows", [[2, 7, 8, 11], [0, 5], [8, 10], [7, 8]])
def test_gather_reads_shared_then_own_rows(rows):
    """In a task's bank rows 0-7 are the prefilled bank's and 8-11 its own; a gather spanning both (row 8 is
    the first own row) returns them in the order asked, ``[2, m, 3, 2]``."""
    bank, _ = task()
    k, v = bank.gather(torch.tensor(rows))
    want_k, want_v = kv(rows)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)


def test_a_task_reads_shared_rows_then_its_own():
    """rows(stop) of a task's bank is the prefilled rows then its own, up to ``stop``; the open slot is its own
    rows after the history."""
    bank, _ = task()
    k, v = bank.rows(10)
    want_k, want_v = kv(list(range(10)))
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    bank.write_slot(*kv([12, 13]))
    k, v = bank.slot(2)
    want_k, want_v = kv([12, 13])
    assert torch.equal(k, want_k) and torch.equal(v, want_v)


def test_rows_of_gids_and_empty_queries():
    """Rows holding any of the asked tokens and where each is in the query; an empty query or an empty bank
    answers two empty long tensors."""
    bank = filled([0, 2, 5, 7])
    rows, index = bank.rows_of_gids(torch.tensor([2, 3, 7]))
    assert rows.tolist() == [1, 3] and index.tolist() == [0, 2]
    for asked, gids in [(bank, []), (new_bank(), [1])]:
        rows, index = asked.rows_of_gids(torch.tensor(gids, dtype=torch.long))
        assert rows.shape == index.shape == (0,)
        assert rows.dtype == index.dtype == torch.long


# --- bytes ----------------------------------------------------------------------------------------------

def test_bytes_of_an_own_bank():
    """8 rows of float32 K and V ``[2, 8, 3, 2]``: 2 * 96 * 4 = 768 bytes stored; 64 rows allocated: 2 * 768 *
    4 = 6144 bytes of K/V plus 64 * 45 of provenance."""
    bank = prefilled()
    assert (bank.stored_bytes(), bank.shared_bytes(), bank.allocated_bytes()) == (768, 0, 6144 + 64 * 45)


def test_bytes_of_a_task_sharing_rows():
    """A task forked with 4 rows of headroom stores the 8 shared rows' 768 bytes but allocates only its own 4
    rows of K/V (2 * 48 * 4 = 384) and provenance for all 12 rows (12 * 45)."""
    source = prefilled()
    bank = source.share(4)
    assert (bank.n, bank.base, bank.capacity) == (8, 8, 12)
    assert (bank.stored_bytes(), bank.shared_bytes(), bank.allocated_bytes()) == (768, 768, 384 + 12 * 45)


# --- compaction -----------------------------------------------------------------------------------------

def test_keep_only_keeps_order_in_place():
    """Dropping rows 2 and 5 of 8 leaves the others in order, in the same storage (no shrink at 64 rows);
    keeping every row changes nothing."""
    bank = prefilled()
    k = bank.storage()[0]
    bank.keep_only(torch.ones(8, dtype=torch.bool))
    assert_holds(bank, list(range(8)))
    bank.keep_only(mask(8, [2, 5]))
    assert_holds(bank, [0, 1, 3, 4, 6, 7], chunks=[0, 0, 0, 1, 1, 1])
    assert bank.storage()[0] is k and bank.capacity == 64


def test_keep_only_refuses_a_mask_of_another_length():
    bank = prefilled()
    with pytest.raises(ValueError) as err:
        bank.keep_only(torch.ones(7, dtype=torch.bool))
    assert str(err.value) == "keep mask must have shape (8,), got (7,)"


def test_keep_only_moves_an_open_slot_along():
    """With an open 4-row slot, dropping rows 2 and 5 moves the slot right after the 6 kept rows."""
    bank = prefilled()
    bank.write_slot(*kv([8, 9, 10, 11]))
    bank.keep_only(mask(8, [2, 5]), slot=4)
    assert_holds(bank, [0, 1, 3, 4, 6, 7])
    k, v = bank.slot(4)
    assert torch.equal(k, kv([8, 9, 10, 11])[0]) and torch.equal(v, kv([8, 9, 10, 11])[1])


def test_keep_only_shrinks_storage_but_never_with_an_open_slot():
    """200 rows keeping every fifth (40 rows) shrink to 80; with an open slot (the capacity grown to 300 by
    it) nothing shrinks and the slot moves along."""
    every_fifth = [g for g in range(200) if g % 5 == 0]
    bank = filled(list(range(200)))
    assert bank.capacity == 200
    bank.keep_only(mask(200, [g for g in range(200) if g % 5]))
    assert bank.capacity == 80 and len(bank.gid) == 80
    assert_holds(bank, every_fifth)

    bank = filled(list(range(200)))
    bank.write_slot(*kv([200, 201, 202, 203]))
    assert bank.capacity == 300
    bank.keep_only(mask(200, [g for g in range(200) if g % 5]), slot=4)
    assert bank.capacity == 300
    assert_holds(bank, every_fifth)
    assert torch.equal(bank.slot(4)[0], kv([200, 201, 202, 203])[0])


@pytest.mark.parametrize("dropped, base", [
    (5, 4),   # a row of chunk 1: chunk 1 (rows 4-7) is copied, chunk 0 stays shared
    (7, 4),   # the last row of chunk 1: the same
    (2, 0),   # a row of chunk 0: every shared row is copied
])
def test_compaction_copies_shared_rows_from_the_dropped_rows_chunk(dropped, base):
    """Copy on write: dropping a shared row copies the shared rows from the start of its chunk into the
    task's own storage (same capacity, 12 rows); the prefilled bank is untouched."""
    bank, source = task()
    bank.keep_only(mask(12, [dropped]))
    kept = [g for g in range(12) if g != dropped]
    assert_holds(bank, kept, chunks=[g // 4 for g in kept])
    assert (bank.base, bank.capacity, bank.shared_bytes()) == (base, 12, 2 * (2 * base * 3 * 2) * 4)
    assert bank.storage()[0].shape == bank.storage()[1].shape == (2, 12 - base, 3, 2)
    assert (bank.shared is None) == (base == 0)
    assert_holds(source, list(range(8)))


def test_compaction_of_shared_rows_with_an_open_slot():
    """A task's bank grown by its slot (12 -> 64 rows: 56 own) keeps its history and the open slot when a
    shared row is dropped."""
    bank, source = task()
    bank.write_slot(*kv([12, 13, 14, 15]))
    assert bank.capacity == 64
    assert bank.storage()[0].shape == bank.storage()[1].shape == (2, 56, 3, 2)
    bank.keep_only(mask(12, [5]), slot=4)
    assert_holds(bank, [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11])
    assert (bank.base, bank.capacity) == (4, 64)
    assert torch.equal(bank.slot(4)[1], kv([12, 13, 14, 15])[1])
    assert_holds(source, list(range(8)))


# --- extract and insert ---------------------------------------------------------------------------------

def test_extract_copies_rows_and_leaves_the_bank():
    """Extract returns the rows' K/V and every provenance field as copies: changing them changes nothing."""
    bank, _ = task()
    bank.keep[3], bank.priority[3] = False, 0.5
    k, v, prov = bank.extract(torch.tensor([3, 9]))
    assert torch.equal(k, kv([3, 9])[0]) and torch.equal(v, kv([3, 9])[1])
    assert {name: prov[name].tolist() for name in PROVENANCE} == {
        "frame": [1, 4], "chunk": [0, 2], "pos": [1, 1], "gid": [3, 9], "tpos": [1.0, 4.0],
        "keep": [False, True], "priority": [0.5, float("-inf")]}
    for name in PROVENANCE:
        prov[name].zero_()
    assert_holds(bank, list(range(12)), chunks=[0] * 4 + [1] * 4 + [2] * 4)
    assert bank.field("keep")[3].item() is False and bank.field("priority")[3].item() == 0.5


def test_dropped_rows_come_back_with_insert():
    """Rows 2 and 5 extracted, dropped and inserted again are back in global-id order with their K/V and
    provenance (including the method's decisions)."""
    bank = prefilled()
    bank.priority[2], bank.keep[5] = 3.0, False
    k, v, prov = bank.extract(torch.tensor([2, 5]))
    bank.keep_only(mask(8, [2, 5]))
    bank.insert(k, v, prov)
    assert_holds(bank, list(range(8)), chunks=[0] * 4 + [1] * 4)
    assert bank.field("priority")[2].item() == 3.0 and bank.field("keep").tolist() == [True] * 5 + [False, True, True]


def test_insert_grows_a_full_bank():
    """Inserting 3 tokens into a full 64-row bank (even ids 0..126) grows it to 96 rows with all 67 tokens in
    order."""
    evens = list(range(0, 128, 2))
    bank = filled(evens)
    assert (bank.n, bank.capacity) == (64, 64)
    gid = torch.tensor([1, 61, 127])
    prov = {"frame": gid // 2, "chunk": torch.zeros(3, dtype=torch.long), "pos": gid % 2, "gid": gid,
            "tpos": (gid // 2).double(), "keep": torch.ones(3, dtype=torch.bool),
            "priority": torch.full((3,), float("-inf"))}
    bank.insert(*kv([1, 61, 127]), prov)
    assert bank.capacity == 96
    assert_holds(bank, sorted(evens + [1, 61, 127]))


def test_insert_into_shared_rows_copies_them_first():
    """A task forked from a bank without token 5 (chunk 1 = 4, 6, 7) gets it back: chunk 1's shared rows are
    copied into its own storage first, so the prefilled bank keeps its 7 tokens."""
    source = filled([0, 1, 2, 3], [4, 6, 7])
    bank = source.share(4)
    k, v = kv([5])
    prov = {"frame": torch.tensor([2]), "chunk": torch.tensor([1]), "pos": torch.tensor([1]),
            "gid": torch.tensor([5]), "tpos": torch.tensor([2.0], dtype=torch.float64),
            "keep": torch.tensor([True]), "priority": torch.tensor([1.0])}
    bank.insert(k, v, prov)
    assert_holds(bank, list(range(8)), chunks=[0] * 4 + [1] * 4)
    assert (bank.base, bank.capacity) == (4, 11)
    assert_holds(source, [0, 1, 2, 3, 4, 6, 7])


def test_insert_of_nothing_or_of_stored_tokens():
    """Inserting no rows changes nothing; inserting a token already in the history is refused."""
    bank = prefilled()
    empty = {name: bank.field(name)[:0] for name in PROVENANCE}
    bank.insert(*kv([]), empty)
    assert_holds(bank, list(range(8)))
    _, _, prov = bank.extract(torch.tensor([3]))
    with pytest.raises(ValueError) as err:
        bank.insert(*kv([3]), prov)
    assert str(err.value) == "bank of layer 3: inserted tokens are already in the history"


# --- forks: share, clone, unshare, move, select_heads -----------------------------------------------------

def test_share_reads_the_history_in_place():
    """A shared bank has the same history and provenance, its headroom as own rows, and the source's layer,
    group and capacity limit; without headroom it has no room of its own."""
    source = filled([0, 1, 2, 3], [4, 5, 6, 7], limit=100)
    source.priority[1] = 7.0
    bank = source.share(4)
    assert (bank.layer, bank.group, bank.capacity_limit) == (LAYER, source.group, 100)
    assert_holds(bank, list(range(8)), chunks=[0] * 4 + [1] * 4)
    assert bank.field("priority")[1].item() == 7.0
    assert (bank.base, bank.capacity, bank.shared_bytes()) == (8, 12, 768)
    assert (source.share().base, source.share().capacity) == (8, 8)


def test_share_of_a_sharing_or_empty_bank_is_a_copy():
    """A bank that itself shares rows is copied (it owns all its rows, with the headroom asked); an empty bank
    gives an empty bank."""
    bank, _ = task()
    copy = bank.share(3)
    assert copy.shared is None and (copy.base, copy.capacity) == (0, 15)
    assert_holds(copy, list(range(12)))
    assert new_bank().share(4).k is None


def test_unshare_copies_every_shared_row():
    """After unshare a task owns all its rows (same capacity, same history); unsharing an own bank keeps its
    storage."""
    bank, source = task()
    bank.unshare()
    assert bank.shared is None and (bank.base, bank.capacity, bank.shared_bytes()) == (0, 12, 0)
    assert_holds(bank, list(range(12)))
    assert bank.share().base == 12  # an own bank is shared, not copied
    own = source.storage()[0]
    source.unshare()
    assert source.storage()[0] is own
    assert_holds(source, list(range(8)))


def test_unshare_copies_a_first_chunk_of_one_token():
    """Even when the first chunk holds a single token (a compacted chunk), unshare copies from row 0."""
    bank = filled([0], [2, 3]).share(2)
    bank.unshare()
    assert bank.shared is None and bank.base == 0
    assert_holds(bank, [0, 2, 3], chunks=[0, 1, 1])


def test_a_fork_of_a_bank_without_history_owns_what_it_writes():
    """A bank whose every row was dropped keeps its storage but has no history to share: a fork of it owns
    its rows, so writing through its history after unshare (what re-indexing does) changes the bank."""
    source = prefilled()
    source.keep_only(torch.zeros(8, dtype=torch.bool))
    assert (source.n, source.capacity) == (0, 64)
    bank = source.share(4)
    commit(bank, 2, [8, 9, 10, 11])
    bank.unshare()
    assert bank.shared is None and (bank.base, bank.capacity, bank.shared_bytes()) == (0, 4, 0)
    keys, _ = bank.history()
    keys += 1
    assert torch.equal(bank.history()[0], kv([8, 9, 10, 11])[0] + 1)


def test_reindex_moves_the_keys_of_a_shared_fork_of_an_emptied_cache():
    """A fork sharing a prefilled cache whose only bank kept none of its tokens re-indexes the keys it
    commits exactly as a copied fork does (1 layer, 4 heads, head_dim 12, chunks of 8 tokens)."""
    geometry = fake_geometry(num_layers=1, num_heads=4, head_dim=12)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 4, 12, generator=g) for _ in range(3))

    def chunk(cache, c):
        cache.begin_chunk(c, 2 * c, 2)
        cache.attend(0, q, k, v)
        cache.commit_chunk()

    prefill = KVCache.from_geometry(geometry)
    chunk(prefill, 0)
    prefill.compact(lambda b: torch.zeros(b.n, dtype=torch.bool))
    keys = []
    for share in (True, False):
        fork = prefill.fork(share=share)
        for c in (1, 2, 3):
            chunk(fork, c)
        fork.reindex(q0=20, n_recent=1, l_virt=2.0)
        keys.append(fork.banks[0][0].history()[0])
    assert not torch.equal(keys[1][:, :8], k)  # re-indexing moved the copied fork's keys
    assert torch.equal(keys[0], keys[1])


@pytest.mark.parametrize("shared", [False, True])
def test_clone_copies_the_history_with_headroom(shared):
    """A clone owns a copy of the history (shared rows included) and provenance, with ``headroom`` free rows
    (none by default), the source's layer, group and capacity limit; writing to it leaves the source alone."""
    bank, _ = task() if shared else (filled([0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], limit=100), None)
    bank.priority[1] = 7.0
    copy = bank.clone(5)
    assert (copy.layer, copy.group, copy.capacity_limit) == (LAYER, bank.group, bank.capacity_limit)
    assert copy.shared is None and (copy.base, copy.capacity) == (0, 17)
    assert_holds(copy, list(range(12)), chunks=[0] * 4 + [1] * 4 + [2] * 4)
    assert copy.field("priority")[1].item() == 7.0
    assert bank.clone().capacity == 12
    copy.keep_only(mask(12, [0]))
    commit(copy, 3, [12, 13])
    assert_holds(bank, list(range(12)))


def test_clone_and_move_place_storage_on_the_device_asked():
    """clone(device=...) and move(device) allocate K/V on that device (the meta device here); move keeps
    exactly the history's rows."""
    bank = prefilled()
    assert bank.clone(2, device="meta").k.device.type == "meta"
    assert bank.clone(2).k.device.type == "cpu"
    bank.move("meta")
    assert bank.k.device.type == bank.v.device.type == "meta" and bank.capacity == 8


@pytest.mark.parametrize("shared", [False, True])
def test_move_keeps_exactly_the_history(shared):
    """move reallocates exactly ``n`` rows, owning every row (shared ones copied)."""
    bank = task()[0] if shared else prefilled()
    n = bank.n
    bank.move("cpu")
    assert bank.shared is None and (bank.base, bank.capacity) == (0, n)
    assert_holds(bank, list(range(n)))


def test_empty_banks_clone_and_move_to_empty_banks():
    bank = new_bank(limit=9)
    copy = bank.clone(4)
    assert copy.k is None and copy.n == 0 and copy.capacity_limit == 9
    bank.move("cpu")
    assert bank.k is None and bank.capacity == 0
    assert bank.select_heads(HeadGroup((4,))).k is None


@pytest.mark.parametrize("shared", [False, True])
def test_select_heads_keeps_the_history_of_a_subset(shared):
    """A bank for heads (4, 6) of the group (1, 4, 6) holds those heads' K/V of the same history, exactly
    ``n`` rows, with the new group and the same capacity limit."""
    bank = task()[0] if shared else filled([0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], limit=50)
    group = HeadGroup((4, 6), "static", 20)
    out = bank.select_heads(group)
    assert (out.layer, out.group, out.capacity_limit, out.capacity) == (LAYER, group, bank.capacity_limit, 12)
    k, v = out.history()
    want_k, want_v = kv(list(range(12)), heads=(4, 6))
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    assert out.field("gid").tolist() == list(range(12))


@pytest.mark.parametrize("max_tokens, limit, tokens, expected", [
    (None, None, 100, 100),  # unbounded: room for everything
    (10, None, 100, 6),      # size 10 + a chunk of 4 = 14 rows, 8 held
    (10, None, 2, 2),        # fewer tokens than that
    (6, None, 100, 4),       # already above its size: one chunk more
    (None, 30, 100, 22),     # a capacity limit caps the rows
    (None, 6, 100, 0),       # already above the limit: nothing more
    (10, 12, 100, 4),        # both: the smaller
])
def test_headroom_for(max_tokens, limit, tokens, expected):
    """Free rows worth allocating for a bank holding 8 tokens that receives ``tokens`` more in chunks of 4."""
    bank = filled([0, 1, 2, 3], [4, 5, 6, 7], max_tokens=max_tokens, limit=limit)
    assert bank.headroom_for(tokens, 4) == expected


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_row_indices_from_the_cpu_reach_storage_on_the_device(device):
    """Provenance, and so every row index, stays on the CPU while K/V live on the device: gathering own and
    shared rows, compaction, insert and select_heads move the indices there and give the same K/V."""
    source = prefilled()
    source.move(device)
    bank = source.share(4)
    commit(bank, 2, [8, 9, 10, 11], device)
    k, v = bank.gather(torch.tensor([2, 7, 8, 11]))
    assert k.device.type == device and torch.equal(k.cpu(), kv([2, 7, 8, 11])[0])
    assert torch.equal(source.gather(torch.tensor([1, 4]))[1].cpu(), kv([1, 4])[1])

    copy = source.clone()
    k, v, prov = copy.extract(torch.tensor([2, 5]))
    copy.keep_only(mask(8, [2, 5]))
    assert torch.equal(copy.history()[0].cpu(), kv([0, 1, 3, 4, 6, 7])[0])
    copy.insert(k, v, prov)
    assert copy.k.device.type == device and torch.equal(copy.history()[1].cpu(), kv(list(range(8)))[1])

    heads = source.select_heads(HeadGroup((4, 6)))
    assert heads.k.device.type == device and torch.equal(heads.history()[0].cpu(), kv(list(range(8)), (4, 6))[0])
