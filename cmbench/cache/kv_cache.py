"""The KV cache: per layer, one or more physical banks (head groups) with provenance.

Life of a chunk (driven by :mod:`cmbench.generation`)::

    cache.begin_chunk(chunk_index, frame_start, num_frames)   # provenance of the chunk's tokens
    backbone.denoise(...)        # every layer: out = cache.attend(layer, q, k, v); overwrites the slot
    with cache.probe(): ...      # optional extra calls that leave no trace
    backbone.denoise(x0, 0.0 ...)  # the t = 0 pass leaves the clean K/V in the slot
    cache.commit_chunk()         # the slot becomes history
    cache.compact(select)        # a method drops history rows (physically), or moves them to the store
    # next chunk: cache.begin_chunk(...); cache.restore(...) brings stored tokens back before its calls

A compaction may also run while a chunk is open (outside a probe), e.g. right before its ``t = 0``
pass: the chunk's slot moves along with the shortened history.

Attention reads only what is physically stored: a compacted bank is shorter, never masked. A method
may also *merge* rows (:meth:`KVCache.merge`): a row standing for ``count`` tokens gets ``log(count)``
added to its attention logit (an additive mask; a bank with no merged row attends without one). A cache
built with ``compute_attention=False`` stores and compacts exactly the same rows but skips the
attention arithmetic (``attend`` returns zeros): PR and memory accounting at a real model's scale
on a CPU (the numbers count positions, not values).

A cache built with a :class:`HostStore` (``store=``) can move evicted rows off the device instead of
deleting them (``compact(select, to_store=True)``) and bring chosen ones back (:meth:`KVCache.restore`):
a restored token is put back at its place in global-id order, its key rotated to the temporal position
a token kept all along would carry now (its source frame, or its re-indexed position after
:meth:`KVCache.reindex`), so attention cannot tell it from a kept one.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterator, Sequence

import torch

from cmbench.cache import block_attention
from cmbench.cache.attention_stats import AttentionStats, KeyBlock
from cmbench.cache.bank import Bank
from cmbench.cache.layout import HeadGroup, Layout, check_partition, uniform_layout
from cmbench.cache.rope import RopeSpec, reindex_frames, shift_positions
from cmbench.cache.quantized import StorageFormat
from cmbench.cache.quantized_bank import QuantizedBank, make_bank
from cmbench.cache.store import HostStore, Segment

REINDEX_BLOCK_BYTES = 256 * 2**20  # keys re-indexed per step: bounds the transient copies of a large bank


@dataclass(frozen=True)
class ChunkInfo:
    """Where a chunk sits on the timeline.

    ``gid_start`` is the global id of its first token; its tokens are ``gid_start .. gid_start + length - 1``.
    """

    index: int
    frame_start: int
    num_frames: int
    gid_start: int
    length: int

    @property
    def frame_end(self) -> int:
        return self.frame_start + self.num_frames


@dataclass
class _Probe:
    written: list[bool]
    saved_slots: dict[int, tuple[torch.Tensor, torch.Tensor]]
    visible: dict[int, torch.Tensor] | None  # id(bank) -> history rows the probe may see
    history: bool


BankSelector = Callable[[Bank], torch.Tensor]
"""``bank -> bool [bank.n]``: a per-token decision computed from the bank's provenance."""

RestoreSelector = Callable[[Bank], torch.Tensor]
"""``bank -> long [m]``: global ids of the bank's stored tokens to bring back (increasing)."""

MergeSelector = Callable[[Bank], tuple[torch.Tensor, torch.Tensor]]
"""``bank -> (into, rows)``, each ``long [m]``: history row ``into[i]`` absorbs row ``rows[i]``."""


