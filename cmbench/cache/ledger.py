"""The pruning-ratio ledger (paper Eq. 4) and the device bytes of the KV cache against FullKV's.

For every chunk ``i`` denoised, layer ``l`` and head ``h``: ``k[i, l, h]`` = history tokens physically
visible to that head, ``k_full[i]`` = history tokens FullKV would hold (every committed token); the
chunk being denoised is excluded from both. ``PR = 1 - sum k / sum k_full`` over the ledger's chunks,
layers and heads. One ledger per phase: the context (prefill) and each task's continuation are kept
apart; the mean over tasks belongs to the report.

A method that moves history off the device (a cache with a :class:`HostStore`) brings tokens back into
the banks before a chunk's first model call; the ledger records right after that, so restored tokens
count as visible. It also keeps the peak bytes held in the store and the bytes moved between host and
device in the phase (both ways).

Device bytes: at every chunk the ledger also records the bytes the cache stores on the device
(``cache.stored_bytes()``: K/V in whatever format the banks keep them, scales, zero points, merge counts
and per-token metadata included) and FullKV's bytes at that chunk, computed, not run: FullKV stores
every committed token of every head in full precision, so its bytes are ``k_full`` (the chunk's
FullKV history tokens) x layers x heads x ``2 * head_dim * batch * itemsize`` (K and V of one token of
one head at the model's K/V element size, read from the banks' full-precision K). ``kv_bytes_ratio =
sum stored / sum FullKV`` over the phase's chunks: with full-precision storage it is ``1 - PR``
exactly; a quantized format lowers it at the same PR. The peak of FullKV's bytes (every committed
token, right after the last commit) is kept beside the measured peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class LedgerEntry:
    """Visibility when one chunk was denoised.

    Attributes
    ----------
    chunk, frame_start : int
        The chunk and its first latent frame.
    visible : Tensor, shape ``[num_layers, num_heads]``, long
        History tokens each head saw.
    full : int
        History tokens per head under FullKV.
    stored_bytes : int
        Bytes the cache stored on the device while the chunk was denoised (its history, restored tokens
        included; the chunk itself excluded).
    full_bytes : int
        FullKV's bytes at this chunk: ``full`` tokens of every head in full precision.
    """

    chunk: int
    frame_start: int
    visible: torch.Tensor
    full: int
    stored_bytes: int = 0
    full_bytes: int = 0

    @property
    def visible_total(self) -> int:
        return int(self.visible.sum())

    @property
    def full_total(self) -> int:
        return self.full * self.visible.numel()


@dataclass
class PRLedger:
    """Per-chunk visibility of one phase (``"context"`` or ``"generation"``) of one run."""

    phase: str
    entries: list[LedgerEntry] = field(default_factory=list)
    peak_stored_bytes: int = 0
    peak_store_bytes: int = 0
    moved_bytes: int = 0
    peak_full_bytes: int = 0
    heads: int = 0  # layers x heads of the model (the visible table's size), known from the first record

    def record(self, cache) -> LedgerEntry:
        """Log what the open chunk of ``cache`` sees and the bytes it stores (call right after
        ``begin_chunk``, after any restore)."""
        info = cache.current
        if info is None:
            raise RuntimeError("the ledger records an open chunk; call begin_chunk first")
        visible = cache.visible_counts()
        self.heads = visible.numel()
        full = cache.committed_tokens
        entry = LedgerEntry(info.index, info.frame_start, visible, full, cache.stored_bytes(),
                            full * self.heads * fp_bytes_per_head_token(cache) if full else 0)
        self.entries.append(entry)
        return entry

    def note_memory(self, cache) -> None:
        """Update the peaks of stored K/V bytes on the device and in the host store, FullKV's peak (every
        committed token), and the bytes moved between them so far (call after each commit, before
        compaction, and after compaction)."""
        self.peak_stored_bytes = max(self.peak_stored_bytes, cache.stored_bytes())
        committed = getattr(cache, "committed_tokens", 0)  # duck-typed caches without a timeline
        if committed and self.heads:
            self.peak_full_bytes = max(self.peak_full_bytes, committed * self.heads * fp_bytes_per_head_token(cache))
        if getattr(cache, "store", None) is not None:  # duck-typed caches without one
            peak, moved = cache.store_bytes()
            self.peak_store_bytes = max(self.peak_store_bytes, peak)
            self.moved_bytes = moved

    def moved_bytes_per_chunk(self) -> float:
        """Bytes moved host <-> device per chunk of the phase (0 with no chunk)."""
        return self.moved_bytes / len(self.entries) if self.entries else 0.0

    @property
    def visible_total(self) -> int:
        return sum(e.visible_total for e in self.entries)

    @property
    def full_total(self) -> int:
        return sum(e.full_total for e in self.entries)

    def pruning_ratio(self) -> float:
        """``1 - sum k / sum k_full``; ``nan`` when FullKV would have seen no history at all."""
        full = self.full_total
        return float("nan") if full == 0 else 1.0 - self.visible_total / full

    def mean_stored_bytes(self) -> float:
        """Device K/V bytes the phase's chunks were denoised with, averaged over its chunks (0 with none)."""
        return sum(e.stored_bytes for e in self.entries) / len(self.entries) if self.entries else 0.0

    def mean_full_bytes(self) -> float:
        """FullKV's device K/V bytes at the phase's chunks, averaged over them (0 with none)."""
        return sum(e.full_bytes for e in self.entries) / len(self.entries) if self.entries else 0.0

    def kv_bytes_ratio(self) -> float:
        """``sum stored bytes / sum FullKV bytes`` over the phase's chunks; ``nan`` when FullKV would have
        stored nothing."""
        full = sum(e.full_bytes for e in self.entries)
        return float("nan") if full == 0 else sum(e.stored_bytes for e in self.entries) / full

    def rows(self) -> list[list[int]]:
        """One row per chunk, ``[visible, full, stored_bytes, full_bytes]`` (tokens summed over layers and
        heads): what a record keeps of the ledger, from which its PR and bytes are recomputed
        (:func:`ledger_totals`)."""
        return [[e.visible_total, e.full_total, int(e.stored_bytes), int(e.full_bytes)] for e in self.entries]

    def summary(self) -> dict:
        """JSON-ready: phase, PR, totals, peak and mean bytes (``kv_bytes_ratio`` None when FullKV would
        have stored nothing) and one row per chunk."""
        return {
            "phase": self.phase,
            "pruning_ratio": self.pruning_ratio(),
            "visible_tokens": self.visible_total,
            "full_tokens": self.full_total,
            "peak_stored_bytes": self.peak_stored_bytes,
            "mean_stored_bytes": self.mean_stored_bytes(),
            "peak_full_bytes": self.peak_full_bytes,
            "mean_full_bytes": self.mean_full_bytes(),
            "kv_bytes_ratio": None if math.isnan(ratio := self.kv_bytes_ratio()) else ratio,
            "peak_store_bytes": self.peak_store_bytes,
            "moved_bytes": self.moved_bytes,
            "moved_bytes_per_chunk": self.moved_bytes_per_chunk(),
            "chunks": [
                {
                    "chunk": e.chunk,
                    "frame_start": e.frame_start,
                    "visible": e.visible_total,
                    "full": e.full_total,
                    "min_head": int(e.visible.min()),
                    "max_head": int(e.visible.max()),
                }
                for e in self.entries
            ],
        }


