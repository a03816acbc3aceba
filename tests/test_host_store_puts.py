"""``HostStore.put``: rows of one source chunk arriving in several moves are all kept, each once, and the
byte counters equal the bytes the store holds (counted by hand from the rows' shapes)."""

from __future__ import annotations

import pytest
import torch

from cmbench.cache.layout import HeadGroup
from cmbench.cache.store import FIELDS, HostStore, Segment

B, HG, D = 2, 3, 4  # batch, heads of the bank, channels per head
ROW_BYTES = 2 * B * HG * D * 4  # K and V of one row, float32
KEY = (0, HeadGroup((0, 1, 2)))


def rows(gids: list[int], chunk: int) -> Segment:
    """A segment of rows with these global ids, all from source ``chunk``; K and V encode the id.

    Parameters
    ----------
    gids : list of int
        Increasing global ids.
    chunk : int

    Returns
    -------
    Segment
        ``k[b, i, h, d] = gid_i + 0.5 * b``, ``v = -k``; provenance ``chunk`` is ``chunk``, ``gid`` the ids,
        the other fields derived from the id.
    """
    gid = torch.tensor(gids, dtype=torch.long)
    k = gid.float()[None, :, None, None] + 0.5 * torch.arange(B).float()[:, None, None, None]
    k = k.expand(B, len(gids), HG, D).contiguous()
    prov = {name: gid.clone() for name in FIELDS}
    prov["chunk"] = torch.full_like(gid, chunk)
    prov["keep"] = torch.ones(len(gids), dtype=torch.bool)
    prov["priority"] = torch.zeros(len(gids))
    return Segment(k, -k, prov)


def held_bytes(store: HostStore) -> int:
    """K and V bytes of every segment the store holds, from the tensors themselves."""
    return sum(2 * seg.k.numel() * seg.k.element_size() for chunks in store.segments.values()
               for seg in chunks.values())


def test_two_moves_of_one_chunk_keep_both_sets_of_rows_and_count_each_once():
    """Chunk 5 leaves the device in two compactions (ids 10-13, then 14-16): the store holds all seven
    rows, in id order, with their own keys and values, and its bytes are seven rows'."""
    store = HostStore()
    store.put(KEY, rows([10, 11, 12, 13], chunk=5))
    store.put(KEY, rows([14, 15, 16], chunk=5))
    assert store.gids(KEY).tolist() == [10, 11, 12, 13, 14, 15, 16]
    assert store.stored_chunks() == [5]
    assert store.tokens() == 7 * HG
    assert store.stored_bytes == 7 * ROW_BYTES == held_bytes(store)
    assert store.peak_bytes == 7 * ROW_BYTES and store.bytes_out == 7 * ROW_BYTES
    seg = store.chunks(KEY)[5]
    expected = rows(list(range(10, 17)), chunk=5)
    assert torch.equal(seg.k, expected.k) and torch.equal(seg.v, expected.v)
    got = store.fetch(KEY, torch.tensor([11, 15]))
    assert got is not None and got.gid.tolist() == [11, 15]
    assert got.k[0, :, 0, 0].tolist() == [11.0, 15.0]


def test_a_move_of_rows_the_store_already_holds_adds_only_the_new_ones():
    """Restored copies sent out again are not moved twice: the second put of ids 12-15 of the same chunk
    adds 14 and 15 only, to bytes held and bytes moved alike; interleaved ids come back in id order."""
    store = HostStore()
    store.put(KEY, rows([10, 12, 13], chunk=2))
    store.put(KEY, rows([11, 12, 13, 14], chunk=2))
    assert store.gids(KEY).tolist() == [10, 11, 12, 13, 14]
    assert store.stored_bytes == 5 * ROW_BYTES == held_bytes(store) == store.bytes_out
    seg = store.chunks(KEY)[2]
    assert seg.k[1, :, 2, 3].tolist() == [10.5, 11.5, 12.5, 13.5, 14.5] == (-seg.v[1, :, 2, 3]).tolist()
    assert seg.prov["chunk"].tolist() == [2] * 5


def test_a_bounded_store_drops_a_chunk_moved_in_two_puts_as_a_whole():
    """The bound counts every row of a chunk moved in two puts: a third put that overflows drops the whole
    oldest chunk (both moves' rows) and leaves the byte count at what is held."""
    store = HostStore(max_bytes=8 * ROW_BYTES)
    store.put(KEY, rows([0, 1, 2], chunk=0))
    store.put(KEY, rows([3, 4, 5], chunk=0))
    store.put(KEY, rows([6, 7, 8], chunk=1))  # 9 rows > 8: chunk 0 (6 rows) goes
    assert store.gids(KEY).tolist() == [6, 7, 8]
    assert store.stored_bytes == 3 * ROW_BYTES == held_bytes(store)
    assert store.dropped_tokens == 6 * HG and store.peak_bytes == 6 * ROW_BYTES


def test_ids_of_nothing_stored_are_an_empty_index_and_a_negative_budget_is_refused():
    """A bank with nothing stored (or none of the chunks asked for) gives an empty ``long`` index, usable
    to index rows as any other; a negative byte budget is refused naming it."""
    store = HostStore()
    store.put(KEY, rows([10, 11], chunk=2))
    for empty in (HostStore().gids(KEY), store.gids(KEY, chunks=[7])):
        assert empty.dtype == torch.long and empty.shape == (0,)
    with pytest.raises(ValueError, match=r"^store max_bytes must be >= 0, got -1$"):
        HostStore(max_bytes=-1)
