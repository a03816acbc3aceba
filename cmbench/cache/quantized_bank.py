"""A bank whose history is stored in a quantized format (:mod:`cmbench.cache.quantized`).

The bank's own and shared storage hold *encoded* rows, ``uint8 [B, rows, Hg, W]`` (``W`` the codec's
row width, one per side): every row operation of :class:`~cmbench.cache.bank.Bank` (eviction,
insertion, copy on write, sharing with a fork, head selection, moves) works on them unchanged. Around
them the bank keeps:

- the open chunk's slot in full precision, ``[B, L, Hg, D]`` (every denoising call overwrites it; it is
  encoded once, by :meth:`commit`, which releases it: nothing reads it between a commit and the next chunk's
  first write, which allocates it again, so a committed or forked cache holds no full-precision chunk);
- one :class:`~cmbench.cache.quantized.Table` per side (KIVI's key zero points and scales, qvg's centroids,
  chunkmean's chunk means): immutable tensors, replaced rather than written, so a fork reads its parent's
  tables in place; an entry no history row uses any more is dropped at the next compaction;
- the full-precision recent window, the last ``residual`` committed tokens (``gid [t]``, ``k, v [B, t, Hg, D]``),
  held once: a window row's encoded slot holds zeros, no codes (``pending``), until a newer chunk pushes the row
  out of the window, when it is encoded from the window's copy on the table entries fitted at its commit
  (the codes it would have had). A bank about to be shared with a fork encodes its pending rows first (a
  fork never writes the rows it shares), and then holds those rows twice, as its ``stored_bytes`` counts.

An attention call reads the history through :meth:`blocks`: :data:`DECODE_ROWS` rows decoded at a time and
combined by their log-sum-exp (:mod:`cmbench.cache.block_attention`), so its workspace is a block, not the
history; the bank never holds a full-precision copy of its history. :meth:`rows` and :meth:`gather` return
*decoded* keys and values for the other readers (a method's key scoring). Attention statistics read
:meth:`blocks` too. Evicted rows move to the host store decoded (:meth:`extract`) and are encoded again on :meth:`insert`: a row whose table entry is
still in the bank is encoded on that entry, which reproduces its codes exactly; a row whose entry went
with its last neighbour gets an entry fitted on the restored rows (a second rounding). The temporal
re-index (:meth:`rekey`) decodes the keys a block at a time, rotates them and encodes them again on fresh
entries (keys quantized per channel cannot be rotated in their codes: a rotation mixes channel pairs).
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from cmbench.cache.bank import Bank
from cmbench.cache.layout import HeadGroup
from cmbench.cache.codec import Table
from cmbench.cache.quantized import StorageFormat

DECODE_ROWS = 1024
"""History rows an attention call decodes at once (:meth:`QuantizedBank.blocks`): the workspace of a call is one
block of decoded rows, not the bank's history."""


