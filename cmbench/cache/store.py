"""The host store: history tokens moved off the device banks, kept to be brought back later.

A compaction may *move* rows into the store instead of deleting them (:meth:`KVCache.compact` with
``to_store=True``); a method may *restore* stored tokens into the device banks before a chunk's
denoising calls (:meth:`KVCache.restore`). The store keeps, per bank (keyed by layer and head group) and
per source chunk, one :class:`Segment`: the rows' keys, values and provenance, in increasing global id.

A restore copies rows to the device and the store keeps them (as WorldKV's host bank keeps every
chunk it hands to the GPU): sending a restored token out again moves nothing, only rows the store does
not hold yet are transferred.

Segments are never modified in place: adding or taking rows builds new tensors, so a fork of a cache
(:meth:`HostStore.fork`) shares the segments it was forked with and the prefilled cache's store is never
changed by a task.

Accounting: ``stored_bytes`` (K and V in the store now), ``peak_bytes``, and the bytes moved each way
(``bytes_out``: device -> host, ``bytes_in``: host -> device). A store kept on the device with the banks
(``on_device``, as WorldKV's own script runs its bank: ``--kv_bank_on_gpu``) moves nothing between host and
device: its rows stay where the banks are, its bytes are device memory beside the banks' (the families
board's total memory) and ``bytes_out`` and ``bytes_in`` stay 0. A store bounded by ``max_bytes`` drops its
oldest chunks (every bank's segment of the lowest chunk index) when a move would exceed it; the dropped
tokens are gone (``dropped_tokens`` counts them, per head). Under a split (:mod:`cmbench.parallel`) a
rank's store is one of ``shares`` equal parts of the model's (the same tokens, of its heads), and the
bound applies to the model's store: ``shares * stored_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cmbench.cache.layout import HeadGroup

StoreKey = tuple[int, HeadGroup]
"""``(layer, head group)``: the bank a segment came from."""

FIELDS = ("frame", "chunk", "pos", "gid", "tpos", "keep", "priority", "count")
"""Per-row fields a segment carries (the bank's, :attr:`Bank.ROW_FIELDS`: provenance and merge count)."""


@dataclass(frozen=True)
class Segment:
    """Rows of one bank from one source chunk, in increasing global id.

    Attributes
    ----------
    k, v : Tensor, shape ``[B, m, Hg, D]``
        Keys (rotated to temporal position ``prov["tpos"]``) and values, on the store's device.
    prov : dict of str to Tensor
        Every field of :data:`FIELDS`, each ``[m]`` (CPU).
    """

    k: torch.Tensor
    v: torch.Tensor
    prov: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return int(self.prov["gid"].numel())

    @property
    def gid(self) -> torch.Tensor:
        return self.prov["gid"]

    def nbytes(self) -> int:
        """Bytes of K and V."""
        return 2 * self.k.numel() * self.k.element_size()

    def select(self, rows: torch.Tensor) -> "Segment":
        """A new segment of these rows (``long [r]``, increasing)."""
        idx = rows.to(self.k.device)
        return Segment(self.k.index_select(1, idx), self.v.index_select(1, idx),
                       {name: t[rows] for name, t in self.prov.items()})

    @staticmethod
    def merge(*parts: "Segment") -> "Segment":
        """The rows of all ``parts`` (disjoint ids), in increasing global id, with one concatenation (no
        reordering when the parts follow each other, as one bank's chunks do)."""
        if len(parts) == 1:
            return parts[0]
        gid = torch.cat([p.gid for p in parts])
        k = torch.cat([p.k for p in parts], dim=1)
        v = torch.cat([p.v for p in parts], dim=1)
        prov = {name: torch.cat([p.prov[name] for p in parts]) for name in FIELDS}
        if bool((gid[1:] > gid[:-1]).all()):
            return Segment(k, v, prov)
        order = gid.argsort()
        dev = order.to(k.device)
        return Segment(k.index_select(1, dev), v.index_select(1, dev), {name: t[order] for name, t in prov.items()})


class HostStore:
    """Evicted history of every bank, per source chunk, off the device.

    Parameters
    ----------
    device : str or torch.device
        Where stored K and V live (host memory, ``"cpu"``, by default).
    max_bytes : int or None
        Most bytes of stored K and V of the model; ``None`` for unbounded.
    on_device : bool
        Keep the stored rows on the device the banks are on (``device`` unused): nothing crosses the host
        link, and the store's bytes are device memory beside the banks' (the device ledger counts the banks; a
        board adds the store: its total memory column).

    Attributes
    ----------
    shares : int
        Equal parts the model's store is split into, this store being one (the ranks of a split; 1 on
        one process): ``max_bytes`` bounds ``shares * stored_bytes``.
    """

    def __init__(self, device: str | torch.device = "cpu", max_bytes: int | None = None, on_device: bool = False) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"store max_bytes must be >= 0, got {max_bytes}")
        self.device = torch.device(device)
        self.max_bytes = max_bytes
        self.on_device = on_device
        self.shares = 1
        self.segments: dict[StoreKey, dict[int, Segment]] = {}
        self.stored_bytes = 0
        self.peak_bytes = 0
        self.bytes_out = 0
        self.bytes_in = 0
        self.dropped_tokens = 0

    def fork(self) -> "HostStore":
        """A store holding the same segments (shared: never modified in place), with its counters at zero
        and its peak at what it holds."""
        out = HostStore(self.device, self.max_bytes, self.on_device)
        out.shares = self.shares
        out.segments = {key: dict(chunks) for key, chunks in self.segments.items()}
        out.stored_bytes = out.peak_bytes = self.stored_bytes
        return out

    # ------------------------------------------------------------------ contents
    def chunks(self, key: StoreKey) -> dict[int, Segment]:
        """Source chunk -> segment of one bank (a copy of the mapping)."""
        return dict(self.segments.get(key, {}))

    def stored_chunks(self) -> list[int]:
        """Chunk indices with rows in any bank, increasing."""
        return sorted({c for chunks in self.segments.values() for c in chunks})

    def gids(self, key: StoreKey, chunks: list[int] | None = None) -> torch.Tensor:
        """Global ids ``long [m]`` stored for one bank (only these source chunks, if given), increasing."""
        held = self.segments.get(key, {})
        wanted = None if chunks is None else set(chunks)
        parts = [held[c].gid for c in sorted(held) if wanted is None or c in wanted]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)

    def tokens(self) -> int:
        """(token, head) entries stored."""
        return sum(len(seg) * len(key[1].heads) for key, chunks in self.segments.items() for seg in chunks.values())

    # ------------------------------------------------------------------ moves
    def put(self, key: StoreKey, segment: Segment) -> None:
        """Add rows evicted from a device bank; the rows the store already holds (restored copies) are
        not moved again. The new rows go to the store's device, counted as ``bytes_out``."""
        held = self.segments.setdefault(key, {})
        for chunk in torch.unique(segment.prov["chunk"]).tolist():
            old = held.get(chunk)
            new = segment.prov["chunk"] == chunk
            if old is not None:
                new &= ~torch.isin(segment.gid, old.gid)
            if not bool(new.any()):
                continue
            part = segment.select(new.nonzero().squeeze(1))
            if not self.on_device:
                part = Segment(part.k.to(self.device), part.v.to(self.device), part.prov)
                self.bytes_out += part.nbytes()
            held[chunk] = part if old is None else Segment.merge(old, part)
            self.stored_bytes += part.nbytes()
        self._bound()
        self.peak_bytes = max(self.peak_bytes, self.stored_bytes)

    def fetch(self, key: StoreKey, gids: torch.Tensor) -> Segment | None:
        """The stored rows of one bank with these global ids (``long``), in increasing id, on the
        store's device (the caller moves them to the device: counted as ``bytes_in``); ``None`` if
        ``gids`` is empty. The store keeps the rows (a whole segment asked for is returned as is:
        segments are never modified in place).

        Raises ``KeyError`` naming the first id that is not stored.
        """
        gids = gids.to(torch.long).cpu().sort().values
        if not len(gids):
            return None
        held = self.segments.get(key, {})
        parts = []
        for chunk in sorted(held):
            seg = held[chunk]
            # the asked ids within this segment's id range (both increasing): a whole segment is taken as is
            lo = int(torch.searchsorted(gids, seg.gid[0]))
            hi = int(torch.searchsorted(gids, seg.gid[-1], right=True))
            if hi == lo:
                continue
            if hi - lo == len(seg) and torch.equal(gids[lo:hi], seg.gid):
                parts.append(seg)
                continue
            inside = torch.isin(seg.gid, gids[lo:hi])
            if bool(inside.any()):
                parts.append(seg.select(inside.nonzero().squeeze(1)))
        found = sum(len(p) for p in parts)
        if found != len(gids):
            missing = gids[~torch.isin(gids, self.gids(key))]
            raise KeyError(f"layer {key[0]} heads {key[1].heads}: token {int(missing[0])} is not in the store")
        out = Segment.merge(*parts)
        if not self.on_device:
            self.bytes_in += out.nbytes()
        return out

    def _bound(self) -> None:
        """Drop the oldest chunks until the model's store (``shares`` of this one) fits ``max_bytes``."""
        if self.max_bytes is None:
            return
        while self.stored_bytes * self.shares > self.max_bytes:
            oldest = min(c for chunks in self.segments.values() for c in chunks)
            for key, chunks in self.segments.items():
                seg = chunks.pop(oldest, None)
                if seg is not None:
                    self.stored_bytes -= seg.nbytes()
                    self.dropped_tokens += len(seg) * len(key[1].heads)
