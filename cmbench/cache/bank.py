"""One physical KV bank: keys, values and per-token provenance of one head group of one layer.

Storage is preallocated and grows geometrically. The first ``n`` rows are the history (committed
tokens, in strictly increasing global token id); the rows ``[n, n + L)`` are the *slot* of the chunk
being denoised, which every ``attend`` call overwrites and :meth:`Bank.commit` turns into history.

A task's bank may *share* a prefix of its rows with the prefilled bank it was forked from
(:meth:`Bank.share`): rows ``[0, base)`` are read in place from the prefilled bank's storage and never
written; the bank's own storage holds rows ``[base, capacity)``. A compaction that drops a shared row
first copies the shared rows from the start of that row's chunk into the bank's own storage (copy on
write, chunk by chunk), so the prefilled bank is never modified and a task allocates only the chunks it
changes plus its own continuation.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from cmbench.cache.layout import HeadGroup

GROWTH = 1.5
MIN_CAPACITY = 64


def grown_capacity(capacity: int, rows: int, limit: int | None = None) -> int:
    """Rows a bank of ``capacity`` rows allocates to hold ``rows`` (history + slot): its growth policy.

    Geometric growth by :data:`GROWTH` (at least :data:`MIN_CAPACITY`), never beyond ``limit`` unless
    ``rows`` themselves need it; ``capacity`` itself when it already holds them. The memory planner
    replays this function, so what it predicts is what a bank allocates.
    """
    if capacity and rows <= capacity:
        return capacity
    cap = max(rows, math.ceil(capacity * GROWTH), MIN_CAPACITY)
    if limit is not None:
        cap = max(rows, min(cap, limit))
    return cap


def shrunk_capacity(capacity: int, rows: int) -> int:
    """Capacity after a compaction leaves ``rows`` history rows: shrinks below a quarter's use."""
    if capacity > MIN_CAPACITY and 4 * rows < capacity:
        return max(2 * rows, MIN_CAPACITY)
    return capacity


