"""The precision a board counts bytes in: the cache precision of every entry, one per board.

A record names the precision its KV cache held its full-precision rows in (``cache_dtype``; a record without
the field is float32, written before it existed: :func:`cmbench.runs.records.record_cache_dtype`). FullKV's
bytes, the denominator of every ``kv_bytes_ratio``, are counted in that precision, so two entries whose caches
held different precisions are not on one bytes axis: a board refuses them, naming the entries of each
(:func:`cmbench.report.reading.board_precision`), and says its precision on every bytes column and figure
(:func:`bytes_axis`).
"""

from __future__ import annotations

import pandas as pd

from cmbench.runs.records import record_cache_dtype


def frame_precisions(frame: pd.DataFrame) -> list[str]:
    """The cache precisions of an entry's records (one row each), sorted: ``float32`` for a record without one."""
    column = frame["cache_dtype"] if "cache_dtype" in frame.columns else pd.Series([None] * len(frame), dtype=object)
    return sorted({record_cache_dtype({"cache_dtype": None if pd.isna(v) else v}) for v in column})


def bytes_axis(precision: str) -> str:
    """What a bytes ratio of a board in ``precision`` is relative to, as boards and figures name it."""
    return f"bytes relative to FullKV in {precision}"
