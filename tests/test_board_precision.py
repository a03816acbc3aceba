"""A board never mixes cache precisions: the leaderboard refuses entries whose records name different
``cache_dtype`` (one line naming the entries of each), names the one precision its bytes are relative to, and
reads a record without the field as float32 (older code)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cmbench.report import write_reports
from cmbench.report.reading import ReportError


def run(root: Path, label: str, dtype: str | None) -> Path:
    path = root / label
    path.mkdir()
    rows = [{"task_id": t, "context_id": t, "source": "synthetic", "task_type": "reappear", "seed": 0,
             "label": label, "status": "ok", "score": 0.5 + 0.1 * i, "pr": 0.5, "peak_kv_bytes": 2e6,
             "kv_bytes_ratio": 0.5, "continuation_seconds": 1.0, "continuation_frames": 16, "scorer_hash": "s",
             **({} if dtype is None else {"cache_dtype": dtype})} for i, t in enumerate(("a1", "b1"))]
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_entries_of_two_precisions_are_refused_in_one_line_naming_them(tmp_path):
    runs = [run(tmp_path, "fullkv", "bfloat16"), run(tmp_path, "decoprune", "bfloat16"),
            run(tmp_path, "streaming", None)]
    with pytest.raises(ReportError) as err:
        write_reports(runs, tmp_path / "board", allow_mixed=True)  # never allowed, even with allow_mixed
    assert str(err.value) == (
        "the entries' KV caches hold different precisions (bfloat16: fullkv, decoprune; float32: streaming): their "
        "bytes count against FullKV in different precisions, so one board cannot compare them; run them with one "
        "cache.dtype")
    assert not (tmp_path / "board").exists() or not any((tmp_path / "board").iterdir())


def test_a_board_of_one_precision_names_it_beside_its_bytes(tmp_path):
    paths = write_reports([run(tmp_path, "fullkv", "bfloat16"), run(tmp_path, "decoprune", "bfloat16")],
                          tmp_path / "board")
    board = pd.read_csv(paths["leaderboard.csv"])
    assert set(board["cache_dtype"]) == {"bfloat16"}
    assert "bytes relative to FullKV in bfloat16" in paths["leaderboard.md"].read_text()


def test_records_without_the_field_are_float32(tmp_path):
    paths = write_reports([run(tmp_path, "fullkv", None), run(tmp_path, "decoprune", "float32")], tmp_path / "board")
    assert set(pd.read_csv(paths["leaderboard.csv"])["cache_dtype"]) == {"float32"}
    assert "bytes relative to FullKV in float32" in paths["leaderboard.md"].read_text()