class Bank:
    """K/V ``[B, capacity, Hg, D]`` plus provenance ``[capacity]`` for one head group.

    Provenance of history token ``i`` (``i < n``):

    - ``frame[i]``: source latent frame; ``chunk[i]``: chunk index; ``pos[i]``: position in its frame;
    - ``gid[i] = frame * tokens_per_frame + pos``: global token id, strictly increasing in ``i``;
    - ``tpos[i]``: temporal RoPE position the stored key currently carries (``frame`` until re-indexed);
    - ``keep[i]``: the method's decision for when the token's chunk leaves the dense window;
    - ``priority[i]``: the method's keep priority (higher is kept longer; ``-inf`` if unscored);
    - ``count[i]``: how many tokens the row stands for since merges (:meth:`merge`): attention adds
      ``log(count)`` to its logit. Stored only once the bank has merged rows (``count is None``: every
      row stands for itself, and attention takes no bias).

    Parameters
    ----------
    layer : int
        Layer of the bank.
    group : HeadGroup
        Heads, role and configured size.
    capacity_limit : int or None
        Never allocate more rows than this (bounded-memory runs); ``None`` for unbounded growth.
    """

    def __init__(self, layer: int, group: HeadGroup, capacity_limit: int | None = None) -> None:
        self.layer = layer
        self.group = group
        self.heads = torch.tensor(group.heads, dtype=torch.long)
        self.capacity_limit = capacity_limit
        self.n = 0
        self.k: torch.Tensor | None = None  # own rows [base, capacity), ``[B, capacity - base, Hg, D]``
        self.v: torch.Tensor | None = None
        self.base = 0  # rows [0, base) are read from ``shared``, another bank's storage (never written)
        self.shared: tuple[torch.Tensor, torch.Tensor] | None = None
        self.count: torch.Tensor | None = None  # float32 [capacity] once a row was merged
        self._alloc_prov(0)

    # ------------------------------------------------------------------ storage
    @property
    def role(self) -> str:
        return self.group.role

    @property
    def num_heads(self) -> int:
        return len(self.group.heads)

    @property
    def capacity(self) -> int:
        """Rows the bank can hold (shared and own) before it grows."""
        return 0 if self.k is None else self.base + self.k.shape[1]

    def storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The bank's own K and V storage, each ``[B, capacity - base, Hg, D]`` (allocated by the first
        chunk; row ``i`` is the bank's row ``base + i``)."""
        if self.k is None or self.v is None:
            raise RuntimeError(f"bank of layer {self.layer} has no K/V storage yet (no chunk was written)")
        return self.k, self.v

    def rows(self, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of rows ``[0, stop)``, each ``[B, stop, Hg, D]`` (``stop >= base``): views of the own
        storage, or with shared rows a new tensor (shared rows, then own rows)."""
        return self._raw_span(0, stop)

    def _raw_span(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[start, stop)`` as stored (a quantized bank's encoded rows; :meth:`rows` decodes them):
        views when they lie in one storage, the shared rows then the own ones otherwise."""
        k, v = self.storage()
        own_start, own_stop = max(start - self.base, 0), max(stop - self.base, 0)
        if self.shared is None or start >= self.base:
            return k[:, own_start:own_stop], v[:, own_start:own_stop]
        shared_k, shared_v = self.shared
        low_k, low_v = shared_k[:, start : min(stop, self.base)], shared_v[:, start : min(stop, self.base)]
        if stop <= self.base:
            return low_k, low_v
        return torch.cat([low_k, k[:, :own_stop]], dim=1), torch.cat([low_v, v[:, :own_stop]], dim=1)

    def gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of these rows (``long [m]``, increasing, each ``< capacity``), each ``[B, m, Hg, D]``."""
        return self._raw_gather(rows)

    def _raw_gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """These rows as stored (a quantized bank's encoded rows; :meth:`gather` decodes them)."""
        k, v = self.storage()
        if self.shared is None:
            idx = rows.to(k.device)
            return k.index_select(1, idx), v.index_select(1, idx)
        shared_k, shared_v = self.shared
        inside = rows < self.base
        low, high = rows[inside].to(k.device), (rows[~inside] - self.base).to(k.device)
        return (torch.cat([shared_k.index_select(1, low), k.index_select(1, high)], dim=1),
                torch.cat([shared_v.index_select(1, low), v.index_select(1, high)], dim=1))

    def blocks(self, length: int, rows: torch.Tensor | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """K and V an attention call reads, in blocks of rows: here one, ``[B, m + length, Hg, D]``.

        Parameters
        ----------
        length : int
            Rows of the slot read after the history (the open chunk's tokens).
        rows : Tensor, shape ``[m]``, long, optional
            The history rows read (increasing); ``None``: all ``n`` (then the block is a view of the storage).
        """
        if rows is None:
            yield self.rows(self.n + length)
            return
        kept_k, kept_v = self.gather(rows)
        slot_k, slot_v = self.slot(length)
        yield torch.cat([kept_k, slot_k], dim=1), torch.cat([kept_v, slot_v], dim=1)

    def _alloc_prov(self, cap: int, counted: bool = False) -> None:
        self.frame = torch.zeros(cap, dtype=torch.long)
        self.chunk = torch.zeros(cap, dtype=torch.long)
        self.pos = torch.zeros(cap, dtype=torch.long)
        self.gid = torch.zeros(cap, dtype=torch.long)
        self.tpos = torch.zeros(cap, dtype=torch.float64)
        self.keep = torch.ones(cap, dtype=torch.bool)
        self.priority = torch.full((cap,), -math.inf, dtype=torch.float32)
        self.count = torch.ones(cap, dtype=torch.float32) if counted else None

    PROVENANCE = ("frame", "chunk", "pos", "gid", "tpos", "keep", "priority")
    ROW_FIELDS = PROVENANCE + ("count",)
    """What a row carries out of the bank and back (:meth:`extract`, :meth:`insert`, the host store)."""

    def _fields(self) -> tuple[str, ...]:
        """The per-row fields this bank stores now (``count`` only once a row was merged)."""
        return self.PROVENANCE if self.count is None else self.ROW_FIELDS

    def _start_counting(self) -> None:
        """Store merge counts from now on: every allocated row stands for one token."""
        self.count = torch.ones(len(self.frame), dtype=torch.float32)

    def counts(self) -> torch.Tensor:
        """Tokens each history row stands for, ``float32 [n]`` (ones before any merge)."""
        return torch.ones(self.n) if self.count is None else self.count[: self.n]

    def logit_bias(self) -> torch.Tensor | None:
        """``log(count)`` of every history row, ``float32 [n]``; ``None`` when no row was merged."""
        return None if self.count is None else self.count[: self.n].log()

    @classmethod
    def provenance_row_bytes(cls) -> int:
        """Bytes of provenance per allocated row (kept on the CPU whatever the device of K and V)."""
        probe = cls.__new__(cls)
        probe._alloc_prov(1)
        return sum(getattr(probe, name).element_size() for name in cls.PROVENANCE)

    def reserve(self, rows: int, like: torch.Tensor) -> None:
        """Make room for ``rows`` rows (history + slot); ``like`` gives batch, dim, dtype and device."""
        if self.k is not None and rows <= self.capacity:
            return
        self._resize(grown_capacity(self.capacity, rows, self.capacity_limit), like)

    def _resize(self, cap: int, like: torch.Tensor) -> None:
        """Reallocate the own storage for ``cap`` rows in all (``cap >= base``), keeping the history."""
        k, v = self._allocate(cap - self.base, like)
        keep_rows = min(self.n, cap) - self.base  # own history rows (the slot is always written after a resize)
        if self.k is not None and keep_rows > 0:
            old_k, old_v = self.storage()
            k[:, :keep_rows] = old_k[:, :keep_rows]
            v[:, :keep_rows] = old_v[:, :keep_rows]
        old = {name: getattr(self, name) for name in self._fields()}
        self._alloc_prov(cap, self.count is not None)
        for name, tensor in old.items():
            getattr(self, name)[: min(len(tensor), cap)] = tensor[:cap]
        self.k, self.v = k, v

    def _allocate(self, rows: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Uninitialised own K and V storage of ``rows`` rows, each ``[B, rows, Hg, D]`` like ``like``."""
        b, d = like.shape[0], like.shape[-1]
        return like.new_empty((b, rows, self.num_heads, d)), like.new_empty((b, rows, self.num_heads, d))

    def model_element_bytes(self) -> int | None:
        """Bytes of one K/V element in the model's precision (the chunk's), ``None`` before any write."""
        return None if self.k is None else self.k.element_size()

    def _empty(self, group: HeadGroup | None = None) -> "Bank":
        """A bank of the same layer, capacity limit and storage format (and ``group``, default this bank's)
        holding nothing."""
        return Bank(self.layer, self.group if group is None else group, self.capacity_limit)

    # ------------------------------------------------------------------ the chunk slot
    def write_slot(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Overwrite the slot with this group's slice of the chunk, ``k, v [B, L, Hg, D]``."""
        L = k.shape[1]
        self.reserve(self.n + L, k)
        stored_k, stored_v = self.storage()
        if k.shape[0] != stored_k.shape[0] or k.shape[-1] != stored_k.shape[-1]:
            raise ValueError(
                f"bank of layer {self.layer} stores batch {stored_k.shape[0]} and head_dim {stored_k.shape[-1]}, "
                f"got k of shape {tuple(k.shape)}"
            )
        own = self.n - self.base
        stored_k[:, own : own + L] = k
        stored_v[:, own : own + L] = v

    def slot(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the slot, each ``[B, length, Hg, D]``."""
        k, v = self.storage()
        own = self.n - self.base
        return k[:, own : own + length], v[:, own : own + length]

    def commit(self, frame: torch.Tensor, chunk: int, pos: torch.Tensor, gid: torch.Tensor) -> None:
        """Make the slot history, with provenance ``frame, pos, gid [L]``."""
        L = len(gid)
        s = slice(self.n, self.n + L)
        self.frame[s], self.chunk[s], self.pos[s], self.gid[s] = frame, chunk, pos, gid
        self.tpos[s] = frame.to(torch.float64)
        self.keep[s] = True
        self.priority[s] = -math.inf
        if self.count is not None:
            self.count[s] = 1.0
        self.n += L

    # ------------------------------------------------------------------ history
    def history(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored history K and V, each ``[B, n, Hg, D]`` (views unless rows are shared)."""
        return self.rows(self.n)

    def field(self, name: str) -> torch.Tensor:
        """View of one provenance field over the history, shape ``[n]``."""
        return getattr(self, name)[: self.n]

    def rows_of_gids(self, gids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """History rows holding any of ``gids`` (sorted, long): ``(rows [m], index into gids [m])``."""
        stored = self.field("gid")
        if not len(gids) or not self.n:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, empty
        where = torch.searchsorted(gids, stored).clamp_max(len(gids) - 1)
        rows = (gids[where] == stored).nonzero().squeeze(1)
        return rows, where[rows]

    def keep_only(self, keep: torch.Tensor, slot: int = 0) -> None:
        """Physically gather the history rows where ``keep [n]`` is true (order preserved).

        Rows before the first dropped one stay where they are; only the kept rows after it are
        gathered (one ``index_select`` per tensor). The ``slot`` rows after the history (an open
        chunk's K/V) move along with it. Shrinks storage when it falls under a quarter of its
        capacity (never with an open slot).
        """
        if keep.shape != (self.n,):
            raise ValueError(f"keep mask must have shape ({self.n},), got {tuple(keep.shape)}")
        dropped = (~keep).nonzero()
        if not len(dropped):
            return
        first = int(dropped[0, 0])
        if first < self.base:
            self._own_from(first, slot)
        idx = keep[first:].nonzero().squeeze(1) + first
        if slot:
            idx = torch.cat([idx, torch.arange(self.n, self.n + slot)])
        m = first + len(idx)
        if len(idx):
            k, v = self.storage()
            o = self.base
            dev_idx = (idx - o).to(k.device)
            k[:, first - o : m - o] = k[:, : self.n + slot - o].index_select(1, dev_idx)
            v[:, first - o : m - o] = v[:, : self.n + slot - o].index_select(1, dev_idx)
            for name in self._fields():
                t = getattr(self, name)
                t[first:m] = t[: self.n + slot][idx]
        self.n = m - slot
        if not slot and self.k is not None and shrunk_capacity(self.capacity, m) != self.capacity:
            self._resize(shrunk_capacity(self.capacity, m), self.k[:, :0])

    def merge(self, into: torch.Tensor, rows: torch.Tensor, slot: int = 0) -> None:
        """Fold history rows into earlier ones: row ``into[i]`` absorbs row ``rows[i]``, which is dropped.

        The absorbing row keeps its key and provenance; its value becomes the count-weighted mean of its
        own and the absorbed rows' values, and its count their sum, so that with ``log(count)`` added to
        its logit it carries the softmax mass of every token it stands for (exactly, for identical keys).
        The absorbed rows then leave the history as in :meth:`keep_only` (``slot``: rows of an open
        chunk after the history, moved along).

        Parameters
        ----------
        into, rows : Tensor, shape ``[m]``, long
            History rows; each ``into[i] < rows[i]``, no row absorbed twice, and no absorbed row absorbs
            another (``into`` and ``rows`` disjoint). Several rows may fold into one.
        slot : int
            Rows of an open chunk's slot after the history.
        """
        if not len(rows):
            return
        if into.shape != rows.shape or not bool((into < rows).all()) or bool((rows >= self.n).any()):
            raise ValueError(f"bank of layer {self.layer}: merge pairs must fold later history rows into earlier ones")
        if len(rows.unique()) != len(rows) or bool(torch.isin(into, rows).any()):
            raise ValueError(f"bank of layer {self.layer}: a merged row is absorbed twice or absorbs another")
        if self.count is None:
            self._start_counting()
        assert self.count is not None
        targets = into.unique()  # sorted
        self._own_from(int(targets[0]), slot)  # a shared row is copied before its value is written
        total = self.count.index_add(0, into, self.count[rows])  # [capacity]: each target's count after
        _, values = self.gather(torch.cat([targets, rows]))  # [B, t + m, Hg, D]
        dev = values.device
        acc = values[:, : len(targets)].float() * self.count[targets].to(dev)[None, :, None, None]
        at = torch.searchsorted(targets, into).to(dev)  # each absorbing row's place in ``targets``
        acc.index_add_(1, at, values[:, len(targets) :].float() * self.count[rows].to(dev)[None, :, None, None])
        _, v = self.storage()
        v[:, (targets - self.base).to(dev)] = (acc / total[targets].to(dev)[None, :, None, None]).to(v.dtype)
        self.count[targets] = total[targets]
        keep = torch.ones(self.n, dtype=torch.bool)
        keep[rows] = False
        self.keep_only(keep, slot)

    def extract(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Copies of these history rows (``long [m]``, increasing): K and V ``[B, m, Hg, D]`` and every
        field of :attr:`ROW_FIELDS` ``[m]`` (``count`` ones when no row was merged; the bank is unchanged)."""
        k, v = self.gather(rows)
        prov = {name: getattr(self, name)[rows].clone() for name in self.PROVENANCE}
        return k, v, dict(prov, count=self.counts()[rows].clone())

    def insert(self, k: torch.Tensor, v: torch.Tensor, prov: dict[str, torch.Tensor]) -> None:
        """Put rows back into the history at their places in global-id order.

        Parameters
        ----------
        k, v : Tensor, shape ``[B, m, Hg, D]``
            Keys (already at temporal position ``prov["tpos"]``) and values, on the bank's device.
        prov : dict of str to Tensor
            Every field of :attr:`PROVENANCE`, each ``[m]``; ``gid`` increasing, none already stored;
            ``count`` optional (default ones: rows that were never merged).

        No chunk slot may be written (rows after the history are not kept). Rows before the first
        insertion point stay where they are (shared ones too); the rows after it are rewritten.
        """
        gid = prov["gid"]
        m = len(gid)
        if not m:
            return
        stored = self.field("gid")
        if bool(torch.isin(gid, stored).any()):
            raise ValueError(f"bank of layer {self.layer}: inserted tokens are already in the history")
        first = int(torch.searchsorted(stored, gid[:1])[0])
        if first < self.base:
            self._own_from(first)
        self.reserve(self.n + m, k)
        count = prov.get("count")
        if count is not None and self.count is None and bool((count != 1).any()):
            self._start_counting()
        prov = dict(prov, count=torch.ones(m) if count is None else count)
        own_k, own_v = self.storage()
        o = self.base
        old_k, old_v = own_k[:, first - o : self.n - o], own_v[:, first - o : self.n - o]
        order = torch.cat([stored[first:], gid]).argsort()
        dev = order.to(own_k.device)
        stop = self.n + m - o
        own_k[:, first - o : stop] = torch.cat([old_k, k.to(own_k)], dim=1).index_select(1, dev)
        own_v[:, first - o : stop] = torch.cat([old_v, v.to(own_v)], dim=1).index_select(1, dev)
        for name in self._fields():
            t = getattr(self, name)
            t[first : self.n + m] = torch.cat([t[first : self.n], prov[name].to(t.dtype)])[order]
        self.n += m

    def _own_from(self, row: int, slot: int = 0) -> None:
        """Copy the shared rows from the start of ``row``'s chunk into the own storage (same capacity),
        with the own history and ``slot`` rows after it; the rows before stay shared."""
        if self.shared is None or row >= self.base:
            return
        start = int(torch.searchsorted(self.field("chunk"), self.chunk[row : row + 1])[0]) if row else 0
        shared_k, shared_v = self.shared
        k, v = self.storage()
        own = self.n + slot - self.base
        rows = self.capacity - start
        new_k, new_v = k.new_empty((k.shape[0], rows, *k.shape[2:])), v.new_empty((v.shape[0], rows, *v.shape[2:]))
        moved = self.base - start
        new_k[:, :moved], new_v[:, :moved] = shared_k[:, start:], shared_v[:, start:]
        new_k[:, moved : moved + own], new_v[:, moved : moved + own] = k[:, :own], v[:, :own]
        self.k, self.v, self.base = new_k, new_v, start
        self.shared = (shared_k[:, :start], shared_v[:, :start]) if start else None

    def unshare(self) -> None:
        """Copy every shared row into the own storage (the bank then owns all its rows)."""
        self._own_from(0)

    def share(self, headroom: int = 0) -> "Bank":
        """A bank that reads this bank's history in place (never writing it), with own storage for
        ``headroom`` more rows; a bank that itself shares rows, or has no history to share, is copied
        instead (:meth:`clone`), so a bank shares rows only when ``base > 0``."""
        if self.shared is not None or self.k is None or not self.n:
            return self.clone(headroom)
        out = self._empty()
        k, v = self._raw_span(0, self.n)
        out.shared, out.base, out.n = (k, v), self.n, self.n
        out.k, out.v = k.new_empty((k.shape[0], headroom, *k.shape[2:])), v.new_empty((v.shape[0], headroom, *v.shape[2:]))
        out._alloc_prov(self.n + headroom, self.count is not None)
        for name in self._fields():
            getattr(out, name)[: self.n] = self.field(name)
        return out

    def select_heads(self, group: HeadGroup) -> "Bank":
        """A new bank holding this bank's history for a subset of its heads."""
        local = [self.group.heads.index(h) for h in group.heads]
        out = self._empty(group)
        if self.k is not None:
            k, v = self._raw_span(0, self.n)
            idx = torch.tensor(local, dtype=torch.long, device=k.device)
            out.k = k.index_select(2, idx)
            out.v = v.index_select(2, idx)
            out._alloc_prov(self.n, self.count is not None)
            for name in self._fields():
                getattr(out, name)[:] = self.field(name)
            out.n = self.n
        return out

    def headroom_for(self, tokens: int, chunk: int) -> int:
        """Free rows worth allocating for ``tokens`` more tokens arriving in chunks of ``chunk``.

        A bank of configured size ``max_tokens`` never holds more than ``max_tokens + chunk`` rows; a
        capacity limit caps the rows outright.
        """
        rows = self.n + tokens
        if self.group.max_tokens is not None:
            rows = min(rows, max(self.n, self.group.max_tokens) + chunk)
        if self.capacity_limit is not None:
            rows = min(rows, max(self.n, self.capacity_limit))
        return rows - self.n

    def clone(self, headroom: int = 0, device: str | torch.device | None = None) -> "Bank":
        """An independent copy of the history with ``headroom`` free rows (on ``device``, default this
        bank's)."""
        out = self._empty()
        if self.k is not None:
            k, v = self._raw_span(0, self.n)
            out._resize(self.n + headroom, k[:, :0].to(device) if device is not None else k[:, :0])
            out_k, out_v = out.storage()
            out_k[:, : self.n] = k
            out_v[:, : self.n] = v
            if self.count is not None:
                out._start_counting()
            for name in self._fields():
                getattr(out, name)[: self.n] = self.field(name)
            out.n = self.n
        return out

    def move(self, device: str | torch.device) -> None:
        """Reallocate the history, exactly ``n`` rows, on ``device`` (the slot's rows are dropped; shared
        rows are copied: the bank then owns them)."""
        if self.k is None:
            return
        self.unshare()
        self._resize(self.n, self.k[:, :0].to(device))

    def stored_bytes(self) -> int:
        """Bytes of the history K and V, and of its merge counts once a row was merged."""
        if self.k is None:
            return 0
        counts = 0 if self.count is None else self.n * self.count.element_size()
        return 2 * self.n * self.num_heads * self.k.shape[-1] * self.k.shape[0] * self.k.element_size() + counts

    def shared_bytes(self) -> int:
        """Bytes of the K and V rows read in place from the bank this one was forked from."""
        if self.shared is None:
            return 0
        return 2 * self.shared[0].numel() * self.shared[0].element_size()

    def allocated_bytes(self) -> int:
        """Bytes this bank allocated for K, V and provenance (capacity, not just history; shared rows
        are the prefilled bank's, not counted)."""
        if self.k is None:
            return 0
        return 2 * self.k.numel() * self.k.element_size() + self._provenance_bytes()

    def _provenance_bytes(self) -> int:
        """Bytes of the per-row fields over every allocated row."""
        return sum(getattr(self, n).numel() * getattr(self, n).element_size() for n in self._fields())
