"""The quality columns beside the memory score: leaderboard, markdown, summary, and the normalised
quality-vs-memory table and figure, recomputed by hand on a tiny fixture of records."""

from __future__ import annotations

import json
import math

import pytest

from cmbench.report import clustered_mean_ci
from cmbench.report.curves import (
    board_point,
    curve_table,
    normalised_points,
    quality_vs_memory_plot,
    quality_vs_memory_table,
)
from cmbench.report.leaderboard import leaderboard, load_runs, markdown_table
from cmbench.runs.records import TaskRecord
from cmbench.runs.summary import summarise


def write_run(path, label, rows):
    path.mkdir(parents=True)
    lines = []
    for task_id, score, flicker, subject in rows:
        lines.append(json.dumps({"task_id": task_id, "context_id": task_id[0], "source": "synthetic",
                                 "task_type": "reappear", "seed": 0, "label": label, "status": "ok", "score": score,
                                 "pr": 0.0 if label == "fullkv" else 0.9, "continuation_frames": 16,
                                 "continuation_seconds": 1.0, "scorer_hash": "s", "metric": "light",
                                 "temporal_flickering": flicker, "subject_consistency_light": subject,
                                 "quality_absent": {"imaging_quality": "no pyiqa"}}) + "\n")
    (path / "records.jsonl").write_text("".join(lines))
    return path


@pytest.fixture
def runs(tmp_path):
    full = write_run(tmp_path / "full", "fullkv", [("a1", 0.8, 0.96, 0.7), ("a2", 0.6, 0.98, 0.5), ("b1", 0.7, 0.97, 0.6)])
    deco = write_run(tmp_path / "deco", "random", [("a1", 0.4, 0.95, 0.7), ("a2", 0.2, 0.99, None),
                                                   ("b1", 0.3, 0.97, 0.5)])
    return full, deco


def test_leaderboard_has_each_quality_metric_beside_the_score(runs):
    board = leaderboard(load_runs(list(runs))).set_index("method")
    cols = list(board.columns)
    assert cols[cols.index("pr") + 1 : cols.index("pr") + 5] == [
        "temporal_flickering", "temporal_flickering_ci95", "subject_consistency_light", "subject_consistency_light_ci95"]
    assert "motion_smoothness" not in cols  # no record carries it
    mean, ci = clustered_mean_ci([0.95, 0.99, 0.97], ["a", "a", "b"])
    assert board.loc["random", "temporal_flickering"] == pytest.approx(mean) == pytest.approx(0.97)
    assert board.loc["random", "temporal_flickering_ci95"] == pytest.approx(ci)
    assert board.loc["random", "subject_consistency_light"] == pytest.approx(0.6)  # the task without it left out
    text = markdown_table(board.reset_index())
    assert "| Method | Temporal Flickering | Subject Consistency (light) |" in text
    assert f"| random | 0.9700 ± {ci:.4f} |" in text


def test_the_quality_table_writes_labels_as_text(tmp_path):
    """A label comes from someone's run folder: in the quality table too it is escaped, and its pipe adds no column."""
    hostile = "<b>x</b> | *y*"
    run = write_run(tmp_path / "h", hostile, [("a1", 0.5, 0.9, 0.6), ("a2", 0.4, 0.8, 0.5)])
    text = markdown_table(leaderboard(load_runs([run])))
    rows = [line for line in text.splitlines() if "x&lt;" in line or "<b>" in line]
    assert len(rows) == 2 and all(r.startswith("| &lt;b&gt;x&lt;/b&gt; \\| \\*y\\* |") for r in rows)
    assert rows[1].replace("\\|", "").count("|") == 4  # label, flickering, subject consistency


def test_summary_has_quality_means_and_absence_reasons(runs):
    full, _ = runs
    records = [TaskRecord.from_json(json.loads(line)) for line in (full / "records.jsonl").read_text().splitlines()]
    summary = summarise(records, ["a1", "a2", "b1"])
    assert summary["quality"] == {"temporal_flickering": pytest.approx(0.97), "subject_consistency_light": pytest.approx(0.6)}
    assert summary["quality_absent"] == {"imaging_quality": "no pyiqa"}


def test_quality_vs_memory_is_normalised_to_fullkv(runs, tmp_path):
    full, deco = runs
    (reference,) = leaderboard(load_runs([full])).to_dict("records")
    rows = [{"method": "random", "target_pr": 0.9, **board_point(r)} for r in leaderboard(load_runs([deco])).to_dict("records")]
    curves = curve_table(rows)
    (board,) = leaderboard(load_runs([deco])).to_dict("records")
    assert curves.loc[0, "temporal_flickering_ci_low"] == pytest.approx(
        board["temporal_flickering"] - board["temporal_flickering_ci95"])
    points = normalised_points(curves, board_point(reference), memory="light").set_index("metric")
    assert list(points.index) == ["light", "temporal_flickering", "subject_consistency_light"]
    assert points.loc["light", "value"] == pytest.approx(0.3 / 0.7)  # memory falls to 43% of FullKV
    assert points.loc["temporal_flickering", "value"] == pytest.approx(1.0)  # quality stays where FullKV is
    assert points.loc["light", "ci_high"] == pytest.approx(rows[0]["ci_high"] / 0.7)
    table = quality_vs_memory_table(points.reset_index()).set_index("metric")
    assert table.loc["light", "points"] == 1 and table.loc["light", "range_vs_fullkv"] == 0.0
    assert table.loc["light", "kind"] == "memory" and table.loc["temporal_flickering", "kind"] == "quality"
    assert math.isclose(table.loc["subject_consistency_light", "min_vs_fullkv"], 1.0)
    out = quality_vs_memory_plot(points.reset_index(), tmp_path / "q.png", "title")
    assert out.stat().st_size > 10_000
    assert list(curve_table([{"method": "m"}]).columns) == list(curve_table([]).columns)  # no quality: the base columns
