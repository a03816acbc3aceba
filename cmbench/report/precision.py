"""The precision a board counts bytes in: the cache precision of every entry, one per board.

A record names the precision its KV cache held its full-precision rows in (``cache_dtype``; a record without
the field is float32, written before it existed: :func:`cmbench.runs.records.record_cache_dtype`). FullKV's
bytes, the denominator of every ``kv_bytes_ratio``, are counted in that precision, so two entries whose caches
held different precisions are not on one bytes axis: a board refuses them, naming the entries of each, and
says its precision on every bytes column and figure (:func:`bytes_axis`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cmbench.report.reading import ReportError, RunRecords
from cmbench.runs.records import record_cache_dtype


def frame_precisions(frame: pd.DataFrame) -> list[str]:
    """The cache precisions of an entry's records (one row each), sorted: ``float32`` for a record without one."""
    column = frame["cache_dtype"] if "cache_dtype" in frame.columns else pd.Series([None] * len(frame), dtype=object)
    return sorted({record_cache_dtype({"cache_dtype": None if pd.isna(v) else v}) for v in column})


def board_precision(entries: Sequence[RunRecords]) -> str:
    """The one cache precision of a board's entries (``float32`` for a board of none).

    Raises
    ------
    ReportError
        Entries (or one entry's records) in more than one precision: one line naming the entries of each.
    """
    by_precision: dict[str, list[str]] = {}
    for entry in entries:
        for precision in frame_precisions(entry.frame):
            by_precision.setdefault(precision, []).append(entry.label)
    if len(by_precision) > 1:
        named = "; ".join(f"{p}: {', '.join(labels)}" for p, labels in sorted(by_precision.items()))
        raise ReportError(f"the entries' KV caches hold different precisions ({named}): their bytes count against "
                          f"FullKV in different precisions, so one board cannot compare them; run them with one "
                          f"cache.dtype")
    return next(iter(by_precision), "float32")


def bytes_axis(precision: str) -> str:
    """What a bytes ratio of a board in ``precision`` is relative to, as boards and figures name it."""
    return f"bytes relative to FullKV in {precision}"
