"""The method contract: small dataclasses that decide which history tokens to keep.

A method never touches keys or values itself. After every chunk, :mod:`cmbench.generation` calls
:meth:`Method.after_chunk`; the method writes its per-token decisions into the cache
(:meth:`KVCache.mark`: keep flags and priorities), then the cache physically compacts every bank by
the method's :meth:`Method.select` and, where a size limit applies, evicts the lowest priorities.
A method may also act in :meth:`Method.before_clean`, while a chunk is open, right before its
``t = 0`` pass (DeCoPrune's delayed compaction).

Retrieval methods keep evicted history off the device: :meth:`Method.host_store` gives the cache a
:class:`HostStore`, compaction moves rows there (``cache.compact(select, to_store=True)``), and
:meth:`Method.before_denoise`, called with a chunk open before its first model call, brings chosen
stored tokens back (``cache.restore``); the compaction after the chunk can send them out again.

Shared mechanics (every method):

- the *sink*: chunks ``0 .. sink_chunks - 1`` are never pruned;
- the *recent window*: the newest :meth:`Method.window` chunks stay dense (``recent_chunks`` unless a
  method delays its compaction); a chunk is compacted with its keep flags when it leaves the window;
- *bounded memory* (``max_history_tokens``): a hard cap on history tokens per head; when full, the
  lowest-priority unprotected tokens are evicted first (ties: oldest first).

Score-based methods (:class:`ScoredMethod`) add *quota mode*: ``quota_pr`` or ``quota_tokens``
replaces the method's own keep rule. Each chunk is decided once, when it leaves the recent window
(where the method's own rule would compact it): of that chunk's tokens, the highest-priority ones are
kept, as many as the budget leaves room for next to what is already held. A decided chunk is never
pruned again, so a larger budget keeps every token a smaller one keeps (same priorities). Only
``max_history_tokens`` re-evicts already-kept tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from cmbench.cache import AttentionStats, Bank, ChunkInfo, HeadGroup, HostStore, KVCache, uniform_layout
from cmbench.cache.kv_cache import BankSelector
from cmbench.errors import ConfigError
from cmbench.method_family import DECLARED
from cmbench.methods.knobs import Knob, check_knobs
from cmbench.parallel.cache import model_totals


@dataclass(frozen=True)
class Needs:
    """Signals a method asks the generation loop for.

    Attributes
    ----------
    probe_step : int or None
        Keep the ``x0`` prediction of this denoising step (generated chunks) and run the re-noise probe
        at that step's level on observed context chunks.
    no_context_probe : bool
        Also predict at the probe step with no history (one extra call per chunk).
    post_prune_probe : bool
        Predict at the probe step against the cache as it will be after the next compaction (one extra
        call per generated chunk; the context probe itself uses that cache).
    attention_chunk : int or None
        Record attention mass per source frame at this chunk (timeline index, context chunks first):
        at the ``t = 0`` pass of a context chunk, at the first denoising call of a generated chunk;
        over the keys of :meth:`Method.attention_key_frames`. It reaches the method in
        ``ChunkSignals.attention``.
    query_probe : bool
        Before every chunk's first model call, run that call once more in a probe (no trace) and hand
        each layer's mean query, and every query, to :meth:`Method.before_denoise` (one extra call per chunk).
    poses : bool
        The method needs the camera pose of every latent frame (``BeforeChunk.poses``); a run on data
        without poses is refused.
    """

    probe_step: int | None = None
    no_context_probe: bool = False
    post_prune_probe: bool = False
    attention_chunk: int | None = None
    query_probe: bool = False
    poses: bool = False


@dataclass(kw_only=True)
class ChunkSignals:
    """What a method sees when a chunk has been committed (built with keyword arguments only).

    Attributes
    ----------
    geometry : Geometry
        Of the backbone (``tokenize`` groups latent values by token).
    chunk : ChunkInfo
        The committed chunk.
    phase : {"context", "generation"}
    generated_index : int or None
        Index of the chunk within the continuation (``None`` for context chunks).
    context_frames : int
        Latent frames of the context (``q0``).
    seed : int
        The run's seed (the context's in prefill, the task's in continuation).
    x0_final : Tensor, shape ``[B, C, f, h, w]``
        The clean chunk (observed for context chunks, the final prediction for generated ones).
    x0_probe : Tensor or None
        ``x0`` at the probe step (re-noise probe for context chunks).
    x0_no_context : Tensor or None
        ``x0`` at the probe step predicted with no history.
    previous_final : Tensor or None, shape ``[B, C, f', h, w]``
        The previous chunk's clean latents.
    attention : AttentionStats or None
        Recorded when ``Needs.attention_chunk`` names this chunk (context or generated).
    """

    geometry: Any
    chunk: ChunkInfo
    phase: str
    generated_index: int | None
    context_frames: int
    seed: int
    x0_final: torch.Tensor
    x0_probe: torch.Tensor | None = None
    x0_no_context: torch.Tensor | None = None
    previous_final: torch.Tensor | None = None
    attention: AttentionStats | None = None


@dataclass(kw_only=True)
class BeforeChunk:
    """What a method sees before a chunk's first model call (built with keyword arguments only).

    Attributes
    ----------
    geometry : Geometry
    chunk : ChunkInfo
        The open chunk.
    phase : {"context", "generation"}
    poses : Tensor or None, shape ``[F, 4, 4]``, float64
        Camera-to-world pose of every latent frame of the timeline (when ``Needs.poses``).
    queries : dict of int to Tensor or None
        ``layer -> [B, H, D]``: the chunk's mean rotated query at its first model call, measured in a
        probe (when ``Needs.query_probe``).
    probe_queries : dict of int to Tensor or None
        ``layer -> [B, L, H, D]``: every rotated query of that probe (the chunk's ``L`` tokens), for a method
        that needs more than their mean (a softmax per query); let go after :meth:`Method.before_denoise`.
    """

    geometry: Any
    chunk: ChunkInfo
    phase: str
    poses: torch.Tensor | None = None
    queries: dict[int, torch.Tensor] | None = None
    probe_queries: dict[int, torch.Tensor] | None = None


@dataclass
class Method:
    """Base class: sink + recent window + bounded memory; keeps everything else unless overridden.

    Parameters
    ----------
    sink_chunks : int
        Leading chunks never pruned.
    recent_chunks : int
        Newest committed chunks kept dense.
    max_history_tokens : int or None
        Hard cap on history tokens per head (bounded memory); ``None`` for no cap.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""  # one line: what the method keeps (``ls method``, the README table)
    paper: ClassVar[str] = ""  # URL of the method's paper ("" if none)
    paper_title: ClassVar[str] = ""  # how the tables cite it, e.g. "StreamingLLM, arXiv 2309.17453"
    # the method's own knob that sets its pruning ratio (``python -m cmbench calibrate``); None: it has none
    knob: ClassVar[Knob | None] = None
    # its family of KV compression (cmbench.method_family.DECLARED: eviction, retrieval, merging, low-rank, none);
    # recorded in every record of its runs, read by boards and figures ("": undeclared, shown as "other")
    family: ClassVar[str] = ""

    knob_minimums: ClassVar[dict[str, float]] = {"sink_chunks": 0, "recent_chunks": 0, "max_history_tokens": 0}

    sink_chunks: int = 1
    recent_chunks: int = 1
    max_history_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.family and self.family not in DECLARED:
            raise ConfigError(f"method {self.name or type(self).__qualname__!r}: family {self.family!r} is not one of "
                              f"{', '.join(DECLARED)}")
        check_knobs(self)

    # ------------------------------------------------------------------ what the loop asks
    def needs(self) -> Needs:
        """Signals this method wants (none by default)."""
        return Needs()

    def layout(self, geometry) -> list[list[HeadGroup]]:
        """Head groups per layer (default: one bank per layer, capped by ``max_history_tokens``)."""
        return uniform_layout(geometry.num_layers, geometry.num_heads, "all", self.max_history_tokens)

    def window_size(self, geometry) -> int:
        """History tokens per head of the sink plus the recent window (capped by ``max_history_tokens``)."""
        size = (self.sink_chunks + self.recent_chunks) * geometry.tokens_per_chunk
        return size if self.max_history_tokens is None else min(size, self.max_history_tokens)

    def knobs(self) -> dict[str, Any]:
        """The dataclass fields and values (written into result records)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # ------------------------------------------------------------------ decisions
    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        """Write keep flags / priorities of the new chunk into the cache (default: keep all)."""

    def window(self, bank: Bank | None = None) -> int:
        """Chunks that stay dense in ``bank`` counting back from the newest (default ``recent_chunks``);
        ``bank=None``: in the banks the method scores (what memory planning assumes)."""
        return self.recent_chunks

    def protected(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        """Sink or recent-window rows of ``bank`` when ``newest`` is the newest chunk, ``bool [n]``."""
        chunk = bank.field("chunk")
        return (chunk < self.sink_chunks) | (chunk > newest.index - self.window(bank))

    def attention_key_frames(self, geometry, chunk: ChunkInfo) -> tuple[int, ...] | None:
        """Source frames whose keys the attention recorded at ``chunk`` covers (``None``: all visible)."""
        return None

    def before_clean(self, cache: KVCache, chunk: ChunkInfo) -> None:
        """Called with ``chunk`` open, after its denoising calls and probes, right before its ``t = 0``
        pass writes the clean K/V (default: nothing)."""

    def host_store(self) -> HostStore | None:
        """The store evicted history may move to (default: none; evicted rows are deleted)."""
        return None

    def before_denoise(self, cache: KVCache, sig: BeforeChunk) -> None:
        """Called with ``sig.chunk`` open before its first model call (and before the ledger records
        what it sees): e.g. ``cache.restore`` of stored tokens (default: nothing)."""

    def rule(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        """The method's own keep rule over ``bank``'s history, ``bool [n]`` (default: keep flags)."""
        return self.protected(bank, newest) | bank.field("keep")

    def select(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        """What the compaction after chunk ``newest`` keeps, ``bool [n]``."""
        return self.rule(bank, newest)

    def selector(self, cache: KVCache, newest: ChunkInfo, incoming: int = 0) -> BankSelector:
        """The compaction with ``newest`` the newest chunk, as a bank selector (default: :meth:`select`).

        ``incoming``: tokens of an open chunk the next chunk will also see (a compaction while
        ``newest`` is open); 0 after a commit.
        """
        return lambda bank: self.select(bank, newest)

    def limits(self, cache: KVCache, newest: ChunkInfo) -> dict[int, int]:
        """``id(bank) -> most history tokens`` after compaction (default: the hard cap, if any)."""
        if self.max_history_tokens is None:
            return {}
        return {id(b): self.max_history_tokens for b in cache.all_banks()}

    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        """Decide for the committed chunk, compact every bank, then enforce size limits."""
        self.decide(cache, sig)
        newest = sig.chunk
        cache.compact(self.selector(cache, newest))
        self._enforce_limits(cache, newest)

    def probe_hide(self, cache: KVCache):
        """Selector of the history rows the next compaction will drop (for the post-prune probe)."""
        newest = cache.current
        assert newest is not None, "the post-prune probe runs while a chunk is open"
        select = self.selector(cache, newest, newest.length)
        return lambda bank: ~select(bank)

    def _enforce_limits(self, cache: KVCache, newest: ChunkInfo) -> None:
        limits = self.limits(cache, newest)
        masks: dict[int, torch.Tensor] = {}
        for bank in cache.all_banks():
            limit = limits.get(id(bank))
            if limit is None or bank.n <= limit:
                continue
            masks[id(bank)] = self._evict_lowest(bank, bank.n - limit, newest)
        if masks:
            cache.compact(lambda bank: masks.get(id(bank), torch.ones(bank.n, dtype=torch.bool)))

    def _evict_lowest(self, bank: Bank, excess: int, newest: ChunkInfo) -> torch.Tensor:
        """Keep mask ``bool [n]`` dropping the ``excess`` lowest-priority unprotected rows."""
        candidates = (~self.protected(bank, newest)).nonzero().squeeze(1)
        if len(candidates) < excess:
            if self.max_history_tokens is not None and bank.n - len(candidates) > self.max_history_tokens:
                raise ConfigError(
                    f"{self.name}: max_history_tokens={self.max_history_tokens} is smaller than the sink and "
                    f"recent window ({bank.n - len(candidates)} tokens per head); raise it or shrink the windows"
                )
            excess = len(candidates)
        order = torch.sort(bank.field("priority")[candidates], stable=True).indices[:excess]
        keep = torch.ones(bank.n, dtype=torch.bool)
        keep[candidates[order]] = False
        return keep


@dataclass
class ScoredMethod(Method):
    """A method that scores tokens; adds quota mode.

    Quota mode decides each chunk once, when it leaves the recent window (``window(bank)`` chunks
    back from the newest): of that chunk's rows in a budgeted bank it keeps the ``k`` highest
    priorities (ties: the earlier row), where ``k`` is what the budget leaves after everything else
    the next chunk will see (the sink, the chunks decided before, the dense window), between 0 and the
    chunk's length. Chunks decided before are kept as they are: a budget never evicts a kept token to
    make room for a newer one (only ``max_history_tokens`` does). With the same priorities, a larger
    budget therefore keeps a superset of what a smaller one keeps, chunk by chunk.

    Parameters
    ----------
    quota_pr : float or None
        Quota mode: the next chunk sees ``(1 - quota_pr)`` of what FullKV would (per head, summed
        over budgeted banks; banks the budget does not apply to count as they are). Realised exactly
        once the allowance exceeds the sink and the dense window; before that, every chunk leaving
        the window gets nothing and the PR is lower than the target.
    quota_tokens : int or None
        Quota mode: at most this many history tokens per budgeted head (filled in arrival order: once
        full, chunks leaving the window keep nothing).
    """

    knob_minimums: ClassVar[dict[str, float]] = {"quota_pr": 0, "quota_tokens": 0}

    quota_pr: float | None = None
    quota_tokens: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.quota_pr is not None and self.quota_tokens is not None:
            raise ConfigError(f"{self.name}: give quota_pr or quota_tokens, not both")
        if self.quota_pr is not None and not 0.0 <= self.quota_pr < 1.0:
            raise ConfigError(f"{self.name}: quota_pr must be in [0, 1), got {self.quota_pr}")

    @property
    def quota_mode(self) -> bool:
        return self.quota_pr is not None or self.quota_tokens is not None

    def budgeted(self, bank: Bank) -> bool:
        """Whether this bank's tokens are chosen by score (all banks by default)."""
        return True

    def scored_banks(self, cache: KVCache) -> list[Bank]:
        return [b for b in cache.all_banks() if self.budgeted(b)]

    def selector(self, cache: KVCache, newest: ChunkInfo, incoming: int = 0) -> BankSelector:
        """:meth:`select` on every bank, or in quota mode :meth:`budget_keep` on the budgeted ones."""
        if not self.quota_mode:
            return super().selector(cache, newest)
        allowance = self.allowance(cache, newest, incoming)
        return lambda bank: (self.budget_keep(bank, newest, allowance, incoming) if self.budgeted(bank)
                             else self.select(bank, newest))

    def allowance(self, cache: KVCache, newest: ChunkInfo, incoming: int = 0) -> int:
        """History tokens per budgeted head the next chunk may see.

        ``quota_tokens``; or ``(1 - quota_pr)`` of FullKV's history (committed tokens plus
        ``incoming``) over all heads, less what the banks the budget does not apply to will hold after
        this compaction, shared evenly by the budgeted heads.
        """
        if self.quota_tokens is not None:
            return self.quota_tokens
        assert self.quota_pr is not None
        banks = list(cache.all_banks())
        fixed = sum((int(self.select(b, newest).sum()) + incoming) * b.num_heads for b in banks if not self.budgeted(b))
        scored = sum(b.num_heads for b in banks if self.budgeted(b))
        # every head of the model: a split cache's counts are summed over its ranks
        heads, fixed, scored = model_totals(cache, sum(b.num_heads for b in banks), fixed, scored)
        target = (1.0 - self.quota_pr) * (cache.committed_tokens + incoming) * heads
        return max(0, round((target - fixed) / max(1, scored)))

    def budget_keep(self, bank: Bank, newest: ChunkInfo, allowance: int, incoming: int = 0) -> torch.Tensor:
        """Quota mode's keep mask ``bool [n]`` of a budgeted bank when ``newest`` is the newest chunk.

        Every row is kept but those of the chunk leaving the window now (``newest.index -
        window(bank)``, unless it is a sink chunk), of which the ``k`` highest priorities stay:
        ``k = clamp(allowance - (rows the next chunk sees besides that chunk), 0, its rows)``.
        """
        keep = torch.ones(bank.n, dtype=torch.bool)
        leaving = newest.index - self.window(bank)
        if leaving < self.sink_chunks:
            return keep
        rows = (bank.field("chunk") == leaving).nonzero().squeeze(1)
        k = min(max(allowance - (bank.n - len(rows) + incoming), 0), len(rows))
        order = torch.sort(bank.field("priority")[rows], descending=True, stable=True).indices
        keep[rows[order[k:]]] = False
        return keep


def finite_priority(score: torch.Tensor) -> torch.Tensor:
    """``score`` with non-finite entries set to ``+inf`` (never evicted before a finite score)."""
    return torch.where(torch.isfinite(score), score, torch.full_like(score, float("inf")))
