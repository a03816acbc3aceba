"""The records files of a run directory: append-only JSON lines, durable, shard-aware.

A single process writes ``records.jsonl``; shard ``i`` of ``n`` writes
``records.shard-i-of-n.jsonl``. Readers take every ``records*.jsonl`` of the directory together, so
sharded, resumed and single-process runs read back the same way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from cmbench.errors import CMBenchError

RECORDS = "records.jsonl"
SHARD_RECORDS = "records.shard-{index}-of-{count}.jsonl"


class RecordsError(CMBenchError):
    """A records file cannot be read."""


def records_path(run_dir: Path, count: int = 1, index: int = 0) -> Path:
    """Where a process (shard ``index`` of ``count``) appends its records."""
    return Path(run_dir) / (RECORDS if count == 1 else SHARD_RECORDS.format(index=index, count=count))


def read_all_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of every records file of a run, in file order (files sorted by name)."""
    rows = []
    for path in sorted(Path(run_dir).glob("records*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise RecordsError(f"{path}:{number}: invalid JSON ({err.msg})") from err
    return rows


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class RecordWriter:
    """Appends one JSON line per record, flushed and fsync'd before :meth:`write` returns.

    A process killed mid-write can leave a torn last line; opening the writer cuts it off, so the
    task it belonged to simply runs again.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            data = self.path.read_bytes()
            if data and not data.endswith(b"\n"):
                with open(self.path, "r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, default=_json_default) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
