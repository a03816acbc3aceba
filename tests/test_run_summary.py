"""``summary.json`` (:func:`cmbench.runs.summary.summarise`): every field's name, count and mean, by hand."""

from __future__ import annotations

import pytest

from cmbench.runs.records import SCHEMA_VERSION, TaskRecord
from cmbench.runs.summary import summarise


def _records() -> list[TaskRecord]:
    """Five expected tasks a..e (e never recorded), plus z, which is not expected.

    a failed first, then succeeded (the last record wins); c succeeded without a score, pr, detection
    rate or quality; d failed.
    """
    return [
        TaskRecord("a", "failed", error="oom", source="real", task_type="revisit"),
        TaskRecord("b", "ok", source="real", task_type="new", metric="DINO", score=0.25, pr=0.75,
                   detection_rate=0.5, subject_consistency=0.25, code_hash="h0", kv_bytes_ratio=0.25,
                   peak_kv_bytes=100, fullkv_peak_kv_bytes=400, mean_kv_bytes=50.0, fullkv_kv_bytes=200.0,
                   quality_absent={"imaging_quality": "no weights"}),
        TaskRecord("z", "ok", source="other", task_type="other", metric="light", score=1.0, pr=0.0,
                   detection_rate=0.0, code_hash="h9", quality_absent={"motion_smoothness": "z's"}),
        TaskRecord("a", "ok", source="real", task_type="revisit", metric="DINO", score=0.5, pr=0.25,
                   detection_rate=1.0, subject_consistency=0.75, code_hash="h1", kv_bytes_ratio=0.75,
                   peak_kv_bytes=300, fullkv_peak_kv_bytes=400, mean_kv_bytes=150.0, fullkv_kv_bytes=200.0,
                   peak_store_bytes=7, moved_bytes_per_chunk=2.0,
                   quality_absent={"aesthetic_quality": "no package"}),
        TaskRecord("c", "ok", source="synthetic", task_type="revisit", metric="DINO", code_hash=None),
        TaskRecord("d", "failed", error="boom", source="real", task_type="new", score=0.75, pr=0.0,
                   detection_rate=1.0, code_hash="h1", kv_bytes_ratio=1.0, peak_kv_bytes=999),
    ]


def test_summary_fields_counts_and_means():
    """The whole summary: a's failed first record is superseded, z is left out, e is missing, d's
    numbers (a failed record) count nowhere; means over a (0.5) and b (0.25) only, c has no score."""
    summary = summarise(_records(), ["a", "b", "c", "d", "e", "a"], code_hash="h1")
    assert summary == {
        "schema_version": SCHEMA_VERSION,
        "metric": "DINO",
        "tasks_expected": 5,                # a listed twice counts once
        "tasks_recorded": 4,                # a b c d
        "tasks_ok": 3,                      # a b c
        "tasks_failed": 1,                  # d
        "failed_task_ids": ["d"],
        "missing_task_ids": ["e"],
        "score": pytest.approx(0.375),      # (0.5 + 0.25) / 2
        "score_all_tasks": pytest.approx(0.15),  # (0.5 + 0.25) / 5 expected tasks
        "detection_rate": pytest.approx(0.75),   # (1.0 + 0.5) / 2
        "pr": pytest.approx(0.5),           # (0.25 + 0.75) / 2
        "kv_bytes_ratio": pytest.approx(0.5),  # (0.75 + 0.25) / 2; d's 1.0 failed
        "peak_kv_bytes": 300,               # the largest of a's 300 and b's 100; d's 999 failed
        "fullkv_peak_kv_bytes": 400,
        "peak_kv_bytes_ratio": pytest.approx(0.75),  # 300 / 400
        "mean_kv_bytes": pytest.approx(100.0),       # (150 + 50) / 2
        "fullkv_kv_bytes": pytest.approx(200.0),
        "peak_store_bytes": 7,              # a only
        "moved_bytes_per_chunk": pytest.approx(2.0),
        "by_source": {"real": {"n": 2, "score": pytest.approx(0.375)}},   # c has no score: no group
        "by_type": {"new": {"n": 1, "score": pytest.approx(0.25)},
                    "revisit": {"n": 1, "score": pytest.approx(0.5)}},
        "quality": {"subject_consistency": pytest.approx(0.5)},  # (0.75 + 0.25) / 2; none of the others
        "quality_absent": {"aesthetic_quality": "no package", "imaging_quality": "no weights"},
        "code_hash": "h1",
        "tasks_other_code": 2,              # b (h0) and c (no hash); d is h1 but failed
        "other_code_task_ids": ["b", "c"],
    }
    assert list(summary["quality_absent"]) == ["aesthetic_quality", "imaging_quality"]
    assert list(summary["by_type"]) == ["new", "revisit"]