class KVCache:
    """Banks of keys and values per layer, with per-token provenance.

    Parameters
    ----------
    num_layers, num_heads, head_dim : int
        Attention shape of the backbone.
    tokens_per_frame : int
        Tokens of one latent frame (defines global token ids ``frame * tokens_per_frame + pos``).
    rope : RopeSpec
        Rotary layout of the stored keys (used by :meth:`reindex`).
    layout : sequence of sequence of HeadGroup, optional
        Head groups per layer (default: one bank per layer with every head).
    capacity_limit : int or None
        Most rows any bank may allocate (history + one chunk); ``None`` for unbounded.
    compute_attention : bool
        ``False``: ``attend`` writes and returns zeros without computing attention (accounting runs);
        recorded attention statistics are still computed.
    store : HostStore, optional
        Where compaction may move evicted rows and :meth:`restore` takes them from (``None``: no store,
        evicted rows are deleted).

    Attributes
    ----------
    dtype : torch.dtype or None
        The precision the banks store their full-precision rows in (:meth:`store_in`; ``None``: the
        chunk's own, the model's compute precision), whatever the storage format's codes.
    row_dtype : torch.dtype or None
        The precision the full-precision rows written so far are in (:attr:`dtype`, else the model's;
        ``None`` before the first ``attend``): what a record names as its cache precision.
    """

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        tokens_per_frame: int,
        rope: RopeSpec,
        layout: Layout | None = None,
        capacity_limit: int | None = None,
        compute_attention: bool = True,
        store: HostStore | None = None,
    ) -> None:
        self.num_layers, self.num_heads, self.head_dim = num_layers, num_heads, head_dim
        self.tokens_per_frame = tokens_per_frame
        self.rope = rope
        self.capacity_limit = capacity_limit
        self.compute_attention = compute_attention
        self.store = store
        self.dtype: torch.dtype | None = None
        self.row_dtype: torch.dtype | None = None
        layout = uniform_layout(num_layers, num_heads) if layout is None else layout
        if len(layout) != num_layers:
            raise ValueError(f"layout has {len(layout)} layers, the cache {num_layers}")
        self.banks: list[list[Bank]] = []
        for layer, groups in enumerate(layout):
            check_partition(groups, num_heads, f"layer {layer}")
            self.banks.append([Bank(layer, g, capacity_limit) for g in groups])
        self.chunks: list[ChunkInfo] = []
        self.current: ChunkInfo | None = None
        self.fork_device: torch.device | None = None  # where forks go while the banks are parked elsewhere
        self.reindexed: tuple[int, int, float] | None = None
        self._pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._written = [False] * num_layers
        self._probe: _Probe | None = None
        self._stats: AttentionStats | None = None
        self._queries: dict[int, torch.Tensor] | None = None
        # merges since the current chunk began: (layer, head group, absorbing ids, absorbed ids)
        self.merges: list[tuple[int, HeadGroup, torch.Tensor, torch.Tensor]] = []

    @classmethod
    def from_geometry(cls, geometry, layout: Layout | None = None, capacity_limit: int | None = None,
                      compute_attention: bool = True, store: HostStore | None = None) -> "KVCache":
        """Build from a :class:`cmbench.backbones.base.Geometry` (any object with its attributes)."""
        return cls(geometry.num_layers, geometry.num_heads, geometry.head_dim, geometry.tokens_per_frame,
                   geometry.rope, layout, capacity_limit, compute_attention, store)

    def use_storage(self, storage: StorageFormat) -> None:
        """Store every bank's history in ``storage`` from now on (banks rebuilt empty: before any chunk).

        Forks, regrouped banks and restored rows keep the format; see :mod:`cmbench.cache.quantized`.
        """
        if self.chunks or self.current is not None:
            raise RuntimeError("the storage format is chosen before the first chunk")
        storage.check(self.head_dim)
        self.banks = [[make_bank(b.layer, b.group, self.capacity_limit, storage) for b in layer_banks]
                      for layer_banks in self.banks]

    def store_in(self, dtype: torch.dtype | None) -> None:
        """Store every bank's full-precision rows (the history of ``fp`` banks, the recent window and the
        open chunk of quantized ones) in ``dtype`` from now on (``None``: the model's compute precision);
        before the first chunk. Attention and its statistics read them back in the queries' precision.

        A serving backbone's cache holds its rows in its own precision (bfloat16 for every Wan-family
        model); ``store_in(torch.bfloat16)`` gives a float32 model the same bytes per row, so that a bytes
        ratio means what it would mean there.
        """
        if self.chunks or self.current is not None:
            raise RuntimeError("the cache's precision is chosen before the first chunk")
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"a cache stores its rows in a floating-point dtype, got {dtype}")
        self.dtype = dtype

    # ------------------------------------------------------------------ timeline
    @property
    def committed_tokens(self) -> int:
        """Tokens of every committed chunk (what FullKV would hold)."""
        return sum(c.length for c in self.chunks)

    @property
    def next_frame(self) -> int:
        """First latent frame after the committed history."""
        return self.chunks[-1].frame_end if self.chunks else 0

    def chunk(self, index: int) -> ChunkInfo:
        """The committed (or current) chunk with this index."""
        if self.current is not None and self.current.index == index:
            return self.current
        for info in reversed(self.chunks):
            if info.index == index:
                return info
        raise KeyError(f"no chunk {index} in the cache")

    def all_banks(self) -> Iterator[Bank]:
        for layer_banks in self.banks:
            yield from layer_banks

    def begin_chunk(self, chunk_index: int, frame_start: int, num_frames: int) -> ChunkInfo:
        """Open a chunk of ``num_frames`` latent frames starting at absolute frame ``frame_start``.

        Raises if a chunk is open, if the chunk index or frames do not move forward, or if a bank holds
        more history than its configured ``max_tokens``.
        """
        if self.current is not None:
            raise RuntimeError(f"chunk {self.current.index} is still open; commit it first")
        if self.chunks and chunk_index <= self.chunks[-1].index:
            raise ValueError(f"chunk index {chunk_index} does not follow {self.chunks[-1].index}")
        if frame_start < self.next_frame or num_frames <= 0:
            raise ValueError(f"chunk frames [{frame_start}, +{num_frames}) overlap history ending at {self.next_frame}")
        for bank in self.all_banks():
            cap = bank.group.max_tokens
            if cap is not None and bank.n > cap:
                raise RuntimeError(f"layer {bank.layer} bank {bank.role!r} holds {bank.n} tokens over its size {cap}")
        T = self.tokens_per_frame
        L = num_frames * T
        offsets = torch.arange(L)
        frame = frame_start + offsets // T
        pos = offsets % T
        self._pending = (frame, pos, frame * T + pos)
        self.current = ChunkInfo(chunk_index, frame_start, num_frames, frame_start * T, L)
        self._written = [False] * self.num_layers
        self.merges = []
        return self.current

    def commit_chunk(self) -> ChunkInfo:
        """Turn the open chunk's slot (the last ``attend`` call of every layer) into history."""
        info = self._require_open()
        if self._probe is not None:
            raise RuntimeError("cannot commit a chunk inside a probe")
        missing = [i for i, w in enumerate(self._written) if not w]
        if missing:
            raise RuntimeError(f"layers {missing} never called attend for chunk {info.index}")
        frame, pos, gid = self._open_provenance()
        for bank in self.all_banks():
            bank.commit(frame, info.index, pos, gid)
        self.chunks.append(info)
        self.current, self._pending = None, None
        return info

    def _require_open(self) -> ChunkInfo:
        if self.current is None:
            raise RuntimeError("no open chunk: call begin_chunk first")
        return self.current

    def _open_provenance(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Source frame, position in frame and global id of the open chunk's tokens, each ``[L]``."""
        if self._pending is None:
            raise RuntimeError("no open chunk: call begin_chunk first")
        return self._pending

    def _require_closed(self, what: str) -> None:
        if self.current is not None:
            raise RuntimeError(f"cannot {what} while chunk {self.current.index} is open")

    # ------------------------------------------------------------------ attention
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Record the chunk's K/V for ``layer`` and attend over stored history plus the chunk.

        Parameters
        ----------
        layer : int
        q, k, v : Tensor, shape ``[B, L, H, D]``
            The current chunk's rotated queries and keys, and values (``L`` = the open chunk's tokens).

        Returns
        -------
        Tensor, shape ``[B, L, H, D]``: for each head, softmax attention of ``q`` over the head's bank
        history followed by the chunk itself (no mask within the chunk); a merged history row's logit
        carries ``log(count)`` (:meth:`Bank.merge`).

        A bank in a quantized storage format (:meth:`use_storage`) is read decoded, a block of history
        rows at a time (:meth:`QuantizedBank.blocks`, combined by :func:`block_attention.attention`): the
        call's workspace is one block ``[B, DECODE_ROWS, Hg, D]`` in the chunk's dtype, not the history
        (the recent window read from its full-precision copy); the chunk's own keys come from its
        full-precision slot. While attention statistics are recorded (:meth:`record_attention`) the
        statistics read the blocks twice more (:func:`~cmbench.cache.attention_stats.blocked_frame_mass`:
        each query's normaliser, then each frame's share), one block at a time.
        """
        info = self._require_open()
        B, L, H, D = q.shape
        if k.shape != q.shape or v.shape != q.shape:
            raise ValueError(f"q, k, v must share one shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        if L != info.length or H != self.num_heads or D != self.head_dim:
            raise ValueError(
                f"attend expects [B, {info.length}, {self.num_heads}, {self.head_dim}] for chunk {info.index}, "
                f"got {tuple(q.shape)}"
            )
        self._written[layer] = True
        if self._queries is not None:
            self._queries[layer] = q.detach()
        banks = self.banks[layer]
        whole = len(banks) == 1
        if not self.compute_attention:
            out = torch.zeros_like(q)
        elif not whole:
            out = torch.empty_like(q)
        stats = self._stats
        mass = None if stats is None else torch.zeros(H, stats.num_frames)
        for bank in banks:
            if whole:
                qg, kg, vg = q, k, v
            else:
                idx = bank.heads.to(q.device)
                qg, kg, vg = q.index_select(2, idx), k.index_select(2, idx), v.index_select(2, idx)
            if self.dtype is not None:
                kg, vg = kg.to(self.dtype), vg.to(self.dtype)
            self.row_dtype = kg.dtype
            bank.write_slot(kg, vg)
            if not self.compute_attention and mass is None:
                continue
            blocks, rows = self._visible(bank, L, q.dtype)
            bias = self._logit_bias(bank, rows, L)
            if stats is not None and mass is not None:
                history = bank.field("frame") if rows is None else bank.field("frame")[rows]
                frames = torch.cat([history, self._open_provenance()[0]])
                mass[bank.heads] = stats.of(qg, partial(self._key_blocks, bank, L, qg.dtype, frames, bias))
            if not self.compute_attention:
                continue
            o = block_attention.attention(qg, blocks, bias)
            if whole:
                out = o
            else:
                out.index_copy_(2, bank.heads.to(q.device), o)
        if stats is not None and mass is not None:
            stats.mass[layer] = mass
        return out

    def _visible(self, bank: Bank, L: int, dtype: torch.dtype
                 ) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]:
        """Blocks of keys ``[B, n_i, Hg, D]`` and values a call attends to (:meth:`Bank.blocks`: the history
        rows used, then the open chunk) in ``dtype`` (the queries'), with the history rows used (``None``:
        all). Rows stored in another precision (:meth:`store_in`) are converted a block at a time."""
        probe = self._probe
        if probe is not None and not probe.history:
            blocks: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter([bank.slot(L)])
            rows: torch.Tensor | None = torch.zeros(0, dtype=torch.long)
        else:
            rows = None if probe is None or probe.visible is None else probe.visible[id(bank)]
            blocks = bank.blocks(L, rows)
        if self.dtype is None or self.dtype == dtype:
            return blocks, rows
        return ((k.to(dtype), v.to(dtype)) for k, v in blocks), rows

    def _key_blocks(self, bank: Bank, L: int, dtype: torch.dtype, frames: torch.Tensor,
                    bias: torch.Tensor | None) -> Iterator[KeyBlock]:
        """The keys a call attends to (:meth:`_visible` in ``dtype``, decoded afresh) as statistics blocks: each block's keys
        ``[B, n_i, Hg, D]`` with its slice of ``frames [N']`` and of ``bias [N']`` (keys in call order)."""
        done = 0
        for keys, _ in self._visible(bank, L, dtype)[0]:
            n = keys.shape[1]
            yield keys, frames[done : done + n], None if bias is None else bias[done : done + n]
            done += n

    @staticmethod
    def _logit_bias(bank: Bank, rows: torch.Tensor | None, L: int) -> torch.Tensor | None:
        """``log(count)`` of each key a call attends to, ``float32 [N']`` (zero for the open chunk's
        ``L`` keys; ``rows``: the history rows used, ``None`` for all); ``None`` when the bank merged no row."""
        bias = bank.logit_bias()
        if bias is None:
            return None
        return torch.cat([bias if rows is None else bias[rows], torch.zeros(L)])

    @property
    def probing(self) -> bool:
        """Whether a :meth:`probe` is active."""
        return self._probe is not None

    def visible_history(self, bank: Bank) -> torch.Tensor:
        """Global ids ``[n']`` of the history tokens an ``attend`` call would see now in ``bank``
        (all stored tokens, or what the active probe leaves visible)."""
        if self._probe is not None and not self._probe.history:
            return bank.field("gid")[:0]
        if self._probe is None or self._probe.visible is None:
            return bank.field("gid")
        return bank.field("gid")[self._probe.visible[id(bank)]]

    @contextmanager
    def probe(self, hide: BankSelector | None = None, history: bool = True) -> Iterator["KVCache"]:
        """Run extra model calls on the open chunk that leave no trace.

        Inside, ``attend`` works as usual, but on exit the slot contents, the per-layer write flags and
        everything else are exactly as on entry: the probe's K/V never become history.

        Parameters
        ----------
        hide : callable ``bank -> bool [bank.n]``, optional
            History rows the probe must not see (e.g. those the next compaction will drop); they are
            left out physically for the probe's calls.
        history : bool
            ``False``: attend to the current chunk only (a no-context prediction).
        """
        info = self._require_open()
        if self._probe is not None:
            raise RuntimeError("probes do not nest")
        saved = {}
        for layer, written in enumerate(self._written):
            if written:
                for bank in self.banks[layer]:
                    k, v = bank.slot(info.length)
                    saved[id(bank)] = (k.clone(), v.clone())
        visible = None
        if hide is not None:
            visible = {id(b): (~hide(b)).nonzero().squeeze(1) for b in self.all_banks()}
        self._probe = _Probe(list(self._written), saved, visible, history)
        try:
            yield self
        finally:
            probe, self._probe = self._probe, None
            self._written = probe.written
            for bank in self.all_banks():
                if id(bank) in probe.saved_slots:
                    slot_k, slot_v = bank.slot(info.length)
                    slot_k[:], slot_v[:] = probe.saved_slots[id(bank)]

    @contextmanager
    def record_attention(self, key_frames: Sequence[int] | None = None) -> Iterator[AttentionStats]:
        """Record attention mass per source frame for the ``attend`` calls made inside.

        Yields an :class:`AttentionStats` whose ``mass[layer]`` is ``[H, F]`` with ``F`` = the end frame
        of the open chunk (the latest call of each layer wins).

        Parameters
        ----------
        key_frames : sequence of int, optional
            Measure the softmax over the keys of these source frames only (renormalised over them,
            per query), e.g. a method's own packed key layout; the attention the model computes is
            unchanged. ``None``: every visible key.
        """
        info = self._require_open()
        self._stats = AttentionStats(info.frame_end, None if key_frames is None else tuple(int(f) for f in key_frames))
        try:
            yield self._stats
        finally:
            self._stats = None

    @contextmanager
    def record_queries(self) -> Iterator[dict[int, torch.Tensor]]:
        """Record each layer's queries of the open chunk's tokens for the ``attend`` calls inside.

        Yields a dict ``layer -> Tensor [B, L, H, D]``: every rotated query of the chunk's ``L`` tokens
        (the tensor ``attend`` was given, not a copy; the latest call of each layer wins). All layers'
        queries are held until the dict is let go: ``L * H * D`` values per layer in the model's precision
        (0.43 GB in bfloat16 for Wan 1.3B's 30 layers at Self Forcing's 4680-token chunk).
        """
        self._require_open()
        self._queries = {}
        try:
            yield self._queries
        finally:
            self._queries = None

    # ------------------------------------------------------------------ decisions and compaction
    def mark(self, chunk: int, keep: torch.Tensor | None = None, priority: torch.Tensor | None = None,
             banks: Sequence[Bank] | None = None) -> None:
        """Store per-token decisions for the tokens of a committed ``chunk``.

        Parameters
        ----------
        chunk : int
            Chunk index.
        keep : Tensor, shape ``[L]``, bool, optional
            Keep flag per token of the chunk, in token order (``gid - gid_start``).
        priority : Tensor, shape ``[L]``, optional
            Keep priority per token (higher is kept longer by budget / bounded-memory eviction).
        banks : sequence of Bank, optional
            Banks to mark (default: every bank; a shared decision).
        """
        info = self.chunk(chunk)
        gids = torch.arange(info.gid_start, info.gid_start + info.length)
        self.mark_tokens(gids, keep=keep, priority=priority, banks=banks)

    def mark_tokens(self, gids: torch.Tensor, keep: torch.Tensor | None = None, priority: torch.Tensor | None = None,
                    banks: Sequence[Bank] | None = None) -> None:
        """Store per-token decisions for the stored tokens with these global ids (any chunks).

        Parameters
        ----------
        gids : Tensor, shape ``[m]``, long
            Global token ids, strictly increasing; ids not stored in a bank are skipped there.
        keep : Tensor, shape ``[m]``, bool, optional
        priority : Tensor, shape ``[m]``, optional
        banks : sequence of Bank, optional
            Banks to mark (default: every bank).
        """
        gids = gids.to(torch.long).cpu()
        for bank in self.all_banks() if banks is None else banks:
            rows, index = bank.rows_of_gids(gids)
            if keep is not None:
                bank.keep[rows] = keep.to(torch.bool).cpu()[index]
            if priority is not None:
                bank.priority[rows] = priority.float().cpu()[index]

    def compact(self, select: BankSelector, to_store: bool = False) -> int:
        """Physically keep, in every bank, the history rows where ``select(bank)`` is true.

        Selection is by the bank's own provenance at call time (source identity, never stored offsets).
        With a chunk open (not inside a probe) its slot moves along with the history. ``to_store``: the
        other rows move to the :class:`HostStore` instead of being deleted. Returns the number of
        (token, head) entries dropped from the banks.
        """
        if self._probe is not None:
            raise RuntimeError("cannot compact inside a probe")
        if to_store and self.store is None:
            raise RuntimeError("this cache has no store to move evicted rows into")
        length = 0 if self.current is None else self.current.length
        dropped = 0
        for layer, banks in enumerate(self.banks):
            for bank in banks:
                keep = select(bank)
                dropped += (bank.n - int(keep.sum())) * bank.num_heads
                if to_store and self.store is not None and not bool(keep.all()):
                    k, v, prov = bank.extract((~keep).nonzero().squeeze(1))
                    self.store.put((layer, bank.group), Segment(k, v, prov))
                bank.keep_only(keep, slot=length if self._written[bank.layer] else 0)
        return dropped

    def merge(self, select: MergeSelector) -> int:
        """Fold history rows into earlier rows of the same bank (:meth:`Bank.merge`), in every bank.

        ``select(bank)`` gives ``(into, rows)``, each ``long [m]``: row ``into[i]`` absorbs row
        ``rows[i]`` (values averaged by count, counts added, the absorbed row dropped). With a chunk open
        (not inside a probe) its slot moves along with the history. Each bank's pairs are logged by global
        id in :attr:`merges` (cleared when a chunk begins), so a recording can replay them. Returns the
        number of (token, head) entries dropped from the banks.
        """
        if self._probe is not None:
            raise RuntimeError("cannot merge inside a probe")
        length = 0 if self.current is None else self.current.length
        dropped = 0
        for bank in self.all_banks():
            into, rows = select(bank)
            if len(rows):
                gid = bank.field("gid")
                self.merges.append((bank.layer, bank.group, gid[into].clone(), gid[rows].clone()))
            bank.merge(into, rows, slot=length if self._written[bank.layer] else 0)
            dropped += len(rows) * bank.num_heads
        return dropped

    def restore(self, select: RestoreSelector) -> int:
        """Bring stored tokens back into the device banks, each at its place in global-id order.

        Parameters
        ----------
        select : callable ``bank -> long [m]``
            Global ids of the bank's stored tokens to bring back (increasing; every one must be in the
            store for that bank).

        A restored key is rotated from the temporal position it was stored with to the one a token kept
        all along carries now (its source frame, or the re-indexed position once :meth:`reindex` ran).
        Allowed with no chunk open, or with one open before any of its ``attend`` calls, never inside a
        probe; a bank may not go above its configured size. Returns the (token, head) entries restored.
        """
        if self._probe is not None:
            raise RuntimeError("cannot restore inside a probe (a probe leaves no trace)")
        if self.store is None:
            raise RuntimeError("this cache has no store to restore from")
        if self.current is not None and any(self._written):
            raise RuntimeError(f"restore runs before chunk {self.current.index}'s first model call")
        restored = 0
        for layer, banks in enumerate(self.banks):
            for bank in banks:
                gids = select(bank)
                cap = bank.group.max_tokens
                if cap is not None and bank.n + len(gids) > cap:
                    raise RuntimeError(f"layer {layer} bank {bank.role!r}: restoring {len(gids)} tokens to "
                                       f"{bank.n} goes over its size {cap}")
                seg = self.store.fetch((layer, bank.group), gids)
                if seg is None:
                    continue
                device = bank.storage()[0].device  # the bank casts to its own format on insert
                k = seg.k.to(device)
                target = self._temporal_position(seg.prov["frame"])
                delta = target - seg.prov["tpos"]
                if bool((delta != 0).any()):
                    k = shift_positions(k, self.rope, delta)
                prov = dict(seg.prov, tpos=target)
                bank.insert(k, seg.v.to(device), prov)
                restored += len(seg) * bank.num_heads
        return restored

    def _temporal_position(self, frame: torch.Tensor) -> torch.Tensor:
        """Temporal RoPE position ``float64 [m]`` a kept key of these source frames carries now."""
        if self.reindexed is None:
            return frame.to(torch.float64)
        return reindex_frames(frame, *self.reindexed)

    def frame_keys(self, layer: int, frames: Sequence[int], role: str | None = None) -> torch.Tensor | None:
        """Stored keys of whole latent frames of one layer, the heads of its banks side by side.

        Parameters
        ----------
        layer : int
        frames : sequence of int
            Source latent frames, each of which must be stored completely.
        role : str, optional
            Only the banks with this role (e.g. ``"dynamic"``); default every bank of the layer.

        Returns
        -------
        Tensor, shape ``[B, len(frames), tokens_per_frame, H', D]`` (``H'`` = heads of the chosen banks in
        head order), or ``None`` when a frame is not stored completely in one of them or no bank has
        the role.
        """
        T = self.tokens_per_frame
        frame_list = [int(f) for f in frames]
        gids = (torch.tensor(frame_list, dtype=torch.long)[:, None] * T + torch.arange(T)).flatten()
        banks = [b for b in self.banks[layer] if role is None or b.role == role]
        if not banks:
            return None
        parts: list[torch.Tensor] = []
        heads: list[int] = []
        for bank in banks:
            rows, _ = bank.rows_of_gids(gids)
            if len(rows) != len(gids):
                return None
            parts.append(bank.gather(rows)[0])
            heads.extend(bank.group.heads)
        keys = torch.cat(parts, dim=2)[:, :, torch.tensor(heads).argsort().to(parts[0].device)]
        return keys.reshape(keys.shape[0], len(frame_list), T, *keys.shape[2:])

    def regroup(self, layer: int, groups: Sequence[HeadGroup]) -> None:
        """Split a layer's banks into new head groups (each new group inside one existing bank)."""
        self._require_closed("regroup")
        check_partition(groups, self.num_heads, f"layer {layer}")
        new = []
        for group in groups:
            owners = [b for b in self.banks[layer] if set(group.heads) <= set(b.group.heads)]
            if not owners:
                raise ValueError(f"layer {layer}: heads {group.heads} span several banks and cannot be merged")
            new.append(owners[0].select_heads(group))
        self.banks[layer] = new

    def reindex(self, q0: int, n_recent: int = 8, l_virt: float = 17.0) -> None:
        """Move every cached key to its re-indexed temporal position (paper Appendix A).

        The new position is a function of the token's source frame (``reindex_frames``); only temporal
        rotary pairs change. Applying it again with the same arguments changes nothing.
        """
        self._require_closed("re-index")
        for bank in self.all_banks():
            if bank.n == 0:
                continue
            bank.unshare()  # rotates keys in place: never those of the cache this one was forked from
            new = reindex_frames(bank.field("frame"), q0, n_recent, l_virt)
            delta = new - bank.field("tpos")
            if isinstance(bank, QuantizedBank):  # decoded, rotated and encoded again
                if bool((delta != 0).any()):
                    bank.rekey(partial(self._shifted, delta=delta))
                bank.tpos[: bank.n] = new
                continue
            keys, _ = bank.history()
            row_bytes = keys[0, 0].numel() * keys.shape[0] * keys.element_size()
            step = max(1, REINDEX_BLOCK_BYTES // row_bytes)
            for start in range(0, bank.n, step):  # in blocks: element-wise, so the same result
                block = delta[start : start + step]
                if bool((block != 0).any()):
                    stop = start + len(block)
                    keys[:, start:stop] = shift_positions(keys[:, start:stop], self.rope, block)
            bank.tpos[: bank.n] = new
        self.reindexed = (q0, n_recent, l_virt)

    def _shifted(self, keys: torch.Tensor, rows: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Keys ``[B, m, Hg, D]`` of history rows ``rows [m]`` moved by ``delta[rows]`` temporal positions."""
        return shift_positions(keys, self.rope, delta[rows])

    # ------------------------------------------------------------------ accounting
    def visible_counts(self) -> torch.Tensor:
        """History tokens each head sees, ``[num_layers, num_heads]`` long (the current chunk excluded)."""
        counts = torch.zeros(self.num_layers, self.num_heads, dtype=torch.long)
        for bank in self.all_banks():
            counts[bank.layer, bank.heads] = bank.n
        return counts

    def kept_per_chunk(self, bank: Bank | None = None) -> dict[int, int]:
        """Tokens of every committed chunk still stored in ``bank`` (default: layer 0's first bank)."""
        bank = self.banks[0][0] if bank is None else bank
        # chunk indices increase but may skip numbers: count up to the last one, not to the number of chunks
        counts = torch.bincount(bank.field("chunk"), minlength=self.chunks[-1].index + 1 if self.chunks else 0)
        return {info.index: int(counts[info.index]) for info in self.chunks}

    def stored_bytes(self) -> int:
        """Bytes of stored history K and V across banks (a store's are apart, :meth:`store_bytes`, wherever it
        is kept)."""
        return sum(b.stored_bytes() for b in self.all_banks())

    def store_shares(self) -> int:
        """Equal parts the model's history is split into, this cache holding one (1: every head here)."""
        return 1

    def store_bytes(self) -> tuple[int, int]:
        """The model's host store's peak bytes of K and V and the bytes it moved host <-> device (both
        ways) so far: this cache's store's, times :meth:`store_shares` (every share holds and moves the
        same tokens of as many heads); ``(0, 0)`` without a store. A store kept on the device
        (:attr:`HostStore.on_device`) moves nothing: its peak is then device memory beside the banks'."""
        if self.store is None:
            return 0, 0
        shares = self.store_shares()
        return self.store.peak_bytes * shares, (self.store.bytes_in + self.store.bytes_out) * shares

    def allocated_bytes(self) -> int:
        """Bytes this cache allocated for K, V and provenance across banks (rows a fork reads in place
        from the prefilled cache are not counted: :meth:`shared_bytes`)."""
        return sum(b.allocated_bytes() for b in self.all_banks())

    def shared_bytes(self) -> int:
        """Bytes of K and V a fork reads in place from the prefilled cache it was forked from."""
        return sum(b.shared_bytes() for b in self.all_banks())

    def trim(self) -> None:
        """Reallocate every bank to exactly its history (no free rows): a prefilled cache that waits
        while its tasks run holds no more than it stores. No chunk may be open."""
        self._require_closed("trim")
        for bank in self.all_banks():
            if bank.k is not None:
                bank.move(bank.k.device)

    def park(self, host: str | torch.device = "cpu") -> None:
        """Move every bank's history to ``host`` (trimmed); later forks are allocated back on the device
        the banks were on, so a prefilled cache can wait in host memory while its tasks run on the GPU.

        Parameters
        ----------
        host : str or torch.device
            Where the history waits (host memory).
        """
        self._require_closed("park")
        host = torch.device(host)
        for bank in self.all_banks():
            if bank.k is None:
                continue
            if self.fork_device is None and bank.k.device != host:
                self.fork_device = bank.k.device
            bank.move(host)

    def fork(self, headroom: int = 0, share: bool = True) -> "KVCache":
        """An independent cache for one task from a prefilled context; no chunk may be open.

        Parameters
        ----------
        headroom : int
            Tokens the fork is expected to add (e.g. a whole continuation): each bank is allocated
            once with room for them (at least one chunk), so it never regrows (a copy of the whole
            bank) mid-run. A bank with a configured size or a capacity limit gets no more room than
            it can ever use.
        share : bool
            Read this cache's history in place (:meth:`Bank.share`): the fork allocates only the
            head-room, and copies a chunk of the history only when its compaction drops rows of it;
            this cache is never written. ``False``: copy every bank. A :meth:`park`-ed cache is always
            copied (to the device it was parked from).

        The fork lives where the banks are, or, for a :meth:`park`-ed cache, on the device they were
        parked from. Attention over a shared bank reads its shared and own rows as one sequence (one
        layer's history is gathered per call), so a fork's outputs equal a copy's exactly.
        """
        self._require_closed("fork")
        out = type(self).__new__(type(self))
        out.__dict__.update(self.__dict__)
        chunk = max((c.length for c in self.chunks), default=0)
        share = share and self.fork_device is None
        out.banks = [[b.share(b.headroom_for(max(headroom, chunk), chunk)) if share
                      else b.clone(b.headroom_for(max(headroom, chunk), chunk), self.fork_device)
                      for b in layer_banks] for layer_banks in self.banks]
        out.fork_device = None
        out.chunks = list(self.chunks)
        out._written = [False] * self.num_layers
        out.merges = []
        out.store = None if self.store is None else self.store.fork()
        return out