class QuantizedBank(Bank):
    """A :class:`Bank` storing its history in ``storage`` (a quantized :class:`StorageFormat`).

    Parameters
    ----------
    layer, group, capacity_limit
        As for :class:`Bank`.
    storage : StorageFormat
        A quantized or low-rank format (``kivi``, ``qvg``, ``chunkmean``, ``lowrank``), checked.
    """

    def __init__(self, layer: int, group: HeadGroup, capacity_limit: int | None = None,
                 storage: StorageFormat | None = None) -> None:
        super().__init__(layer, group, capacity_limit)
        if storage is None or not storage.quantized:
            raise ValueError("a QuantizedBank needs a quantized storage format")
        self.format = storage
        self.codecs = storage.codecs(layer, group.heads)
        self.tables = (Table.empty(), Table.empty())
        self.head_dim: int | None = None
        self.dtype: torch.dtype | None = None
        self._slot: torch.Tensor | None = None  # [2, B, L, Hg, D]: the open chunk's K and V
        self.tail_gid = torch.zeros(0, dtype=torch.long)
        self.tail: tuple[torch.Tensor, torch.Tensor] | None = None  # full-precision K, V [B, t, Hg, D]
        self.pending = torch.zeros(0, dtype=torch.long)  # window gids whose encoded slot is unwritten (sorted)

    # ------------------------------------------------------------------ hooks of Bank
    def _empty(self, group: HeadGroup | None = None) -> "QuantizedBank":
        out = QuantizedBank(self.layer, self.group if group is None else group, self.capacity_limit, self.format)
        out.head_dim, out.dtype = self.head_dim, self.dtype
        return out

    def _allocate(self, rows: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.head_dim is not None
        wk, wv = (codec.width(self.head_dim) for codec in self.codecs)
        shape = (like.shape[0], rows, self.num_heads)
        return (torch.empty((*shape, wk), dtype=torch.uint8, device=like.device),
                torch.empty((*shape, wv), dtype=torch.uint8, device=like.device))

    def model_element_bytes(self) -> int | None:
        return None if self.dtype is None else torch.empty(0, dtype=self.dtype).element_size()

    def _adopt(self, src: "QuantizedBank", heads: torch.Tensor | None = None,
               device: torch.device | str | None = None) -> None:
        """Take ``src``'s tables and recent window (its ``heads`` only; on ``device``)."""
        def fit(t: torch.Tensor, dim: int) -> torch.Tensor:
            t = t if heads is None else t.index_select(dim, heads.to(t.device))
            return t if device is None else t.to(device)
        self.tables = tuple(table.map(lambda d: fit(d, 2)) for table in src.tables)  # type: ignore[assignment]
        self.tail_gid, self.pending = src.tail_gid, src.pending
        self.tail = None if src.tail is None else (fit(src.tail[0], 2), fit(src.tail[1], 2))

    # ------------------------------------------------------------------ the chunk slot
    def write_slot(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Overwrite the full-precision slot with this group's slice of the chunk, ``k, v [B, L, Hg, D]``."""
        if self.head_dim is None:
            self.head_dim, self.dtype = k.shape[-1], k.dtype
            self.format.check(self.head_dim)
        if self.k is not None and (k.shape[0] != self.k.shape[0] or k.shape[-1] != self.head_dim):
            raise ValueError(f"bank of layer {self.layer} stores batch {self.k.shape[0]} and head_dim "
                             f"{self.head_dim}, got k of shape {tuple(k.shape)}")
        if self._slot is None or self._slot.shape[1:] != k.shape or self._slot.device != k.device:
            self._slot = k.new_empty((2, *k.shape))
        self._slot[0], self._slot[1] = k, v

    def slot(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the full-precision slot, each ``[B, length, Hg, D]``."""
        if self._slot is None:
            raise RuntimeError(f"bank of layer {self.layer} has no chunk slot (no chunk was written)")
        return self._slot[0, :, :length], self._slot[1, :, :length]

    def commit(self, frame: torch.Tensor, chunk: int, pos: torch.Tensor, gid: torch.Tensor) -> None:
        """Make the slot history rows with provenance ``frame, pos, gid [L]``: table entries fitted on all of
        them, the rows outside the new recent window encoded, those in it held in full precision only; the
        rows it pushes out of the window are encoded."""
        k, v = self.slot(len(gid))
        prov = {"frame": frame, "chunk": torch.full_like(gid, chunk), "pos": pos, "gid": gid}
        raw_k, raw_v = self._encode(k, v, prov)
        self.reserve(self.n + len(gid), raw_k)
        own_k, own_v = self.storage()
        r = self.format.residual
        window = torch.cat([self.tail_gid, gid])[-r:] if r else gid[:0]
        held = torch.isin(gid, window)
        raw_k[:, held.to(raw_k.device)], raw_v[:, held.to(raw_v.device)] = 0, 0  # a held row's slot: zeros, no codes
        own = self.n - self.base
        own_k[:, own : own + len(gid)], own_v[:, own : own + len(gid)] = raw_k, raw_v
        super().commit(frame, chunk, pos, gid)
        self._write_pending(self.pending[~torch.isin(self.pending, window)])
        self.pending = torch.cat([self.pending[torch.isin(self.pending, window)], gid[held]])
        if r:
            self._push_tail(gid, k, v)
        self._slot = None  # encoded (the window's rows copied): the next chunk's first write allocates it again

    def _push_tail(self, gid: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep the last ``residual`` committed tokens in full precision (these newest ones last)."""
        r = self.format.residual
        if self.tail is not None:
            gid, k, v = torch.cat([self.tail_gid, gid]), torch.cat([self.tail[0], k], 1), torch.cat([self.tail[1], v], 1)
        self.tail_gid, self.tail = gid[-r:].clone(), (k[:, -r:].clone(), v[:, -r:].clone())

    def _write_pending(self, gids: torch.Tensor) -> None:
        """Encode the rows of these pending gids (sorted, in the window's copy) into their own slots."""
        rows, _ = self.rows_of_gids(gids)
        if not len(rows):
            return
        assert self.tail is not None and int(rows.min()) >= self.base, "a pending row is in shared storage"
        src = torch.searchsorted(self.tail_gid, self.field("gid")[rows]).to(self.tail[0].device)
        raw_k, raw_v = self._encode(self.tail[0].index_select(1, src), self.tail[1].index_select(1, src), self._prov(rows))
        own_k, own_v = self.storage()
        at = (rows - self.base).to(own_k.device)
        own_k.index_copy_(1, at, raw_k)
        own_v.index_copy_(1, at, raw_v)

    # ------------------------------------------------------------------ encoding
    def _prov(self, rows: torch.Tensor | slice | None) -> dict[str, torch.Tensor]:
        names = ("frame", "chunk", "pos", "gid")
        return {n: self.field(n) if rows is None else self.field(n)[rows] for n in names}

    def _encode(self, k: torch.Tensor, v: torch.Tensor,
                prov: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode rows ``k, v [B, m, Hg, D]`` of provenance ``prov`` (fields ``[m]``); a table key the bank
        has no entry for gets one fitted on these rows."""
        raw_k, table_k = self._encode_side(0, k, prov, self.tables[0])
        raw_v, table_v = self._encode_side(1, v, prov, self.tables[1])
        self.tables = (table_k, table_v)
        return raw_k, raw_v

    def _encode_side(self, side: int, x: torch.Tensor, prov: dict[str, torch.Tensor],
                     table: Table) -> tuple[torch.Tensor, Table]:
        """Encoded rows ``uint8 [B, m, Hg, W]`` of one side (0: keys, 1: values) of ``x [B, m, Hg, D]`` on
        ``table``, and the table with an entry fitted on these rows for every key it lacked."""
        codec = self.codecs[side]
        keys = codec.key(prov)
        if keys is None:
            return codec.encode(x, None), table
        new = ~torch.isin(keys, table.keys)
        if bool(new.any()):
            unique, inverse = keys[new].unique(return_inverse=True)
            table = table.merged(unique, codec.fit(x[:, new.nonzero().squeeze(1).to(x.device)], inverse, len(unique)))
        return codec.encode(x, codec.params(table, keys)), table

    def _decode(self, raw_k: torch.Tensor, raw_v: torch.Tensor,
                rows: torch.Tensor | slice | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoded ``[B, m, Hg, D]`` K and V of encoded history rows (``rows``: ``long [m]``, a slice of
        them, or ``None`` for all), the recent window's rows taken from its full-precision copy."""
        prov = self._prov(rows)
        assert self.dtype is not None
        out = []
        for codec, table, raw in zip(self.codecs, self.tables, (raw_k, raw_v)):
            keys = codec.key(prov)
            out.append(codec.decode(raw, None if keys is None else codec.params(table, keys), self.dtype))
        if self.tail is not None and len(self.tail_gid):
            inside = torch.isin(prov["gid"], self.tail_gid)
            if bool(inside.any()):
                at = inside.nonzero().squeeze(1).to(raw_k.device)
                src = torch.searchsorted(self.tail_gid, prov["gid"][inside]).to(raw_k.device)
                for x, t in zip(out, self.tail):
                    x.index_copy_(1, at, t.index_select(1, src))
        return out[0], out[1]

    # ------------------------------------------------------------------ reading
    def rows(self, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoded K and V of rows ``[0, stop)``, each ``[B, stop, Hg, D]``: the history, then the slot."""
        hist = min(stop, self.n)
        if self.k is None:
            k, v = self.slot(stop)
            return k, v
        k, v = self._decode(*self._raw_span(0, hist), None if hist == self.n else slice(0, hist))
        if stop > hist:
            sk, sv = self.slot(stop - hist)
            k, v = torch.cat([k, sk], 1), torch.cat([v, sv], 1)
        return k, v

    def gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoded K and V of these history rows (``long [m]``, increasing), each ``[B, m, Hg, D]``."""
        return self._decode(*self._raw_gather(rows), rows)

    def blocks(self, length: int, rows: torch.Tensor | None = None,
               block: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Decoded K and V an attention call reads, ``block`` history rows at a time, then the slot.

        Parameters
        ----------
        length : int
            Rows of the slot read last (the open chunk's tokens).
        rows : Tensor, shape ``[m]``, long, optional
            The history rows read (increasing); ``None``: all ``n``.
        block : int, optional
            History rows decoded at once (default :data:`DECODE_ROWS`).

        Yields
        ------
        k, v : Tensor, shape ``[B, <= block, Hg, D]``
            One block of decoded history (decoded when it is reached, so a caller that lets it go before
            the next holds one block at a time), and last the slot's ``[B, length, Hg, D]``.
        """
        block = DECODE_ROWS if block is None else block
        if self.k is not None:
            if rows is None:
                for start in range(0, self.n, block):
                    stop = min(start + block, self.n)
                    yield self._decode(*self._raw_span(start, stop), slice(start, stop))
            else:
                for start in range(0, len(rows), block):
                    part = rows[start : start + block]
                    yield self._decode(*self._raw_gather(part), part)
        yield self.slot(length)

    # ------------------------------------------------------------------ history
    def keep_only(self, keep: torch.Tensor, slot: int = 0) -> None:
        """As :meth:`Bank.keep_only` (the slot is held apart: nothing to move), then the table entries and
        recent-window rows of dropped tokens go."""
        super().keep_only(keep, 0)
        prov = self._prov(None)
        tables = []
        for codec, table in zip(self.codecs, self.tables):
            keys = codec.key(prov)
            tables.append(table if keys is None else table.only(keys.unique()))
        self.tables = (tables[0], tables[1])
        self.pending = self.pending[torch.isin(self.pending, prov["gid"])]
        if self.tail is not None:
            kept = torch.isin(self.tail_gid, prov["gid"])
            if not bool(kept.all()):
                idx = kept.nonzero().squeeze(1)
                dev = idx.to(self.tail[0].device)
                self.tail_gid = self.tail_gid[idx]
                self.tail = (self.tail[0].index_select(1, dev), self.tail[1].index_select(1, dev))

    def insert(self, k: torch.Tensor, v: torch.Tensor, prov: dict[str, torch.Tensor]) -> None:
        """Encode full-precision rows ``k, v [B, m, Hg, D]`` and put them back (:meth:`Bank.insert`)."""
        if not len(prov["gid"]):
            return
        if self.head_dim is None:
            self.head_dim, self.dtype = k.shape[-1], k.dtype
        raw_k, raw_v = self._encode(k, v, prov)
        super().insert(raw_k, raw_v, prov)

    def merge(self, into: torch.Tensor, rows: torch.Tensor, slot: int = 0) -> None:
        """Refused: merging averages values in full precision."""
        raise ValueError(f"bank of layer {self.layer}: rows cannot be merged in storage={self.format.name} "
                         "(merging needs full-precision values: storage=fp)")

    def rekey(self, transform: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        """Replace every history key ``k`` by ``transform(k, rows)`` (``k [B, m, Hg, D]`` of history rows
        ``rows [m]``, row-wise), encoding them again on freshly fitted key entries (the re-index).

        The keys are decoded, transformed and encoded :data:`DECODE_ROWS` rows at a time (more where a table
        entry's rows would be cut: every entry is fitted on all its rows, as in one block), so the workspace
        is a span of rows, not the history. The recent window's keys are transformed from their
        full-precision copy.
        """
        if not self.n:
            return
        self.unshare()
        own_k = self.storage()[0]
        entry_keys, entry_data = [], []  # each span's fitted entries (no entry is in two spans)
        for start, stop in self._entry_spans(DECODE_ROWS):
            rows = torch.arange(start, stop)
            keys = transform(self._decode(*self._raw_span(start, stop), slice(start, stop))[0], rows)
            own_k[:, start:stop], part = self._encode_side(0, keys, self._prov(rows), Table.empty())
            if part.data is not None:
                entry_keys.append(part.keys)
                entry_data.append(part.data)
        if entry_data:
            self.tables = (Table.empty().merged(torch.cat(entry_keys), torch.cat(entry_data, 1)), self.tables[1])
        if self.tail is not None and len(self.tail_gid):
            rows, at = self.rows_of_gids(self.tail_gid)
            at = at.to(self.tail[0].device)
            keys = self.tail[0].clone()
            keys.index_copy_(1, at, transform(keys.index_select(1, at), rows))
            self.tail = (keys, self.tail[1])

    def _entry_spans(self, block: int) -> Iterator[tuple[int, int]]:
        """History rows ``[start, stop)`` in spans of ``block`` rows or more, cut only between key table
        entries (rows are in global-id order and an entry's key grows with it, so its rows are adjacent)."""
        keys = self.codecs[0].key(self._prov(None))
        if keys is None:
            yield from ((start, min(start + block, self.n)) for start in range(0, self.n, block))
            return
        begin = 0
        for cut in [*(keys[1:] != keys[:-1]).nonzero().squeeze(1).add(1).tolist(), self.n]:
            if cut - begin >= block or cut == self.n:
                yield begin, cut
                begin = cut

    # ------------------------------------------------------------------ copies
    def share(self, headroom: int = 0) -> "QuantizedBank":
        """As :meth:`Bank.share`, after encoding the pending window rows (a fork reads them in place and
        encodes nothing there when they leave its window)."""
        if self.shared is None and self.k is not None and self.n:
            self._write_pending(self.pending)
            self.pending = self.pending[:0]
        out = super().share(headroom)
        assert isinstance(out, QuantizedBank)
        out._adopt(self)
        return out

    def select_heads(self, group: HeadGroup) -> "QuantizedBank":
        out = super().select_heads(group)
        assert isinstance(out, QuantizedBank)
        out._adopt(self, heads=torch.tensor([self.group.heads.index(h) for h in group.heads]))
        return out

    def clone(self, headroom: int = 0, device: str | torch.device | None = None) -> "QuantizedBank":
        out = super().clone(headroom, device)
        assert isinstance(out, QuantizedBank)
        out._adopt(self, device=device)
        return out

    def move(self, device: str | torch.device) -> None:
        super().move(device)
        self._adopt(self, device=device)

    # ------------------------------------------------------------------ accounting
    def stored_bytes(self) -> int:
        """Bytes of the history: encoded rows (codes and in-row zero points and scales; a pending window
        row's unwritten slot not counted), the table entries they use and the full-precision recent window."""
        if self.k is None or self.v is None:
            return 0
        rows = self.n - len(self.pending)
        return rows * self.k.shape[0] * self.num_heads * (self.k.shape[-1] + self.v.shape[-1]) + self._side_bytes()

    def shared_bytes(self) -> int:
        """Bytes of the encoded rows read in place from the bank this one was forked from."""
        return 0 if self.shared is None else sum(t.numel() * t.element_size() for t in self.shared)

    def allocated_bytes(self) -> int:
        """Bytes this bank allocated: encoded rows (capacity), provenance, tables, recent window and, while a
        chunk is open, its full-precision slot."""
        if self.k is None or self.v is None:
            return 0
        own = (self.k.numel() + self.v.numel()) * self.k.element_size()
        slot = 0 if self._slot is None else self._slot.numel() * self._slot.element_size()
        return own + self._provenance_bytes() + slot + self._side_bytes()

    def _side_bytes(self) -> int:
        """Bytes of the tables, the full-precision recent window and what the codecs hold (lowrank's bases)."""
        tail = 0 if self.tail is None else sum(t.numel() * t.element_size() for t in self.tail)
        held = sum(t.numel() * t.element_size() for codec in self.codecs for t in codec.held())
        return sum(t.nbytes() for t in self.tables) + tail + held


def make_bank(layer: int, group: HeadGroup, capacity_limit: int | None = None,
              storage: StorageFormat | None = None) -> Bank:
    """A bank storing its history in ``storage`` (``None`` or ``fp``: a plain :class:`Bank`)."""
    if storage is None or not storage.quantized:
        return Bank(layer, group, capacity_limit)
    return QuantizedBank(layer, group, capacity_limit, storage)