def test_summary_without_code_hash_has_no_code_fields():
    summary = summarise(_records(), ["a", "b"])
    assert not {"code_hash", "tasks_other_code", "other_code_task_ids"} & set(summary)
    assert summary["tasks_ok"] == 2 and summary["score"] == pytest.approx(0.375)
    assert summary["score_all_tasks"] == pytest.approx(0.375)


def test_summary_of_nothing_is_none_not_nan():
    """No expected task: counts 0, every mean None (not NaN, no division by zero), metric None."""
    summary = summarise([], [])
    assert summary == {
        "schema_version": SCHEMA_VERSION, "metric": None,
        "tasks_expected": 0, "tasks_recorded": 0, "tasks_ok": 0, "tasks_failed": 0,
        "failed_task_ids": [], "missing_task_ids": [],
        "score": None, "score_all_tasks": None, "detection_rate": None, "pr": None,
        "kv_bytes_ratio": None, "peak_kv_bytes": None, "fullkv_peak_kv_bytes": None, "peak_kv_bytes_ratio": None,
        "mean_kv_bytes": None, "fullkv_kv_bytes": None, "peak_store_bytes": None, "moved_bytes_per_chunk": None,
        "by_source": {}, "by_type": {}, "quality": {}, "quality_absent": {},
    }


def test_summary_of_only_failed_tasks():
    """Expected tasks that all failed: means None, score_all_tasks 0 (every task counts 0)."""
    records = [TaskRecord("x", "failed", error="e"), TaskRecord("y", "failed", error="e")]
    summary = summarise(records, ["y", "x"])
    assert summary["failed_task_ids"] == ["x", "y"]
    assert summary["tasks_failed"] == 2 and summary["tasks_ok"] == 0
    assert summary["score"] is None and summary["pr"] is None and summary["detection_rate"] is None
    assert summary["score_all_tasks"] == 0.0
    assert summary["metric"] is None


def test_summary_metric_names_every_metric_when_mixed():
    """Successful tasks scored by different metrics: their names, sorted, joined by ", "."""
    records = [TaskRecord("a", "ok", metric="light", score=0.5), TaskRecord("b", "ok", metric="DINO", score=0.5),
               TaskRecord("c", "ok", metric="light", score=0.5), TaskRecord("d", "failed", metric="other")]
    assert summarise(records, ["a", "b", "c", "d"])["metric"] == "DINO, light"
    assert summarise(records, ["a", "c"])["metric"] == "light"


def test_summary_quality_means_each_metric_over_the_tasks_that_carry_it():
    """A metric every successful task carries, one only some carry, one none carries (left out)."""
    records = [
        TaskRecord("a", "ok", score=0.5, subject_consistency=1.0, motion_smoothness=0.5),
        TaskRecord("b", "ok", score=0.5, subject_consistency=0.5),
        TaskRecord("c", "failed", error="e", subject_consistency=0.0, temporal_flickering=0.5),
    ]
    summary = summarise(records, ["a", "b", "c"])
    assert summary["quality"] == {"subject_consistency": pytest.approx(0.75), "motion_smoothness": pytest.approx(0.5)}
