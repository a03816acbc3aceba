"""Leaderboard numbers recomputed by hand on a tiny fixture of records."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from cmbench.report import ReportError, clustered_mean_ci, read_records, write_reports
from cmbench.runs.records import RecordsError

T975_DF1 = 12.706204736174704  # Student t quantile, 0.975, one degree of freedom


def record(label, task_id, score, *, status="ok", pr=0.0, seconds=2.0, seed=0, scorer="s1"):
    context = task_id[0]
    return {
        "task_id": task_id,
        "context_id": context,
        "source": "synthetic" if context == "a" else "real",
        "task_type": "reappear" if task_id.endswith("1") else "revisit",
        "seed": seed,
        "label": label,
        "status": status,
        "score": score if status == "ok" else None,
        "pr": pr,
        "context_pr": pr / 2,
        "peak_kv_bytes": 1000 * (1 - pr),
        "continuation_seconds": seconds,
        "continuation_frames": 16,
        "scorer_hash": scorer,
    }


def write_run(path, records):
    path.mkdir(parents=True)
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def runs(tmp_path):
    full = write_run(
        tmp_path / "fullkv",
        [record("fullkv", t, s) for t, s in [("a1", 0.8), ("a2", 0.6), ("b1", 0.7), ("b2", 0.5)]],
    )
    deco = write_run(
        tmp_path / "deco",
        [
            record("decoprune", "a1", 0.9, pr=0.8, seconds=0.5),
            record("decoprune", "a2", 0.4, pr=0.9, seconds=0.5),
            record("decoprune", "b1", 0.7, pr=0.85, seconds=0.5),
            record("decoprune", "b2", None, status="failed"),
        ],
    )
    return tmp_path, full, deco


def test_clustered_ci_by_hand():
    mean, ci = clustered_mean_ci([0.8, 0.6, 0.7, 0.5], ["a", "a", "b", "b"])
    # residual sums per context: +0.10, -0.10; se^2 = 2/1 * 0.02 / 16 = 0.0025
    assert mean == pytest.approx(0.65)
    assert ci == pytest.approx(T975_DF1 * 0.05)
    assert math.isnan(clustered_mean_ci([1.0, 2.0], ["a", "a"])[1])


def test_leaderboard_numbers(runs):
    tmp, full, deco = runs
    paths = write_reports([full, deco], tmp / "report")
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert board.loc["fullkv", "score"] == pytest.approx(0.65)
    assert board.loc["fullkv", "score_ci95"] == pytest.approx(T975_DF1 * 0.05, rel=1e-5)
    assert board.loc["decoprune", "score"] == pytest.approx(2.0 / 3.0, rel=1e-5)
    # residual sums -1/30, +1/30; se^2 = 2 * (2/900) / 9
    assert board.loc["decoprune", "score_ci95"] == pytest.approx(T975_DF1 * math.sqrt(4 / 8100), rel=1e-5)
    assert board.loc["decoprune", "pr"] == pytest.approx(0.85)
    assert board.loc["decoprune", "context_pr"] == pytest.approx(0.425)
    # FPS on the paired tasks a1, a2, b1: FullKV 48 / 6 s = 8, DeCoPrune 48 / 1.5 s = 32
    assert board.loc["decoprune", "speedup_vs_fullkv"] == pytest.approx(4.0)
    assert board.loc["decoprune", "continuation_fps"] == pytest.approx(32.0)
    assert board.loc["fullkv", "speedup_vs_fullkv"] == pytest.approx(1.0)
    assert board.loc["decoprune", "n_tasks"] == 3 and board.loc["decoprune", "failures"] == 1
    assert board.loc["decoprune", "peak_kv_bytes"] == pytest.approx(1000 * (0.2 + 0.1 + 0.15) / 3)

    deltas = pd.read_csv(paths["paired_deltas.csv"]).set_index("method")
    assert deltas.loc["decoprune", "delta_vs_fullkv"] == pytest.approx(-1 / 30)
    assert deltas.loc["decoprune", "delta_ci95"] == pytest.approx(T975_DF1 * math.sqrt(4 / 8100), rel=1e-5)
    assert deltas.loc["decoprune", ["wins", "ties", "losses", "n_pairs"]].tolist() == [1, 1, 1, 3]

    by_source = pd.read_csv(paths["leaderboard_by_source.csv"]).set_index(["method", "source"])
    assert by_source.loc[("fullkv", "synthetic"), "score"] == pytest.approx(0.7)
    assert by_source.loc[("fullkv", "real"), "score"] == pytest.approx(0.6)
    assert by_source.loc[("decoprune", "real"), ["n_tasks", "failures"]].tolist() == [1, 1]
    assert math.isnan(by_source.loc[("decoprune", "real"), "score_ci95"])  # one context: no CI
    by_type = pd.read_csv(paths["leaderboard_by_type.csv"]).set_index(["method", "task_type"])
    assert by_type.loc[("fullkv", "reappear"), "score"] == pytest.approx(0.75)
    assert by_type.loc[("decoprune", "revisit"), "score"] == pytest.approx(0.4)

    md = paths["leaderboard.md"].read_text()
    assert "| decoprune | 0.6667 ± 0.2824 | 85.00% | 4.00x | 32.0 |" in md
    assert paths["pareto.png"].stat().st_size > 1000


def test_refuses_to_mix_seeds_or_scorers_unless_told(runs):
    tmp, full, _ = runs
    other = write_run(tmp / "other", [record("streaming", t, 0.3, seed=1) for t in ["a1", "a2", "b1", "b2"]])
    with pytest.raises(ReportError, match="runs differ in seeds"):
        write_reports([full, other], tmp / "r1")
    assert write_reports([full, other], tmp / "r2", allow_mixed=True)["leaderboard.csv"].exists()
    scorer = write_run(tmp / "sc", [record("streaming", t, 0.3, scorer="s2") for t in ["a1", "a2", "b1", "b2"]])
    with pytest.raises(ReportError, match="runs differ in scorer config"):
        write_reports([full, scorer], tmp / "r3")
    subset = write_run(tmp / "sub", [record("streaming", t, 0.3) for t in ["a1", "a2"]])
    with pytest.raises(ReportError, match="runs differ in task set"):
        write_reports([full, subset], tmp / "r4")


def test_last_record_of_a_task_wins_and_bad_lines_are_named(tmp_path):
    run = write_run(tmp_path / "r", [record("x", "a1", 0.1), record("x", "a1", 0.2)])
    assert read_records(run).frame["score"].tolist() == [0.2]
    (run / "records.jsonl").write_text('{"task_id": "a1"}\nnot json\n')
    with pytest.raises(RecordsError, match=r"records.jsonl:2: invalid JSON"):
        read_records(run)
