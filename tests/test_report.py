"""Leaderboard numbers recomputed by hand on a tiny fixture of records."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from cmbench.report import ReportError, clustered_mean_ci, read_records, write_reports
from cmbench.report.statistics import clustered_mean_se, clustered_t_test, seed_spread
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


T95_DF2 = 2.919985580353724  # Student t quantile, 0.95, two degrees of freedom (a 90% interval)


def test_cluster_robust_statistics_by_hand_on_unequal_contexts():
    values, contexts = [1.0, 2.0, 3.0, 6.0], ["a", "a", "b", "c"]
    # mean 3; residual sums per context -3, 0, +3; se^2 = 3/2 * 18 / 16 = 1.6875
    mean, se, g = clustered_mean_se(values, contexts)
    assert (mean, g) == (3.0, 3) and se == pytest.approx(math.sqrt(1.6875))
    assert clustered_mean_ci(values, contexts, level=0.9) == pytest.approx((3.0, T95_DF2 * math.sqrt(1.6875)))
    # t = 3 / se = 2.3094 on 2 degrees of freedom, two-sided; the sign of the difference does not matter
    assert clustered_t_test(values, contexts) == pytest.approx(0.1471971345775583)
    assert clustered_t_test([-v for v in values], contexts) == pytest.approx(0.1471971345775583)


def test_cluster_robust_statistics_without_spread_or_contexts():
    empty = clustered_mean_se([], [])
    assert math.isnan(empty[0]) and math.isnan(empty[1]) and empty[2] == 0
    one = clustered_mean_se([1.0, 3.0], ["a", "a"])
    assert one[0] == 2.0 and math.isnan(one[1]) and one[2] == 1
    assert clustered_mean_ci([1.0, 3.0], ["a", "a"])[0] == 2.0
    assert math.isnan(clustered_t_test([1.0, 3.0], ["a", "a"]))
    assert clustered_t_test([0.0, 0.0, 0.0], ["a", "b", "c"]) == 1.0  # no difference at all
    assert clustered_t_test([0.25, 0.25, 0.25], ["a", "b", "c"]) == 0.0  # one certain difference (exact in binary)


def test_seed_spread_is_the_sample_deviation_of_per_seed_means():
    assert seed_spread([0.5, 0.7, 0.6, 0.8], [0, 0, 1, 1]) == pytest.approx(math.sqrt(0.005))  # means 0.6 and 0.7
    assert seed_spread([0.5, 0.7, 0.6, 0.9], [0, 0, 1, 2]) == pytest.approx(math.sqrt(0.03))  # 0.6, 0.6, 0.9
    assert math.isnan(seed_spread([0.5, 0.7], [3, 3]))


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
    # no KV bytes nor attention cost in these records (—); the FPS ratio was not measured together (no machine): *
    assert "| decoprune | 0.6667 ± 0.2824 | 85.00% | — | — | 4.00x* | 32.0 |" in md
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
    assert "| broken | — | — | — | — | — | — | — | 1 | 0 | 4 |" in paths["leaderboard.md"].read_text()
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


# ------------------------------------------------------------------------------ seeds, comparisons, cost
MINE = {2: {"a1": 0.8, "a2": 0.6, "b1": 0.7, "b2": 0.5}, 3: {"a1": 0.9, "a2": 0.7, "b1": 0.5, "b2": 0.3}}
TASKS = ["a1", "a2", "b1", "b2"]


def seeded(label, task_id, score, run_seed, setup, **extra):
    """A record of global seed ``run_seed``: its task seed is shared by every method run with that seed."""
    return {**record(label, task_id, score, seed=10 * run_seed + TASKS.index(task_id)), "run_seed": run_seed,
            "setup_hash": setup, **extra}


@pytest.fixture
def seed_runs(tmp_path):
    """``mine`` (a plug-in) and ``fullkv``, each with seeds 2 and 3: four run directories."""
    folders = []
    for run_seed, scores in MINE.items():
        folders.append(write_run(tmp_path / f"mine_{run_seed}", [
            seeded("mine", t, s, run_seed, "S_mine", code={"method": "abc"}) for t, s in scores.items()]))
        folders.append(write_run(tmp_path / f"full_{run_seed}", [
            seeded("fullkv", t, 0.5, run_seed, "S_full") for t in TASKS]))
    return tmp_path, folders


def test_seeds_of_one_setup_are_one_row_with_their_spread_by_hand(seed_runs):
    tmp, folders = seed_runs
    paths = write_reports(folders, tmp / "report")  # the runs differ only in seed: not refused
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert sorted(board.index) == ["fullkv", "mine"]
    assert board.loc["mine", "seeds"] == 2 and board.loc["mine", "n_tasks"] == 8
    assert board.loc["mine", "score"] == pytest.approx(0.625)  # (2.6 + 2.4) / 8: every (task, seed) pair
    # per-seed means 0.65 and 0.60: sample std |0.65 - 0.60| / sqrt(2)
    assert board.loc["mine", "score_seed_std"] == pytest.approx(0.05 / math.sqrt(2), rel=1e-5)
    # residuals by context over both seeds: a +0.5, b -0.5; se^2 = 2/1 * 0.5 / 64
    assert board.loc["mine", "score_ci95"] == pytest.approx(T975_DF1 * 0.125, rel=1e-5)
    assert board.loc["fullkv", "score_seed_std"] == pytest.approx(0.0)
    by_seed = pd.read_csv(paths["leaderboard_by_seed.csv"]).set_index(["method", "seed"])
    assert by_seed.loc[("mine", 2), "score"] == pytest.approx(0.65)
    assert by_seed.loc[("mine", 3), "score"] == pytest.approx(0.6) and by_seed.loc[("mine", 3), "n_tasks"] == 4
    deltas = pd.read_csv(paths["paired_deltas.csv"]).set_index("method")
    # pairs on (task, seed): mine - 0.5 = .3 .1 .2 0 | .4 .2 0 -.2; mean .125, se .125 (t = 1, one df)
    assert deltas.loc["mine", ["wins", "ties", "losses", "n_pairs"]].tolist() == [5, 2, 1, 8]
    assert deltas.loc["mine", "delta_vs_fullkv"] == pytest.approx(0.125)
    assert deltas.loc["mine", "delta_ci95"] == pytest.approx(T975_DF1 * 0.125, rel=1e-5)
    assert deltas.loc["mine", "p_value"] == pytest.approx(0.5)  # P(|T| > 1) for Student t with 1 df
    md = paths["leaderboard.md"].read_text()
    assert "| mine | 0.6250 ± 1.5883 |" in md and f"| 2 (sd {0.05 / math.sqrt(2):.4f}) | 8 | 0 |" in md


def test_one_setup_cannot_hold_a_seed_twice_nor_seeds_of_different_tasks(seed_runs, tmp_path):
    tmp, folders = seed_runs
    copy = write_run(tmp / "mine_2_again", [seeded("mine", t, s, 2, "S_mine") for t, s in MINE[2].items()])
    with pytest.raises(ReportError, match=r"same setup \(mine\) with the same seed \[2\]"):
        write_reports([*folders, copy], tmp / "r1")
    short = write_run(tmp / "mine_4", [seeded("mine", t, 0.5, 4, "S_mine") for t in TASKS[:2]])
    with pytest.raises(ReportError, match="the seeds of mine cover different tasks"):
        write_reports([*folders, short], tmp / "r2")


def test_method_vs_method_comparisons_by_hand(seed_runs):
    tmp, folders = seed_runs
    other = [write_run(tmp / f"other_{s}", [seeded("other", t, 0.6, s, "S_other") for t in TASKS]) for s in (2, 3)]
    paths = write_reports([*folders, *other], tmp / "report", focus=["mine"])
    compared = pd.read_csv(paths["comparisons.csv"]).set_index(["method", "versus"])
    # the focus against every other method on the board
    assert sorted(compared.index) == [("mine", "fullkv"), ("mine", "other")]
    row = compared.loc[("mine", "fullkv")]
    assert row["delta"] == pytest.approx(0.125) and row["p_value"] == pytest.approx(0.5)
    assert row[["wins", "ties", "losses", "n_pairs"]].tolist() == [5, 2, 1, 8]
    assert row["test"] == "cluster-robust paired t-test"
    row = compared.loc[("mine", "other")]  # mine - 0.6 = .2 0 .1 -.1 | .3 .1 -.1 -.3; mean .025
    assert row["delta"] == pytest.approx(0.025)
    assert row[["wins", "ties", "losses"]].tolist() == [4, 1, 3]
    # residuals: a: .175 -.025 .275 .075 = .5, b: .075 -.125 -.125 -.325 = -.5 -> se .125, t = 0.2, one df
    assert row["delta_ci95"] == pytest.approx(T975_DF1 * 0.125, rel=1e-5)
    assert row["p_value"] == pytest.approx(1 - 2 * math.atan(0.2) / math.pi)  # Student t, 1 df: Cauchy
    md = paths["leaderboard.md"].read_text()
    # the table's tests are one family: p 0.5 adjusted to 1; the interval spans far past the margin: not resolved
    assert "| mine | fullkv | +0.1250 ± 1.5883 | 0.5 | 1 | not resolved against fullkv | 5 / 2 / 1 | 8 |" in md
    named = write_reports([*folders, *other], tmp / "named", focus=[], compare=["other", "fullkv"])
    assert pd.read_csv(named["comparisons.csv"])[["method", "versus"]].values.tolist() == [["other", "fullkv"]]
    with pytest.raises(ReportError, match=r"leaderboard.focus: no method 'mien' on this board. Did you mean 'mine'"):
        write_reports(folders, tmp / "bad", focus=["mien"])
    with pytest.raises(ReportError, match="is not a pair of methods"):
        write_reports(folders, tmp / "bad", compare=[["mine", "fullkv", "other"]])
    assert "comparisons.csv" not in write_reports(folders[1::2], tmp / "none")  # FullKV alone: nothing to compare


def test_the_headline_speed_up_is_the_attention_cost_and_fps_says_when_it_was_measured_apart(tmp_path):
    second = 1_000_000_000

    def timed(label, flops, start, machine="host / cpu"):
        return [{**record(label, t, 0.5, seconds=1.0 if label == "fullkv" else 0.25), "attention_flops": flops,
                 "attention_keys_per_token": flops / 10, "machine": machine,
                 "recorded_ns": (start + 2 * i + 1) * second} for i, t in enumerate(TASKS)]

    full = write_run(tmp_path / "full", timed("fullkv", 400.0, 1000))
    together = write_run(tmp_path / "a", timed("a", 100.0, 1003))  # overlaps fullkv's [1000 s, 1007 s]
    later = write_run(tmp_path / "b", timed("b", 50.0, 5000))
    elsewhere = write_run(tmp_path / "c", timed("c", 80.0, 1002, machine="other / gpu"))
    paths = write_reports([full, together, later, elsewhere], tmp_path / "report")
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert board.loc["a", "cost_speedup_vs_fullkv"] == pytest.approx(4.0)  # 1600 / 400 FLOPs
    assert board.loc["b", "cost_speedup_vs_fullkv"] == pytest.approx(8.0)
    assert board.loc["a", "attention_keys_per_token"] == pytest.approx(10.0)
    assert board.loc["a", "speedup_vs_fullkv"] == pytest.approx(4.0)  # 64 frames in 1 s vs 4 s
    assert board["fps_measured_together"].to_dict() == {"fullkv": True, "a": True, "b": False, "c": False}
    md = paths["leaderboard.md"].read_text()
    assert "| a | 0.5000 ± 0.0000 | 0.00% | — | 4.00x | 4.00x | 64.0 |" in md
    assert "| b | 0.5000 ± 0.0000 | 0.00% | — | 8.00x | 4.00x* | 64.0 |" in md and "`*`: not measured together" in md


def test_a_run_shows_its_current_label_and_flags_records_from_other_code(tmp_path):
    run = write_run(tmp_path / "r", [{**record("old_name", t, 0.5), "code_hash": "c1" if t != "b2" else "c0"}
                                     for t in TASKS])
    (run / "run.json").write_text(json.dumps({"label": "new_name", "code_hash": "c1"}))
    paths = write_reports([run], tmp_path / "report")
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert list(board.index) == ["new_name"] and board.loc["new_name", "other_code_tasks"] == 1
    md = paths["leaderboard.md"].read_text()
    assert "| new_name † |" in md and "computed by other code" in md
    assert set(read_records(run).frame["label"]) == {"new_name"}


def test_runs_sharing_a_label_are_told_apart_by_what_differs_in_their_configs(tmp_path, capsys):
    runs = []
    for reindex in ("true", "false"):
        run = write_run(tmp_path / f"x_{reindex}", [{**record("x", t, 0.5), "setup_hash": reindex} for t in TASKS])
        (run / "config.yaml").write_text(f"seed: 0\ngeneration:\n  rope_reindex: {reindex}\n  reindex_recent: 8\n")
        runs.append(run)
    board = pd.read_csv(write_reports(runs, tmp_path / "report")["leaderboard.csv"])
    assert sorted(board["method"]) == ["x[generation.rope_reindex=false]", "x[generation.rope_reindex=true]"]
    assert "2 different setups are labelled 'x'" in capsys.readouterr().err


def test_a_new_leaderboard_removes_the_files_of_an_older_one_it_does_not_write(seed_runs):
    """(A refused leaderboard keeps the previous one whole: tests/test_leaderboard_trust.py.)"""
    tmp, folders = seed_runs
    out = tmp / "board"
    first = write_reports(folders, out)
    assert "comparisons.csv" in first and (out / "leaderboard.md").is_file()
    second = write_reports(folders, out, focus=[])  # nothing to compare now: the old comparisons must go
    assert "comparisons.csv" not in second and not (out / "comparisons.csv").exists()
    assert not list(tmp.glob(".board.tmp-*"))


def test_the_pareto_plot_says_what_it_plots(runs, monkeypatch):
    import matplotlib.axes

    titles = []
    real = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, t, *a, **k: titles.append(t) or real(self, t))
    tmp, full, deco = runs
    write_reports([full, deco], tmp / "report")
    assert titles == ["CMBench: Score score vs pruning ratio"]


def test_methods_with_different_seeds_are_refused_naming_the_seeds(seed_runs):
    tmp, folders = seed_runs
    one_seed = write_run(tmp / "other_2", [seeded("other", t, 0.6, 2, "S_other") for t in TASKS])
    with pytest.raises(ReportError, match=r"runs differ in seeds: .* has \['3'\] that .*other_2 \(other\) lacks"):
        write_reports([*folders, one_seed], tmp / "r")


def test_one_run_given_twice_is_refused(runs):
    tmp, full, _ = runs
    with pytest.raises(ReportError, match=r"several runs share a method label \(fullkv\) and nothing tells them apart"):
        write_reports([full, full], tmp / "twice")


@pytest.mark.parametrize("order", ["worse_first", "better_first"])
def test_rows_are_sorted_best_score_first(runs, order):
    """DeCoPrune (0.667) ranks above FullKV (0.65) in the CSV and the markdown, whatever order the runs come in."""
    tmp, full, deco = runs
    given = [full, deco] if order == "worse_first" else [deco, full]
    paths = write_reports(given, tmp / f"report_{order}")
    assert pd.read_csv(paths["leaderboard.csv"])["method"].tolist() == ["decoprune", "fullkv"]
    md = paths["leaderboard.md"].read_text()
    assert md.index("| decoprune |") < md.index("| fullkv |")


def test_the_board_shows_the_mean_or_the_max_of_the_references(tmp_path):
    """Records carry both aggregations; ``reference_aggregation`` picks which the board shows; records
    from before ``reference_aggregates`` are re-aggregated from their ``reference_scores``."""
    rows = [dict(record("m", "a1", 0.5), reference_scores=[0.2, 0.8], reference_aggregation="mean",
                 reference_aggregates={"mean": 0.5, "max": 0.8}),
            dict(record("m", "b1", 0.3), reference_scores=[0.3], reference_aggregation="mean")]
    run = write_run(tmp_path / "m", rows)
    shown = {}
    for how in (None, "mean", "max"):
        paths = write_reports([run], tmp_path / f"board_{how}", reference_aggregation=how)
        shown[how] = pd.read_csv(paths["leaderboard.csv"]).set_index("method").loc["m", "score"]
    assert shown[None] == pytest.approx(0.4) and shown["mean"] == pytest.approx(0.4)
    assert shown["max"] == pytest.approx(0.55)  # (0.8 + 0.3) / 2
    with pytest.raises(ReportError, match="must be one of mean, max"):
        write_reports([run], tmp_path / "bad", reference_aggregation="median")
    bare = write_run(tmp_path / "bare", [record("b", "a1", 0.5)])
    with pytest.raises(ReportError, match="task a1: its record has no reference_scores"):
        write_reports([bare], tmp_path / "bare_board", reference_aggregation="max")


def test_ranking_shift_between_mean_and_max_by_hand(tmp_path):
    from cmbench.benchmarks.reference_aggregation import ranking_shift

    def refs(label, task_id, scores):
        return dict(record(label, task_id, sum(scores) / len(scores)), reference_scores=scores)

    steady = write_run(tmp_path / "steady", [refs("steady", "a1", [0.6, 0.6]), refs("steady", "b1", [0.6])])
    spiky = write_run(tmp_path / "spiky", [refs("spiky", "a1", [0.2, 0.9]), refs("spiky", "b1", [0.6])])
    table, summary = ranking_shift([steady, spiky])
    by = table.set_index("method")
    assert by.loc["steady", "score_mean"] == pytest.approx(0.6) and by.loc["spiky", "score_mean"] == pytest.approx(0.575)
    assert by.loc["spiky", "score_max"] == pytest.approx(0.75)
    assert by.loc["steady", "rank_mean"] == 1 and by.loc["steady", "rank_max"] == 2
    assert summary == {"methods": 2, "tasks": 2, "multi_reference_tasks": 1, "moved": 2, "max_rank_change": 1,
                       "kendall_tau": pytest.approx(-1.0)}
