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


def test_paired_deltas_match_task_and_seed(tmp_path):
    """Two seeds per task: pairs are (task, seed); matching on the task alone would make 12 pairs."""
    full = {("a1", 0): 0.8, ("a1", 1): 0.6, ("a2", 0): 0.5, ("a2", 1): 0.7, ("b1", 0): 0.4, ("b1", 1): 0.9}
    other = {("a1", 0): 0.8, ("a1", 1): 0.7, ("a2", 0): 0.3, ("a2", 1): 0.7, ("b1", 0): 0.6, ("b1", 1): 0.5}
    runs = [write_run(tmp_path / label, [record(label, t, s, seed=seed) for (t, seed), s in scores.items()])
            for label, scores in (("fullkv", full), ("other", other))]
    paths = write_reports(runs, tmp_path / "report")
    deltas = pd.read_csv(paths["paired_deltas.csv"]).set_index("method")
    # deltas: a1/0 0, a1/1 +0.1, a2/0 -0.2, a2/1 0, b1/0 +0.2, b1/1 -0.4 -> mean -0.05
    assert deltas.loc["other", ["wins", "ties", "losses", "n_pairs"]].tolist() == [2, 2, 2, 6]
    assert deltas.loc["other", "delta_vs_fullkv"] == pytest.approx(-0.05)
    # residuals per context: a: 0.05 + 0.15 - 0.15 + 0.05 = 0.1, b: 0.25 - 0.35 = -0.1; se^2 = 2 * 0.02 / 36
    assert deltas.loc["other", "delta_ci95"] == pytest.approx(T975_DF1 * math.sqrt(0.04 / 36), rel=1e-5)
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert board.loc["other", "n_tasks"] == 6 and board.loc["other", "score"] == pytest.approx(3.6 / 6)


def failed_record(label, task_id, seed=0):
    """A failure as `run` wrote it before the typed record: no score, no PR, no timings."""
    return {"task_id": task_id, "context_id": task_id[0], "source": "synthetic", "task_type": "reappear",
            "seed": seed, "label": label, "status": "failed", "error": "RuntimeError: boom", "scorer_hash": "s1"}


def test_a_run_without_any_successful_task_is_reported_with_its_failures(runs):
    tmp, full, _ = runs
    broken = write_run(tmp / "broken", [failed_record("broken", t) for t in ("a1", "a2", "b1", "b2")])
    paths = write_reports([full, broken], tmp / "report")
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert board.loc["broken", "n_tasks"] == 0 and board.loc["broken", "failures"] == 4
    assert math.isnan(board.loc["broken", "score"]) and math.isnan(board.loc["broken", "pr"])
    assert list(board.index) == ["fullkv", "broken"]  # nothing measured sorts last
    assert "| broken | — | — | — | — | — | 0 | 4 |" in paths["leaderboard.md"].read_text()
    deltas = pd.read_csv(paths["paired_deltas.csv"]).set_index("method")
    assert deltas.loc["broken", "n_pairs"] == 0


def write_manifest_for(root, task_ids):
    from official_fixture import official_row, write_manifest

    write_manifest(root, [official_row(t, f"videos/{t[0]}.mp4") for t in task_ids])
    return root


def test_records_of_tasks_outside_the_manifest_are_left_out_and_impossible_values_refused(tmp_path, capsys):
    data = write_manifest_for(tmp_path / "data", ["a1", "a2", "b1", "b2"])
    rows = [record("x", t, s) for t, s in [("a1", 0.8), ("a2", 0.6), ("b1", 0.7), ("b2", 0.5)]]
    run = write_run(tmp_path / "x", [*rows, record("x", "zz_foreign", 1.0)])
    (run / "config.yaml").write_text(f"data:\n  root: {data}\n  manifest: metadata.jsonl\n")
    paths = write_reports([run], tmp_path / "report")
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert board.loc["x", "n_tasks"] == 4 and board.loc["x", "score"] == pytest.approx(0.65)
    assert "left out the records of 1 task(s) not in" in capsys.readouterr().err
    assert read_records(run).dropped == ("zz_foreign",)
    (run / "config.yaml").write_text(f"data:\n  root: {tmp_path / 'moved'}\n")
    write_reports([run], tmp_path / "report_unchecked")
    assert "metadata.jsonl is not there (run from another folder?): records not checked" in capsys.readouterr().err
    assert not read_records(run).checked and read_records(run).frame["task_id"].nunique() == 5
    with open(run / "records.jsonl", "a") as f:
        f.write(json.dumps(record("x", "a1", 3.4)) + "\n")
    with pytest.raises(RecordsError, match=r"x/records.jsonl:6: score: is 3.4, expected a similarity in \[-1, 1\]"):
        write_reports([run], tmp_path / "report2")


def test_score_outputs_stand_beside_runs_on_the_leaderboard(runs):
    """records.jsonl as `score` wrote it before the typed record (no seed, no label, no context,
    ``scorer_config_hash``) reads with its folder's manifest; the board names the metric."""
    tmp, full, _ = runs
    data = write_manifest_for(tmp / "data", ["a1", "a2", "b1", "b2"])
    scored = tmp / "videos_of_another_generator" / "scores_light"
    scored.mkdir(parents=True)
    old_rows = [{"status": "ok", "task_id": t, "source": "synthetic", "task_type": "reappear", "score": s,
                 "detection_rate": 1.0, "n_frames": 8, "scorer": "light", "scorer_config_hash": "s1"}
                for t, s in [("a1", 0.9), ("a2", 0.5), ("b1", 0.6)]]
    old_rows.append({"status": "failed", "task_id": "b2", "source": "real", "task_type": "revisit",
                     "error": "cannot open", "scorer": "light", "scorer_config_hash": "s1"})
    (scored / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old_rows))
    (scored / "summary.json").write_text(json.dumps({"videos": str(scored.parent), "data": {
        "name": "cmbench", "root": str(data), "manifest": "metadata.jsonl"}}))
    paths = write_reports([full, scored], tmp / "report")
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert board.loc["videos_of_another_generator", "score"] == pytest.approx(2.0 / 3.0)
    assert board.loc["videos_of_another_generator", "failures"] == 1
    assert math.isnan(board.loc["videos_of_another_generator", "pr"])
    deltas = pd.read_csv(paths["paired_deltas.csv"]).set_index("method")
    # paired on the task (the scored videos have no seed): a1 +0.1, a2 -0.1, b1 -0.1
    assert deltas.loc["videos_of_another_generator", ["wins", "ties", "losses", "n_pairs"]].tolist() == [1, 0, 2, 3]
    frame = read_records(scored).frame.set_index("task_id")
    assert frame.loc["a1", "context_id"] == "videos/a"  # filled from the manifest: clusters are right


def test_every_table_names_its_metric(tmp_path):
    dino = write_run(tmp_path / "d", [{**record("fullkv", t, 0.5), "metric": "DINO"} for t in ("a1", "b1")])
    paths = write_reports([dino], tmp_path / "report")
    assert paths["leaderboard.md"].read_text().startswith("| Method | DINO (95% CI) | PR |")
    for name in ("leaderboard.csv", "leaderboard_by_source.csv", "leaderboard_by_type.csv"):
        assert set(pd.read_csv(paths[name])["metric"]) == {"DINO"}, name
    unnamed = write_reports([write_run(tmp_path / "u", [record("fullkv", "a1", 0.5)])], tmp_path / "r2")
    assert unnamed["leaderboard.md"].read_text().startswith("| Method | Score (95% CI) |")
