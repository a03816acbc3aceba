"""The pruning-ratio ledger (paper Eq. 4) and peak stored KV bytes.

For every chunk ``i`` denoised, layer ``l`` and head ``h``: ``k[i, l, h]`` = history tokens physically
visible to that head, ``k_full[i]`` = history tokens FullKV would hold (every committed token); the
chunk being denoised is excluded from both. ``PR = 1 - sum k / sum k_full`` over the ledger's chunks,
layers and heads. One ledger per phase: the context (prefill) and each task's continuation are kept
apart; the mean over tasks belongs to the report.

A method that moves history off the device (a cache with a :class:`HostStore`) brings tokens back into
the banks before a chunk's first model call; the ledger records right after that, so restored tokens
count as visible. It also keeps the peak bytes held in the store and the bytes moved between host and
device in the phase (both ways).
"""

from __future__ import annotations

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
    """

    chunk: int
    frame_start: int
    visible: torch.Tensor
    full: int

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

    def record(self, cache) -> LedgerEntry:
        """Log what the open chunk of ``cache`` sees (call right after ``begin_chunk``)."""
        info = cache.current
        if info is None:
            raise RuntimeError("the ledger records an open chunk; call begin_chunk first")
        entry = LedgerEntry(info.index, info.frame_start, cache.visible_counts(), cache.committed_tokens)
        self.entries.append(entry)
        return entry

    def note_memory(self, cache) -> None:
        """Update the peaks of stored K/V bytes on the device and in the host store, and the bytes moved
        between them so far (call after each commit, before compaction, and after compaction)."""
        self.peak_stored_bytes = max(self.peak_stored_bytes, cache.stored_bytes())
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

    def summary(self) -> dict:
        """JSON-ready: phase, PR, totals, peak bytes and one row per chunk."""
        return {
            "phase": self.phase,
            "pruning_ratio": self.pruning_ratio(),
            "visible_tokens": self.visible_total,
            "full_tokens": self.full_total,
            "peak_stored_bytes": self.peak_stored_bytes,
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
