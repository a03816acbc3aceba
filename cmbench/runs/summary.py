"""``summary.json``: counts and means of a folder's task records, the same for ``run`` and ``score``."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

import numpy as np

from cmbench.runs.records import QUALITY_FIELDS, SCHEMA_VERSION, TaskRecord, latest_records


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def kv_bytes_summary(ok: list[TaskRecord]) -> dict[str, Any]:
    """The device bytes of the KV cache over successful tasks, beside the PR.

    Returns
    -------
    dict
        ``kv_bytes_ratio``: the mean over tasks of each task's bytes over FullKV's (FullKV: 1);
        ``peak_kv_bytes`` and ``fullkv_peak_kv_bytes``: the largest over tasks, and ``peak_kv_bytes_ratio``
        their ratio (the memory a run needs against FullKV's); ``mean_kv_bytes`` and ``fullkv_kv_bytes``:
        means over tasks; ``peak_store_bytes`` (largest) and ``moved_bytes_per_chunk`` (mean) where the
        method offloads. Each None when no task reports it.
    """
    def values(name: str) -> list[float]:
        return [float(getattr(r, name)) for r in ok if getattr(r, name) is not None]

    def peak(name: str) -> int | None:
        found = values(name)
        return int(max(found)) if found else None

    peak_bytes, full_peak = peak("peak_kv_bytes"), peak("fullkv_peak_kv_bytes")
    return {
        "kv_bytes_ratio": _mean(values("kv_bytes_ratio")),
        "peak_kv_bytes": peak_bytes,
        "fullkv_peak_kv_bytes": full_peak,
        "peak_kv_bytes_ratio": peak_bytes / full_peak if peak_bytes is not None and full_peak else None,
        "mean_kv_bytes": _mean(values("mean_kv_bytes")),
        "fullkv_kv_bytes": _mean(values("fullkv_kv_bytes")),
        "peak_store_bytes": peak("peak_store_bytes"),
        "moved_bytes_per_chunk": _mean(values("moved_bytes_per_chunk")),
    }


def summarise(records: Iterable[TaskRecord], expected_task_ids: Iterable[str],
              code_hash: str | None = None) -> dict[str, Any]:
    """Counts and mean scores over the expected tasks (the last record of a task wins).

    Parameters
    ----------
    records : iterable of TaskRecord
        In time order (:func:`cmbench.runs.records.read_task_records`).
    expected_task_ids : iterable of str
        The tasks the summary is about; records of other tasks are left out.
    code_hash : str, optional
        The run's current code identity: successful records computed by other code are counted.

    Returns
    -------
    dict
        ``tasks_expected / _recorded / _ok / _failed``, ``failed_task_ids``, ``missing_task_ids``
        (expected, no record), ``metric``, ``score`` (mean over successful tasks),
        ``score_all_tasks`` (every expected task without a successful record counts 0),
        ``detection_rate``, ``pr`` (mean over successful tasks that report one, else None), the device
        bytes of the KV cache beside it (:func:`kv_bytes_summary`: ``kv_bytes_ratio``, peak and mean
        bytes, FullKV's, host-store bytes and bytes moved), and
        ``by_source`` / ``by_type``: ``{value: {"n": successful tasks, "score": mean}}``, ``quality``
        (each quality metric's mean over the successful tasks that carry it, VBench's names) and
        ``quality_absent`` (each absent metric's reason, from the latest record that gives one); with
        ``code_hash``, also ``code_hash``, ``tasks_other_code`` and ``other_code_task_ids``
        (successful records kept from other code: ``keep_other_code=true``).
    """
    latest = latest_records(records)
    expected = list(dict.fromkeys(expected_task_ids))
    rows = [latest[t] for t in expected if t in latest]
    ok = [r for r in rows if r.status == "ok"]
    scores = [float(r.score) for r in ok if r.score is not None]
    groups: dict[str, dict[str, list[float]]] = {"source": defaultdict(list), "task_type": defaultdict(list)}
    for r in ok:
        for key, group in groups.items():
            if r.score is not None:
                group[str(getattr(r, key))].append(float(r.score))
    metrics = sorted({r.metric for r in ok if r.metric})
    prs = [float(r.pr) for r in ok if r.pr is not None]
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "metric": metrics[0] if len(metrics) == 1 else (", ".join(metrics) or None),
        "tasks_expected": len(expected),
        "tasks_recorded": len(rows),
        "tasks_ok": len(ok),
        "tasks_failed": len(rows) - len(ok),
        "failed_task_ids": sorted(r.task_id for r in rows if r.status != "ok"),
        "missing_task_ids": sorted(set(expected) - set(latest)),
        "score": _mean(scores),
        "score_all_tasks": sum(scores) / len(expected) if expected else None,
        "detection_rate": _mean([float(r.detection_rate) for r in ok if r.detection_rate is not None]),
        "pr": _mean(prs),
        **kv_bytes_summary(ok),
        "by_source": {k: {"n": len(v), "score": _mean(v)} for k, v in sorted(groups["source"].items())},
        "by_type": {k: {"n": len(v), "score": _mean(v)} for k, v in sorted(groups["task_type"].items())},
    }
    absent: dict[str, str] = {}
    for r in ok:
        absent.update(r.quality_absent or {})
    summary["quality"] = {name: _mean([float(getattr(r, name)) for r in ok if getattr(r, name) is not None])
                          for name in QUALITY_FIELDS if any(getattr(r, name) is not None for r in ok)}
    summary["quality_absent"] = dict(sorted(absent.items()))
    if code_hash is not None:
        other = sorted(r.task_id for r in ok if r.code_hash != code_hash)
        summary.update(code_hash=code_hash, tasks_other_code=len(other), other_code_task_ids=other)
    return summary