def fp_bytes_per_head_token(cache) -> int:
    """FullKV's device bytes for one token of one head: K and V, ``2 * head_dim * batch * itemsize``,
    at the size of the model's K/V elements (read from a bank's full-precision ``k``: whatever format a
    bank stores its history in, the chunk it denoises is written in the model's precision).

    Raises
    ------
    RuntimeError
        No bank of ``cache`` has written full-precision K/V yet.
    """
    for bank in cache.all_banks():
        size = bank.model_element_bytes()  # a quantized bank stores codes, its chunk the model's precision
        if bank.k is not None and size is not None:
            return 2 * cache.head_dim * int(bank.k.shape[0]) * size
    raise RuntimeError("FullKV's bytes per token are unknown: no bank of the cache holds full-precision K/V yet")


def ledger_totals(rows: list[list[int]]) -> dict[str, float | None]:
    """A phase's PR and device bytes from its :meth:`PRLedger.rows`, as :meth:`PRLedger.summary` computes
    them: ``pruning_ratio`` and ``kv_bytes_ratio`` (None where FullKV would hold nothing),
    ``mean_stored_bytes`` and ``mean_full_bytes`` (0 with no chunk)."""
    visible, full, stored, full_bytes = (sum(row[i] for row in rows) for i in range(4))
    chunks = len(rows)
    return {
        "pruning_ratio": None if full == 0 else 1.0 - visible / full,
        "kv_bytes_ratio": None if full_bytes == 0 else stored / full_bytes,
        "mean_stored_bytes": stored / chunks if chunks else 0.0,
        "mean_full_bytes": full_bytes / chunks if chunks else 0.0,
    }
