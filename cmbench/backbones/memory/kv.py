"""The KV cache's device memory over one context and its tasks, replayed without any tensor.

:func:`simulate_kv` walks the calls the generation loop makes (:mod:`cmbench.generation.loop`) and, for
every physical bank, applies the cache's own allocation rules (:func:`~cmbench.cache.bank.grown_capacity`,
:func:`~cmbench.cache.bank.shrunk_capacity`, ``KVCache.fork``'s head-room) to the number of rows the
method keeps. The bytes it reports are the bytes the real banks allocate, in the same order:

- prefill: chunk by chunk, each layer's bank grows (the old and the new storage both exist while it is
  copied), the chunk is committed, the method compacts (a gather of the kept rows, then a shrink);
  the temporal RoPE re-index rotates keys in blocks (``REINDEX_BLOCK_BYTES``);
- between contexts and tasks the prefilled cache is trimmed to its history (``KVCache.trim``) or parked
  in host memory (``KVCache.park``);
- each task forks it with room for the whole continuation, then generates chunk by chunk: the fork reads
  the prefilled rows in place and owns only its head-room, until a compaction drops rows of a prefilled
  chunk (the rows from that chunk on are then copied into the fork's own storage); attention over a
  shared bank gathers that layer's shared and own rows per call; a parked prefilled cache is copied
  back whole for each task (``parked_*`` fields);
- with ``offload_kv`` every bank lives in host memory and one layer's history is staged at a time;
- a retrieval method (one with a host store) moves each chunk leaving its recent window into the store
  (its stored share of the chunk), and before every chunk restores up to its retrieval budget from the
  store into the device banks, which the compaction after the chunk sends out again.

What a method keeps (:class:`Retention`) is exact for FullKV, sink + recent windows (Streaming and any
bank of a configured size), quota mode (``quota_pr`` / ``quota_tokens``) and bounded memory on a
uniform layout; for a method whose keep rule depends on the data (DeCoPrune's threshold, ...) each
chunk leaving the recent window keeps an assumed fraction of its tokens (``assume_pr``).
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field

from cmbench.cache.bank import Bank, grown_capacity, shrunk_capacity
from cmbench.cache.kv_cache import REINDEX_BLOCK_BYTES

REINDEX_TRANSIENT = 3  # a re-index block's copies: the rotated keys, their float32 temporal pairs, the product


@dataclass(frozen=True)
class Retention:
    """How many history tokens a head group keeps after each chunk (see :func:`retention`).

    Attributes
    ----------
    sink_chunks, recent_chunks : int
        Chunks that stay dense (sink and the newest ones).
    keep_fraction : float
        Fraction of a chunk's tokens kept when it leaves the recent window under a data-dependent rule
        (1 keeps everything: FullKV).
    window_only : bool
        Keep only the sink and the recent window (Streaming).
    budget_pr : float or None
        Quota mode: history per head = ``round((1 - budget_pr) * committed tokens)``.
    token_budget : int or None
        Quota mode: at most this many history tokens per head.
    max_history_tokens : int or None
        Bounded memory: at most this many, and the prefill cache never allocates more than it + a chunk.
    exact : bool
        Whether the replay is exact for this method (``False``: ``keep_fraction`` is an assumption).
    stored_per_chunk : int or None
        Retrieval methods: tokens of a chunk the host store keeps when the chunk leaves the recent window
        (``None``: no store).
    restore_tokens : int
        Retrieval methods: the most stored tokens brought back into a bank before a chunk.
    note : str
        How the retention was chosen (printed with the plan).
    """

    sink_chunks: int = 1
    recent_chunks: int = 1
    keep_fraction: float = 1.0
    window_only: bool = False
    budget_pr: float | None = None
    token_budget: int | None = None
    max_history_tokens: int | None = None
    exact: bool = True
    note: str = ""
    stored_per_chunk: int | None = None
    restore_tokens: int = 0


# the paper's realised pruning ratios on LingBot World v2 (main table and ablations), the default
# assumption for methods whose retention depends on the data
PAPER_PR = {"decoprune": 0.8543, "decoprune_hs": 0.8619, "tempdiff": 0.8636, "forcingkv": 0.8062,
            "random": 0.8531, "decoprune_reverse": 0.1879, "dummyforcing": 0.9803, "streaming": 0.9437}


def retention(method, assume_pr: float | None = None, geometry=None) -> Retention:
    """What ``method`` keeps, read from the generic :class:`~cmbench.methods.base.Method` knobs.

    Parameters
    ----------
    method : Method
        Any object with ``name``, ``sink_chunks``, ``recent_chunks``, ``max_history_tokens``, ``rule``
        and, for score-based methods, ``quota_mode`` / ``quota_pr`` / ``quota_tokens``.
    assume_pr : float, optional
        Pruning ratio assumed for a data-dependent keep rule (default: the paper's realised PR for the
        method, :data:`PAPER_PR`; 0 when unknown, i.e. planned as FullKV).
    geometry : Geometry, optional
        The backbone's; needed to plan a retrieval method (``host_store``, ``stored_tokens_per_chunk``,
        ``retrieved_chunks``).
    """
    window = getattr(method, "window", None)  # chunks kept dense (DeCoPrune's delayed window: 2 w)
    recent = int(window()) if callable(window) else int(method.recent_chunks)
    common = dict(sink_chunks=int(method.sink_chunks), recent_chunks=recent, max_history_tokens=method.max_history_tokens)
    name = str(getattr(method, "name", type(method).__name__))
    host_store = getattr(method, "host_store", None)
    if geometry is not None and callable(host_store) and host_store() is not None:
        stored = int(method.stored_tokens_per_chunk(geometry))
        restore = int(method.retrieved_chunks(geometry)) * stored
        return Retention(window_only=True, stored_per_chunk=stored, restore_tokens=restore,
                         note=f"retrieval: sink + recent window on the device, {restore} stored tokens per bank "
                              f"restored before each chunk; {stored} of each evicted chunk's "
                              f"{geometry.tokens_per_chunk} tokens in the host store", **common)
    if getattr(method, "quota_mode", False):
        target = getattr(method, "quota_pr", None)
        note = (f"quota mode: PR {100 * target:.2f}%" if target is not None
                else f"quota mode: {method.quota_tokens} tokens per head")
        return Retention(budget_pr=target, token_budget=getattr(method, "quota_tokens", None), note=note, **common)
    if name == "streaming":
        return Retention(window_only=True, note="sink + recent window only", **common)
    if not hasattr(method, "quota_mode"):  # not score-based: keeps every token its rule does not drop
        return Retention(note="every token kept", **common)
    pr = PAPER_PR.get(name, 0.0) if assume_pr is None else float(assume_pr)
    source = "assumed (backbone.memory.assume_pr)" if assume_pr is not None else (
        "the paper's realised PR" if name in PAPER_PR else "unknown retention: planned as FullKV")
    return Retention(keep_fraction=1.0 - pr, exact=False, note=f"data-dependent: PR {100 * pr:.2f}% {source}",
                     **common)


@dataclass
class KVTimeline:
    """Bytes of KV storage at the moments that matter (see :func:`simulate_kv`).

    Attributes
    ----------
    after_chunk : list of int
        Allocated K/V bytes on the device after each prefill chunk's compaction (a test compares it with
        ``KVCache.allocated_bytes`` minus provenance at the loop's ``on_chunk_end``).
    prefill_peak : int
        Most allocated K/V bytes at any moment of the prefill (growth and compaction copies included).
    prefilled_alloc, prefilled_stored : int
        The prefilled cache after the re-index, before it is trimmed or parked: allocated and stored.
    fork : int
        What one task's fork allocates (room for the whole continuation; the prefilled rows it reads
        in place are the prefilled cache's).
    continuation_peak : int
        Most K/V bytes of the fork at any moment of the continuation (compaction copies and the
        per-layer gather of shared rows for attention included).
    continuation_after_chunk : list of int
        The fork's allocated bytes after each generated chunk.
    parked_fork, parked_continuation_peak : int
        The same with the prefilled cache parked in host memory: each fork is a whole copy on the device.
    staging_peak : int
        With the cache in host memory (``offload_kv``): the most bytes one layer stages on the device
        (its history plus the chunk's rows, K and V).
    host_peak : int
        With ``offload_kv``: the most K/V bytes in host memory (the prefill, or the trimmed prefilled
        cache plus one fork).
    store_peak : int
        Retrieval methods: the most K/V bytes in the host store (the prefilled store plus one task's).
    open_slot : int
        A quantized format's full-precision chunk slot, every bank's (``QuantizedBank.write_slot``): held from a
        layer's first call of a chunk until the chunk is committed, beside the allocations above, which are
        counted after commits (0 in full precision: the chunk is written into the bank's own rows).
    """

    after_chunk: list[int] = field(default_factory=list)
    prefill_peak: int = 0
    prefilled_alloc: int = 0
    prefilled_stored: int = 0
    fork: int = 0
    continuation_peak: int = 0
    continuation_after_chunk: list[int] = field(default_factory=list)
    parked_fork: int = 0
    parked_continuation_peak: int = 0
    staging_peak: int = 0
    host_peak: int = 0
    store_peak: int = 0
    open_slot: int = 0


@dataclass
class _Bank:
    """One bank's rows: ``n`` history rows in ``cap`` rows, ``row`` bytes per row (K and V); the first
    ``base`` rows are read in place from the prefilled cache (a task's fork), the rest allocated."""

    layer: int
    heads: int
    row: int
    max_tokens: int | None
    n: int = 0
    cap: int = 0
    base: int = 0

    def bytes(self, rows: int | None = None) -> int:
        """Allocated bytes (own rows), or the bytes of ``rows`` rows."""
        return (self.cap - self.base if rows is None else rows) * self.row


@dataclass
class _Cache:
    """The banks of one cache and the running peak of their allocated bytes."""

    banks: list[_Bank]
    capacity_limit: int | None = None
    peak: int = 0

    def allocated(self) -> int:
        return sum(b.bytes() for b in self.banks)

    def gather(self, rows: int) -> int:
        """The most bytes one layer's attention gathers from shared and own rows (banks with shared rows:
        history plus the ``rows`` of the chunk)."""
        layers: dict[int, int] = {}
        for b in self.banks:
            if b.base:
                layers[b.layer] = layers.get(b.layer, 0) + (b.n + rows) * b.row
        return max(layers.values(), default=0)

    def own_from(self, bank: _Bank, row: int) -> None:
        """A compaction drops shared row ``row`` (a chunk start): the rows from it on become the bank's
        own (a new allocation of the same capacity while the old exists)."""
        if row >= bank.base:
            return
        self.note(extra=(bank.cap - row) * bank.row)
        bank.base = row

    def stored(self) -> int:
        return sum(b.bytes(b.n) for b in self.banks)

    def note(self, extra: int = 0) -> None:
        self.peak = max(self.peak, self.allocated() + extra)

    def write_slot(self, rows: int, extra: dict[int, int] | None = None, held: int = 0) -> None:
        """Every layer's ``attend``: a bank grows (old and new both alive while copying); ``extra``:
        rows per bank besides ``rows`` (a restore's); ``held``: bytes alive meanwhile outside the banks'
        rows (a quantized format's open slots)."""
        for bank in self.banks:
            need = bank.n + rows + (0 if extra is None else extra.get(id(bank), 0))
            if bank.cap and need <= bank.cap:
                continue
            old = bank.bytes()
            bank.cap = grown_capacity(bank.cap, need, self.capacity_limit)
            self.note(extra=old + held)

    def compact(self, keep: dict[int, int]) -> None:
        """Banks drop to ``keep[id]`` rows: a gather of the kept rows after the first dropped, then a
        shrink (a new allocation while the old exists)."""
        for bank in self.banks:
            m = keep.get(id(bank), bank.n)
            if m >= bank.n:
                continue
            self.note(extra=m * bank.row // 2)  # index_select of K (then V) rows, at most m rows
            bank.n = m
            new_cap = shrunk_capacity(bank.cap, m)
            if new_cap != bank.cap:
                self.note(extra=new_cap * bank.row)
                bank.cap = new_cap


def _bank_rows_after(bank: _Bank, ret: Retention, committed: int, newest: int, chunk_len: dict[int, int],
                     heads_total: int) -> int:
    """History rows ``bank`` keeps after the compaction that follows chunk ``newest``.

    ``chunk_len`` holds the rows each committed chunk still has in the bank (already reduced for a chunk
    that left the recent window under a data-dependent rule). Sink and recent chunks are dense, so the
    protected rows are exact; eviction (budget, bounded memory) keeps ``max(limit, protected)`` rows,
    as :meth:`~cmbench.methods.base.Method._evict_lowest` does whichever rows it picks.
    """
    protected = sum(n for c, n in chunk_len.items() if c < ret.sink_chunks or c > newest - ret.recent_chunks)
    n = sum(chunk_len.values())
    if ret.window_only:
        n = protected
    elif bank.max_tokens is not None and n > bank.max_tokens:
        n = max(bank.max_tokens, protected)
    limits = []
    if ret.budget_pr is not None:  # ScoredMethod.limits, with every head scored
        limits.append(max(0, round((1.0 - ret.budget_pr) * committed * heads_total / max(1, heads_total))))
    if ret.token_budget is not None:
        limits.append(ret.token_budget)
    if ret.max_history_tokens is not None:
        limits.append(ret.max_history_tokens)
    for limit in limits:
        if n > limit:
            n = max(limit, protected)
    return n


def simulate_kv(num_layers: int, groups: list[list[tuple[int, int | None]]], head_dim: int, dtype_bytes: int,
                tokens_per_chunk: int, context_chunks: int, continuation_chunks: int, ret: Retention,
                batch: int = 1, provenance: bool = False, token_bytes: float | None = None,
                slot_bytes: int = 0) -> KVTimeline:
    """Replay the KV cache of one context (prefill) and one task (fork + continuation).

    Parameters
    ----------
    num_layers : int
    groups : list (per layer) of list of (heads, max_tokens)
        The method's bank layout (``Method.layout(geometry)``: heads per group and configured size).
    head_dim, dtype_bytes : int
        Channels per head and bytes per cached value (the DiT's compute dtype).
    tokens_per_chunk : int
    context_chunks, continuation_chunks : int
        ``q0 / chunk_frames`` and the continuation's chunks.
    ret : Retention
    batch : int
    provenance : bool
        Count each row's provenance too (it lives on the CPU: part of the device's memory only when the
        device is the CPU).
    token_bytes : float, optional
        Bytes one token of one head costs in the banks' storage format
        (:func:`cmbench.cache.quantized.bytes_per_token`; default full precision, ``2 * head_dim * dtype_bytes``).
    slot_bytes : int
        Bytes one token of one head costs in a bank's full-precision chunk slot held apart from its rows
        while the chunk is open (a quantized format: ``2 * head_dim * dtype_bytes``, released at the commit;
        default 0: full precision writes the chunk into the rows counted by ``token_bytes``).

    Returns
    -------
    KVTimeline
    """
    extra = Bank.provenance_row_bytes() if provenance else 0
    per_head = 2 * head_dim * dtype_bytes if token_bytes is None else token_bytes
    banks = [_Bank(layer, heads, math.ceil(batch * heads * per_head) + extra, max_tokens)
             for layer, layer_groups in enumerate(groups) for heads, max_tokens in layer_groups]
    if len(groups) != num_layers:
        raise ValueError(f"layout has {len(groups)} layers, the model {num_layers}")
    heads_total = sum(b.heads for b in banks)
    L = tokens_per_chunk
    cap_limit = None if ret.max_history_tokens is None else ret.max_history_tokens + L
    cache = _Cache(banks, cap_limit)
    out = KVTimeline(open_slot=sum(batch * b.heads * L * slot_bytes for b in banks))
    rows: dict[int, dict[int, int]] = {id(b): {} for b in banks}  # bank -> chunk -> rows still stored
    stored: dict[int, int] = {id(b): 0 for b in banks}  # bank -> rows in the host store (retrieval)

    def step(chunk: int, committed: int, target: _Cache) -> None:
        """One chunk: stored rows restored, its calls write the slot, it is committed, the method compacts
        (moving the chunk leaving the window into the store)."""
        restored = {id(b): min(ret.restore_tokens, stored[id(b)]) for b in target.banks}
        if any(restored.values()):
            target.write_slot(0, restored)  # Bank.insert reserves the restored rows first
            for bank in target.banks:
                bank.n += restored[id(bank)]
        out.staging_peak = max(out.staging_peak, max(
            sum((b.n + L) * b.row for b in target.banks if b.layer == layer) for layer in range(num_layers)))
        target.write_slot(L, held=out.open_slot)  # a quantized bank grows at its commit, every slot written
        target.note(extra=target.gather(L) + out.open_slot)
        for bank in target.banks:
            bank.n += L
            rows[id(bank)][chunk] = L
        keep = {}
        for bank in target.banks:
            chunk_len = rows[id(bank)]
            before = dict(chunk_len)
            leaving = chunk - ret.recent_chunks
            if not ret.window_only and ret.budget_pr is None and ret.token_budget is None and \
                    bank.max_tokens is None and leaving >= ret.sink_chunks and leaving in chunk_len:
                chunk_len[leaving] = round(ret.keep_fraction * chunk_len[leaving])
            keep[id(bank)] = _bank_rows_after(bank, ret, committed, chunk, chunk_len, heads_total)
            budget = ret.budget_pr is not None or ret.token_budget is not None
            _settle_rows(chunk_len, keep[id(bank)], ret, chunk, leaving if budget else None)
            if ret.stored_per_chunk is not None and leaving >= ret.sink_chunks and leaving in before:
                stored[id(bank)] += min(ret.stored_per_chunk, before[leaving])
            changed = [c for c in sorted(before) if chunk_len[c] < before[c]]
            if changed and bank.base:
                target.own_from(bank, sum(n for c, n in before.items() if c < changed[0]))
        target.compact(keep)
        out.store_peak = max(out.store_peak, sum(stored[id(b)] * b.row for b in target.banks))

    committed = 0
    for chunk in range(context_chunks):
        committed += L
        step(chunk, committed, cache)
        out.after_chunk.append(cache.allocated())
    if context_chunks:
        block = max(b.heads * head_dim * batch * dtype_bytes for b in banks)
        cache.note(extra=REINDEX_TRANSIENT * min(REINDEX_BLOCK_BYTES // block * block,
                                                  max(b.n for b in banks) * block))
    out.prefill_peak = cache.peak
    out.prefilled_alloc, out.prefilled_stored = cache.allocated(), cache.stored()

    def continuation(share: bool) -> tuple[_Cache, int, list[int]]:
        """A fork (KVCache.fork / Bank.headroom_for: every bank gets room for the continuation; shared:
        reading the prefilled rows in place) and the continuation's chunks."""
        headroom = continuation_chunks * L
        fork_banks = []
        for bank in banks:
            rows_wanted = bank.n + max(headroom, L)
            if bank.max_tokens is not None:
                rows_wanted = min(rows_wanted, max(bank.n, bank.max_tokens) + L)
            if cap_limit is not None:
                rows_wanted = min(rows_wanted, max(bank.n, cap_limit))
            fork_banks.append(_Bank(bank.layer, bank.heads, bank.row, bank.max_tokens, bank.n, rows_wanted,
                                    bank.n if share else 0))
            rows[id(fork_banks[-1])] = dict(rows[id(bank)])
            stored[id(fork_banks[-1])] = stored[id(bank)]
        fork = _Cache(fork_banks, cap_limit)
        fork.note()
        allocated = fork.allocated()
        after = []
        total = committed
        for j in range(continuation_chunks):
            total += L
            step(context_chunks + j, total, fork)
            after.append(fork.allocated())
        return fork, allocated, after

    parked, out.parked_fork, _ = continuation(share=False)
    out.parked_continuation_peak = parked.peak
    shared, out.fork, out.continuation_after_chunk = continuation(share=True)
    out.continuation_peak = shared.peak
    out.host_peak = max(out.prefill_peak, out.prefilled_stored + out.continuation_peak)
    return out


def _settle_rows(chunk_len: dict[int, int], n: int, ret: Retention, newest: int, leaving: int | None = None) -> None:
    """Reduce the per-chunk row counts to total ``n``, taking from unprotected chunks: the chunk
    ``leaving`` the recent window first (a budget decides only that one), then oldest first (bounded
    memory evicts unscored rows in order). The counts are exact either way; the order decides which
    prefilled chunks a task's fork copies."""
    excess = sum(chunk_len.values()) - n
    for chunk in sorted(chunk_len, key=lambda c: (c != leaving, c)):
        if excess <= 0:
            break
        if chunk < ret.sink_chunks or chunk > newest - ret.recent_chunks:
            continue
        take = min(excess, chunk_len[chunk])
        chunk_len[chunk] -= take
        excess -= take
