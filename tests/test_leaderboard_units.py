"""The leaderboard's pieces one at a time, on hand-made records with hand-computed numbers: every column of
``leaderboard.csv`` (score, CI, PR, speed-ups on the paired tasks only, FPS, memory, host store, seeds, quality),
the per-source / per-task-type / per-seed breakdowns, paired deltas and comparisons (direction, wins / ties /
losses, pairing keys), which pairs are compared and the messages for bad ones, when two speeds count as
"measured together", the markdown (every cell's format, the notes, escaping of labels), the Pareto plot, and
the writing of a board: row order, atomic replacement of the previous board, its messages, the refill of
"Score @ 85% PR"."""

from __future__ import annotations

import math
import os
import re

import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg
import pandas as pd
import pytest

from cmbench.report import ReportError, read_records
from cmbench.report import leaderboard as lb
from cmbench.report.board_folder import board_folder
from test_backbone_gate import FLAT, GOOD, gate_runs
from test_report import T975_DF1, TASKS, record, seeded, write_run

SECOND = 1_000_000_000
NAN = math.nan


def entry(tmp_path, label, rows):
    """One leaderboard entry read from a run folder holding ``rows``.

    Parameters
    ----------
    tmp_path : Path
        Where the folder ``<label>`` is made.
    label : str
    rows : list of dict
        Task records (:func:`test_report.record` and overrides).

    Returns
    -------
    RunRecords
    """
    return read_records(write_run(tmp_path / label, rows))


def full_rows():
    """FullKV on a1 a2 b1 b2: scores 0.8 0.6 0.7 0.5, 1 2 3 4 s of 16 frames each, 100 200 300 400 FLOPs."""
    return [{**record("fullkv", t, s, seconds=sec), "attention_flops": flops}
            for t, s, sec, flops in [("a1", 0.8, 1.0, 100.0), ("a2", 0.6, 2.0, 200.0), ("b1", 0.7, 3.0, 300.0),
                                     ("b2", 0.5, 4.0, 400.0)]]


def method_rows(label="m"):
    """A compressing method: a1 a2 b1 succeed (scores 0.9 0.4 0.7, PR 0.8 0.9 0.7), b2 failed."""
    rows = []
    for t, s, pr, sec, flops, keys, store in [("a1", 0.9, 0.8, 0.5, 25.0, 10.0, 1e6), ("a2", 0.4, 0.9, 0.5, 50.0, 20.0, 3e6),
                                              ("b1", 0.7, 0.7, 1.0, 100.0, 30.0, None)]:
        rows.append({**record(label, t, s, pr=pr, seconds=sec), "attention_flops": flops,
                     "attention_keys_per_token": keys, "peak_store_bytes": store, "moved_bytes_per_chunk": 5e5})
    rows.append({**record(label, "b2", None, status="failed"), "attention_keys_per_token": 99.0,
                 "peak_store_bytes": 9e6, "moved_bytes_per_chunk": 9e6})  # a failure's numbers count nowhere
    return rows


@pytest.fixture
def pair(tmp_path):
    """``(fullkv, m)`` entries (see :func:`full_rows`, :func:`method_rows`)."""
    return entry(tmp_path, "fullkv", full_rows()), entry(tmp_path, "m", method_rows())


# ------------------------------------------------------------------------------------------ leaderboard()
COLUMNS = ["method", "metric", "score", "score_ci95", "pr", "kv_bytes_ratio", "context_pr", "speedup_vs_fullkv", "continuation_fps",
           "peak_kv_bytes", "n_tasks", "failures", "cost_speedup_vs_fullkv", "attention_keys_per_token",
           "fps_measured_together", "seeds", "score_seed_std", "other_code_tasks", "task_count", "unshared_tasks",
           "psnr_vs_fullkv",
           "ssim_vs_fullkv", "last_frame_psnr_vs_fullkv", "last_frame_ssim_vs_fullkv", "frame_count_flags",
           "suspect_tasks", "peak_store_bytes", "moved_bytes_per_chunk", "family", "cache_dtype"]


def test_every_column_of_a_method_and_of_fullkv_by_hand(pair):
    full, m = pair
    board = lb.leaderboard([m, full])  # FullKV is found by its label, not by its place
    assert list(board.columns) == COLUMNS
    assert board["method"].tolist() == ["m", "fullkv"]  # leaderboard() keeps the given order; write_reports sorts
    row = board.iloc[0].to_dict()
    # m: scores 0.9 (a), 0.4 (a), 0.7 (b): mean 2/3; residual sums per context -1/30, +1/30:
    # se^2 = 2/1 * (2/900) / 9 = 4/8100
    assert row["score"] == pytest.approx(2 / 3)
    assert row["score_ci95"] == pytest.approx(T975_DF1 * math.sqrt(4 / 8100))
    assert row["pr"] == pytest.approx(0.8) and row["context_pr"] == pytest.approx(0.4)  # (0.8+0.9+0.7)/3, halves
    # FPS: m 48 frames / 2 s = 24; FullKV on the tasks both finished (a1 a2 b1) 48 / 6 s = 8, not its 64 / 10 s
    assert row["continuation_fps"] == pytest.approx(24.0) and row["speedup_vs_fullkv"] == pytest.approx(3.0)
    assert row["cost_speedup_vs_fullkv"] == pytest.approx(600 / 175)  # (100+200+300) / (25+50+100) FLOPs
    assert row["peak_kv_bytes"] == pytest.approx(200.0)  # 1000 * (0.2 + 0.1 + 0.3) / 3: the failure's 1000 left out
    assert row["attention_keys_per_token"] == pytest.approx(20.0)
    assert row["peak_store_bytes"] == pytest.approx(2e6) and row["moved_bytes_per_chunk"] == pytest.approx(5e5)
    assert (row["n_tasks"], row["failures"], row["seeds"], row["other_code_tasks"]) == (3, 1, 1, 0)
    assert row["fps_measured_together"] is False  # the records do not say where they ran
    assert math.isnan(row["score_seed_std"]) and row["metric"] == "Score"
    assert row["family"] is None  # records written without the family (tests/test_method_family.py: with it)
    assert row["cache_dtype"] == "float32"  # records written without the cache precision: float32
    assert row["suspect_tasks"] == 0  # no task of m broke continuity
    ref = board.iloc[1].to_dict()
    assert ref["score"] == pytest.approx(0.65) and ref["score_ci95"] == pytest.approx(T975_DF1 * 0.05)
    assert ref["continuation_fps"] == pytest.approx(6.4)  # 64 frames / 10 s
    assert ref["speedup_vs_fullkv"] == pytest.approx(1.0) and ref["cost_speedup_vs_fullkv"] == pytest.approx(1.0)
    assert ref["fps_measured_together"] is True and (ref["n_tasks"], ref["failures"]) == (4, 0)
    assert ref["peak_kv_bytes"] == pytest.approx(1000.0) and ref["pr"] == 0.0
    for name in ("attention_keys_per_token", "peak_store_bytes", "moved_bytes_per_chunk"):
        assert math.isnan(ref[name]), name


def test_without_fullkv_there_is_no_speed_up(pair):
    _, m = pair
    row = lb.leaderboard([m]).iloc[0]
    assert math.isnan(row["speedup_vs_fullkv"]) and math.isnan(row["cost_speedup_vs_fullkv"])
    assert row["fps_measured_together"] is None and row["continuation_fps"] == pytest.approx(24.0)


def test_speed_ups_are_blank_when_nothing_can_be_divided(tmp_path, pair):
    full, _ = pair
    # no seconds at all: no FPS (not infinity); zero FLOPs: no cost ratio (not infinity)
    instant = entry(tmp_path, "instant", [{**record("instant", t, 0.5, seconds=0.0), "attention_flops": 0.0}
                                          for t in TASKS])
    # one task without a FLOP count: the sums would compare different task sets
    partial = entry(tmp_path, "partial", [{**r, "label": "partial", "attention_flops": None if r["task_id"] == "b2"
                                           else r["attention_flops"] / 4} for r in full_rows()])
    broken = entry(tmp_path, "broken", [record("broken", t, None, status="failed") for t in TASKS])
    board = lb.leaderboard([full, instant, partial, broken]).set_index("method")
    assert math.isnan(board.loc["instant", "continuation_fps"]) and math.isnan(board.loc["instant", "speedup_vs_fullkv"])
    assert math.isnan(board.loc["instant", "cost_speedup_vs_fullkv"])
    assert math.isnan(board.loc["partial", "cost_speedup_vs_fullkv"])
    assert board.loc["partial", "speedup_vs_fullkv"] == pytest.approx(1.0)  # same seconds as FullKV
    assert math.isnan(board.loc["broken", "speedup_vs_fullkv"]) and math.isnan(board.loc["broken", "score"])
    assert math.isnan(board.loc["broken", "score_seed_std"]) and board.loc["broken", "failures"] == 4
    # FullKV missing a FLOP count where the entry has one: no ratio either
    gappy_full = entry(tmp_path / "g", "fullkv", [{**r, "attention_flops": None} if r["task_id"] == "a1" else r
                                                  for r in full_rows()])
    other = entry(tmp_path / "g", "other", [{**r, "label": "other"} for r in full_rows()])
    assert math.isnan(lb.leaderboard([gappy_full, other]).set_index("method").loc["other", "cost_speedup_vs_fullkv"])


def test_speed_ups_count_only_the_tasks_fullkv_finished_too(tmp_path):
    full = entry(tmp_path, "fullkv", [*full_rows()[:3], record("fullkv", "b2", None, status="failed")])
    slow_b2 = {**record("m", "b2", 0.5, seconds=10.0), "attention_flops": 1000.0}
    row = lb.leaderboard([full, entry(tmp_path, "m", [*method_rows()[:3], slow_b2])]).iloc[1]
    # on a1 a2 b1: 48 frames / 2 s = 24 against FullKV's 48 / 6 s = 8, FLOPs 600 / 175; b2 (10 s, 1000 FLOPs) left out
    assert row["speedup_vs_fullkv"] == pytest.approx(3.0) and row["cost_speedup_vs_fullkv"] == pytest.approx(600 / 175)
    assert row["continuation_fps"] == pytest.approx(64 / 12)  # its own FPS is over all its tasks


def test_seeds_and_their_spread_and_the_per_seed_table(tmp_path):
    from test_report import MINE

    rows = [seeded("m", t, s, run_seed, "S") for run_seed, scores in MINE.items() for t, s in scores.items()]
    run = entry(tmp_path, "m", rows)
    row = lb.leaderboard([run]).iloc[0]
    # per-seed means 0.65 (seed 2) and 0.60 (seed 3): sample deviation 0.05 / sqrt(2)
    assert row["seeds"] == 2 and row["score_seed_std"] == pytest.approx(0.05 / math.sqrt(2))
    by_seed = lb.seed_breakdown([run])
    assert list(by_seed.columns) == ["method", "metric", "seed", "score", "score_ci95", "pr", "n_tasks", "failures"]
    assert by_seed["seed"].tolist() == [2, 3]
    # seed 2: residual sums a +0.1, b -0.1: se^2 = 2 * 0.02 / 16; seed 3: a +0.4, b -0.4: se^2 = 2 * 0.32 / 16
    assert by_seed["score"].tolist() == pytest.approx([0.65, 0.6])
    assert by_seed["score_ci95"].tolist() == pytest.approx([T975_DF1 * 0.05, T975_DF1 * 0.2])
    assert by_seed["n_tasks"].tolist() == [4, 4] and by_seed["failures"].tolist() == [0, 0]


def test_records_from_other_code_are_counted(tmp_path):
    rows = [{**record("m", t, 0.5), "code_hash": "old" if t in ("a1", "b2") else "new"} for t in TASKS]
    run = write_run(tmp_path / "m", rows)
    (run / "run.json").write_text('{"label": "m", "code_hash": "new"}')
    assert lb.leaderboard([read_records(run)]).iloc[0]["other_code_tasks"] == 2


def test_quality_columns_follow_pr_in_vbench_order_with_their_clustered_ci(tmp_path):
    sc = {"a1": 0.9, "a2": 0.7, "b1": 0.5}
    m_rows = [{**record("m", t, 0.5), "subject_consistency": sc.get(t), "imaging_quality": 0.6 if t == "b1" else None}
              for t in TASKS]
    full = [{**record("fullkv", t, 0.5), "imaging_quality": {"a1": 0.3, "b1": 0.5}.get(t)} for t in TASKS]
    runs = [entry(tmp_path, "m", m_rows), entry(tmp_path, "fullkv", full)]
    assert lb.quality_metrics(runs) == ["subject_consistency", "imaging_quality"]
    board = lb.leaderboard(runs)
    assert list(board.columns[4:10]) == ["pr", "subject_consistency", "subject_consistency_ci95", "imaging_quality",
                                         "imaging_quality_ci95", "kv_bytes_ratio"]
    m, f = board.iloc[0], board.iloc[1]
    # m: 0.9 0.7 (a) 0.5 (b): mean 0.7, residual sums +0.2, -0.2: se^2 = 2 * 0.08 / 9
    assert m["subject_consistency"] == pytest.approx(0.7)
    assert m["subject_consistency_ci95"] == pytest.approx(T975_DF1 * math.sqrt(0.16 / 9))
    assert m["imaging_quality"] == pytest.approx(0.6) and math.isnan(m["imaging_quality_ci95"])  # one context
    # FullKV: 0.3 (a) 0.5 (b): mean 0.4, residuals -0.1, +0.1: se^2 = 2 * 0.02 / 4 = 0.01
    assert f["imaging_quality"] == pytest.approx(0.4) and f["imaging_quality_ci95"] == pytest.approx(T975_DF1 * 0.1)
    assert math.isnan(f["subject_consistency"])
    failed = [{**record("x", "a1", None, status="failed"), "subject_consistency": 0.5}, record("x", "b1", 0.5)]
    assert lb.quality_metrics([entry(tmp_path, "x", failed)]) == []  # only successful records count
    assert "subject_consistency" not in lb.leaderboard([entry(tmp_path / "y", "x", failed)]).columns


def test_score_at_85_pr_is_the_fourth_column_from_the_curve_of_the_entrys_label(pair):
    full, m = pair
    curves = pd.DataFrame({"method": ["m", "m", "other"], "test_pr": [0.8, 0.9, 0.85], "score": [0.6, 0.4, 0.1]})
    board = lb.leaderboard([m, full], curves)
    assert list(board.columns[:5]) == ["method", "metric", "score", "score_ci95", "score_at_85pr"]
    assert board["score_at_85pr"].iloc[0] == pytest.approx(0.5)  # halfway between (0.8, 0.6) and (0.9, 0.4)
    assert math.isnan(board["score_at_85pr"].iloc[1])  # FullKV has no curve
    assert "score_at_85pr" not in lb.leaderboard([m, full]).columns


# ------------------------------------------------------------------------------------------ breakdowns
def test_per_source_and_per_task_type_breakdowns_by_hand(pair):
    full, m = pair
    cols = ["method", "metric", "source", "score", "score_ci95", "pr", "n_tasks", "failures"]
    by_source = lb.breakdown([m, full], "source")
    assert list(by_source.columns) == cols
    # sorted by value within each entry: real (context b) before synthetic (context a)
    assert by_source[["method", "source"]].values.tolist() == [["m", "real"], ["m", "synthetic"],
                                                               ["fullkv", "real"], ["fullkv", "synthetic"]]
    assert by_source["score"].tolist() == pytest.approx([0.7, 0.65, 0.6, 0.7])
    assert by_source["pr"].tolist() == pytest.approx([0.7, 0.85, 0.0, 0.0])
    assert by_source["n_tasks"].tolist() == [1, 2, 2, 2] and by_source["failures"].tolist() == [1, 0, 0, 0]
    assert by_source["score_ci95"].isna().all()  # one context per source here
    by_type = lb.breakdown([m, full], "task_type").set_index(["method", "task_type"])
    assert by_type.index.tolist() == [("m", "reappear"), ("m", "revisit"), ("fullkv", "reappear"), ("fullkv", "revisit")]
    # m reappear: a1 0.9, b1 0.7: mean 0.8, residuals +0.1, -0.1: se^2 = 2 * 0.02 / 4 = 0.01
    assert by_type.loc[("m", "reappear"), "score"] == pytest.approx(0.8)
    assert by_type.loc[("m", "reappear"), "score_ci95"] == pytest.approx(T975_DF1 * 0.1)
    assert by_type.loc[("m", "reappear"), "pr"] == pytest.approx(0.75)
    assert by_type.loc[("m", "revisit"), ["score", "n_tasks", "failures"]].tolist() == pytest.approx([0.4, 1, 1])
    assert by_type.loc[("fullkv", "revisit"), "score"] == pytest.approx(0.55)  # a2 0.6, b2 0.5


# ------------------------------------------------------------------------------------------ paired
PAIR_COLS = ["method", "metric", "delta_vs_fullkv", "delta_ci95", "wins", "ties", "losses", "n_pairs", "p_value",
             "p_adjusted", "contexts"]


def test_a_breakdown_of_nothing_still_has_its_columns():
    assert list(lb.breakdown([], "source").columns) == ["method", "metric", "source", "score", "score_ci95", "pr",
                                                        "n_tasks", "failures"]
    assert list(lb.seed_breakdown([]).columns)[2] == "seed"


def test_paired_deltas_are_the_entry_minus_fullkv_on_the_pairs_both_finished(pair):
    full, m = pair
    deltas = lb.paired_deltas([m, full])
    assert list(deltas.columns) == PAIR_COLS and deltas["method"].tolist() == ["m"]  # FullKV is not paired with itself
    row = deltas.iloc[0]
    # m - FullKV on a1 a2 b1: +0.1, -0.2, 0.0: mean -1/30; residual sums a: 0.1333 - 0.1667 = -1/30, b: +1/30
    assert row["delta_vs_fullkv"] == pytest.approx(-1 / 30)
    assert row["delta_ci95"] == pytest.approx(T975_DF1 * math.sqrt(4 / 8100))
    assert [row["wins"], row["ties"], row["losses"], row["n_pairs"]] == [1, 1, 1, 3]
    # t = (-1/30) / (1/45) = -1.5 on one degree of freedom: p = 1 - 2 atan(1.5) / pi
    assert row["p_value"] == pytest.approx(1 - 2 * math.atan(1.5) / math.pi)
    empty = lb.paired_deltas([m])
    assert list(empty.columns) == PAIR_COLS and empty.empty


def test_pairs_are_task_and_seed_unless_a_side_has_no_seeds(tmp_path, pair):
    full, _ = pair
    other_seed = entry(tmp_path, "s1", [{**r, "label": "s1", "seed": 1} for r in full_rows()])
    seedless = entry(tmp_path, "none", [{**r, "label": "none", "seed": None} for r in full_rows()])
    deltas = lb.paired_deltas([full, other_seed, seedless]).set_index("method")
    assert deltas.loc["s1", "n_pairs"] == 0  # seeds 1 against seeds 0: no pair
    assert deltas.loc["none", "n_pairs"] == 4 and deltas.loc["none", "ties"] == 4  # paired on the task alone
    board = lb.leaderboard([full, other_seed, seedless]).set_index("method")
    assert math.isnan(board.loc["s1", "speedup_vs_fullkv"]) and board.loc["none", "speedup_vs_fullkv"] == pytest.approx(1.0)


def test_comparisons_are_method_minus_versus(pair):
    full, m = pair
    table = lb.comparisons([full, m], [("fullkv", "m"), ("m", "fullkv")])
    assert list(table.columns) == ["method", "versus", "metric", "delta", "delta_ci95", "p_value", "wins", "ties",
                                   "losses", "n_pairs", "test", "p_adjusted", "contexts", "verdict"]
    assert table["delta"].tolist() == pytest.approx([1 / 30, -1 / 30])
    # 1/30 apart with a wide interval over 3 contexts: neither level nor apart, in the rule's words
    assert table["verdict"].tolist() == ["not resolved against m", "not resolved against fullkv"]
    # the table's two tests are one family: each p times 2 (Bonferroni), at most 1
    assert table["p_adjusted"].tolist() == pytest.approx([min(1.0, 2 * p) for p in table["p_value"]])
    assert table[["wins", "ties", "losses"]].values.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert set(table["test"]) == {"cluster-robust paired t-test"} and set(table["metric"]) == {"Score"}


def test_which_pairs_are_compared(tmp_path):
    plug = [{**record("plug", t, 0.5), "code": {"method": "h"}} for t in TASKS]
    runs = [entry(tmp_path, "a", [record("a", t, 0.5) for t in TASKS]), entry(tmp_path, "plug", plug),
            entry(tmp_path, "b", [record("b", t, 0.5) for t in TASKS])]
    assert lb.comparison_pairs(runs) == []  # by default each entry against FullKV: none on this board
    with_full = [*runs, entry(tmp_path, "fullkv", [record("fullkv", t, 0.5) for t in TASKS])]
    assert lb.comparison_pairs(with_full) == [("a", "fullkv"), ("plug", "fullkv"), ("b", "fullkv")]  # one way
    assert lb.comparison_pairs(runs, focus="b") == [("b", "a"), ("b", "plug")]  # one label as a string
    assert lb.comparison_pairs(runs, focus=["a", "b"]) == [("a", "plug"), ("a", "b"), ("b", "a"), ("b", "plug")]
    assert lb.comparison_pairs(runs, focus=[], compare=["a", "b"]) == [("a", "b")]  # one pair
    assert lb.comparison_pairs(runs, focus=[], compare=[["b", "a"], ["plug", "b"]]) == [("b", "a"), ("plug", "b")]
    # a named pair already made by the default or the focus is listed once, in its first place
    assert lb.comparison_pairs(with_full, compare=[["b", "fullkv"], ["a", "b"]]) == [
        ("a", "fullkv"), ("plug", "fullkv"), ("b", "fullkv"), ("a", "b")]
    assert lb.comparison_pairs(runs, focus=[]) == []


@pytest.mark.parametrize("focus, compare, message", [
    (["plgu"], None, "leaderboard.focus: no method 'plgu' on this board. Did you mean 'plug'? On it: a, plug, b"),
    ([], [["a", "zzz"]], "leaderboard.compare: no method 'zzz' on this board. On it: a, plug, b"),
    ([], [["zzz", "a"]], "leaderboard.compare: no method 'zzz' on this board. On it: a, plug, b"),
    ([], [["a", "b", "plug"]], "leaderboard.compare: ['a', 'b', 'plug'] is not a pair of methods; write "
                                "leaderboard.compare=[a,b] or leaderboard.compare=[[a,b],[c,d]]"),
    ([], [["a", "b"], "ab"], "leaderboard.compare: 'ab' is not a pair of methods"),
    ([], [["a"]], "leaderboard.compare: ['a'] is not a pair of methods"),
])
def test_bad_focus_or_pairs_are_refused_naming_the_setting_and_the_labels(tmp_path, focus, compare, message):
    plug = [{**record("plug", t, 0.5), "code": {"method": "h"}} for t in TASKS]
    runs = [entry(tmp_path, "a", [record("a", t, 0.5) for t in TASKS]), entry(tmp_path, "plug", plug),
            entry(tmp_path, "b", [record("b", t, 0.5) for t in TASKS])]
    with pytest.raises(ReportError) as err:
        lb.comparison_pairs(runs, focus, compare)
    assert str(err.value).startswith(message)


# ------------------------------------------------------------------------------------------ measured together
def timed(tmp_path, label, stamps, machine="host / cpu", extra=()):
    """An entry whose records were written at ``stamps`` (ns) after ``seconds`` of continuation each.

    Parameters
    ----------
    stamps : list of (int, float or None)
        ``(recorded_ns, continuation_seconds)`` per task (a1, b1, ...).
    machine : str or None
    extra : list of dict
        More records (failures, ...), as written.
    """
    tasks = ["a1", "b1", "a2", "b2"]
    rows = [{**record(label, tasks[i], 0.5, seconds=sec), "machine": machine, "recorded_ns": ns}
            for i, (ns, sec) in enumerate(stamps)]
    return entry(tmp_path, label, [*rows, *extra])


def test_two_speeds_are_measured_together_when_their_intervals_touch_on_one_machine(tmp_path):
    # a: records at 5 s (1 s long) and 10 s (2 s long): [4 s, 10 s]; b: at 12 s (2 s) and 20 s (1 s): [10 s, 20 s]
    a = timed(tmp_path, "a", [(5 * SECOND, 1.0), (10 * SECOND, 2.0)],
              extra=[{**record("a", "a2", None, status="failed"), "machine": "elsewhere", "recorded_ns": 90 * SECOND}])
    b = timed(tmp_path, "b", [(12 * SECOND, 2.0), (20 * SECOND, 1.0)])
    assert lb.measured_together(a, b) and lb.measured_together(b, a)  # failures do not count
    gap = timed(tmp_path, "gap", [(12 * SECOND + 1, 2.0), (20 * SECOND, 1.0)])  # starts 1 ns after a ends
    assert not lb.measured_together(a, gap) and not lb.measured_together(gap, a)
    # no seconds: the interval is the record's instant; b ends at 20 s
    instant = timed(tmp_path, "instant", [(21 * SECOND, None)])
    assert not lb.measured_together(instant, b) and not lb.measured_together(b, instant)
    assert lb.measured_together(timed(tmp_path, "at20", [(20 * SECOND, None)]), b)


def test_speeds_without_place_or_time_or_on_two_machines_are_not_measured_together(tmp_path):
    b = timed(tmp_path, "b", [(12 * SECOND, 2.0), (20 * SECOND, 1.0)])
    elsewhere = timed(tmp_path, "c", [(12 * SECOND, 2.0)], machine="other / gpu")
    nowhere = timed(tmp_path, "d", [(12 * SECOND, 2.0)], machine=None)
    sometime = entry(tmp_path, "e", [{**record("e", "a1", 0.5), "machine": "host / cpu"}])  # no recorded_ns
    for other in (elsewhere, nowhere, sometime):
        assert not lb.measured_together(b, other) and not lb.measured_together(other, b), other.label
    assert lb.measured_together(nowhere, nowhere)  # an entry with itself
    failed = entry(tmp_path, "f", [{**record("f", "a1", None, status="failed"), "machine": "host / cpu",
                                    "recorded_ns": 12 * SECOND}])
    assert not lb.measured_together(failed, entry(tmp_path / "g", "f", [{**record("f", "a1", None, status="failed"),
                                                                         "machine": "host / cpu",
                                                                         "recorded_ns": 12 * SECOND}]))


# ------------------------------------------------------------------------------------------ markdown
def test_labels_are_escaped_and_cells_formatted():
    assert lb.markdown_text("a\\b|c`d*e&f<g>h_[i]") == "a\\\\b\\|c\\`d\\*e&amp;f&lt;g&gt;h_[i]"
    assert lb.markdown_text(7) == "7"
    assert lb._cell(None, "{:.2f}") == "—" and lb._cell(NAN, "{:.2f}") == "—"
    assert lb._cell(0.0, "{:.2f}") == "0.00" and lb._cell(3, "{}") == "3"
    assert lb.board_metric(pd.DataFrame({"metric": ["light", "DINO", "light"]})) == "DINO / light"
    assert lb.board_metric(pd.DataFrame({"metric": []})) == "Score"


def board_frame(rows, **extra_columns):
    """A leaderboard table as :func:`leaderboard` makes it, from partial rows (every other column NaN / 0).

    Parameters
    ----------
    rows : list of dict
    **extra_columns : list
        Further columns (quality, ``score_at_85pr``), one value per row.
    """
    base = {c: NAN for c in COLUMNS}
    base.update(metric="DINO", n_tasks=4, failures=0, seeds=1, other_code_tasks=0, fps_measured_together=None,
                frame_count_flags=0)  # a count, as leaderboard() writes it
    frame = pd.DataFrame([{**base, **r} for r in rows], columns=COLUMNS)
    for name, values in extra_columns.items():
        frame.insert(4, name, values) if name == lb.MATCHED_COLUMN else frame.__setitem__(name, values)
    return frame


def test_the_markdown_table_cell_by_cell():
    board = board_frame([
        dict(method="m|x", score=0.66666, score_ci95=0.28236, pr=0.85, cost_speedup_vs_fullkv=3.4286,
             speedup_vs_fullkv=3.0, fps_measured_together=False, continuation_fps=24.04, peak_kv_bytes=2_345_678,
             kv_bytes_ratio=0.12345, seeds=2, score_seed_std=0.035355, n_tasks=3, failures=1, other_code_tasks=2),
        dict(method="fullkv", score=0.65, pr=0.0, cost_speedup_vs_fullkv=1.0, speedup_vs_fullkv=1.0,
             fps_measured_together=True, continuation_fps=6.4, peak_kv_bytes=1e6, kv_bytes_ratio=1.0),
        dict(method="nofps", score=0.5, score_ci95=0.0, pr=0.5, fps_measured_together=False),
    ])
    lines = lb.markdown_table(board).splitlines()
    assert lines[:5] == [
        "| Method | DINO (95% CI) | PR | KV bytes | Speed-up | FPS speed-up | FPS | Peak KV (MB) | Seeds | Tasks | Failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        "| m\\|x † | 0.6667 ± 0.2824 | 85.00% | 12.35% | 3.43x | 3.00x* | 24.0 | 2.35 | 2 (sd 0.0354) | 3 | 1 |",
        "| fullkv | 0.6500 | 0.00% | 100.00% | 1.00x | 1.00x | 6.4 | 1.00 | 1 | 4 | 0 |",
        "| nofps | 0.5000 ± 0.0000 | 50.00% | — | — | — | — | — | 1 | 4 | 0 |",
    ]
    text = "\n".join(lines)
    assert "(`*`: not measured together, at other times or on another machine)" in text
    assert lines[6].startswith("Speed-up: FullKV's attention FLOPs over the method's")
    assert lines[6].endswith("the CI is over all (task, seed) pairs, clustered by context. KV bytes: the device bytes "
                             "of the KV cache over FullKV's on the same tasks (summed over the continuation's chunks, "
                             "scales and metadata included; FullKV's computed from the geometry): bytes relative to "
                             "FullKV in float32.")
    assert lines[-1] == ("† some task records were computed by other code (kept with `keep_other_code=true`): see "
                         "`other_code_tasks` in leaderboard.csv.")
    for absent in ("Host store", "Quality", "Fidelity", "Paired comparisons", lb.MATCHED_NOTE):
        assert absent not in text
    assert lb.markdown_table(board).endswith(".csv.\n")


def test_markdown_without_stars_or_daggers_says_nothing_of_them():
    board = board_frame([dict(method="a", score=0.5, pr=0.5, speedup_vs_fullkv=2.0, fps_measured_together=None),
                         dict(method="b", score=0.4, pr=0.5, speedup_vs_fullkv=2.0, fps_measured_together=True)])
    text = lb.markdown_table(board)
    assert "| a | 0.5000 | 50.00% | — | — | 2.00x | — |" in text and "| b | 0.4000 | 50.00% | — | — | 2.00x | — |" in text
    assert "`*`" not in text and "†" not in text and lb.FLAG_MARK not in text
    assert "FPS speed-up: measured continuation FPS over FullKV's; `scripts/bench_speed.py`" in text


def test_markdown_host_store_quality_matched_and_comparison_sections():
    board = board_frame(
        [dict(method="ret<1>", score=0.5, pr=0.5, peak_kv_bytes=3e6, peak_store_bytes=12_345_678,
              moved_bytes_per_chunk=456_789),
         dict(method="plain", score=0.4, pr=0.5, peak_kv_bytes=1e6, other_code_tasks=1)],
        subject_consistency=[0.9, NAN], subject_consistency_ci95=[0.01234, NAN],
        imaging_quality=[0.5, 0.25], imaging_quality_ci95=[NAN, 0.1], score_at_85pr=[0.45678, NAN])
    compared = pd.DataFrame([
        dict(method="ret<1>", versus="plain", metric="DINO", delta=0.1, delta_ci95=0.05, p_value=0.012345,
             wins=3, ties=0, losses=1, n_pairs=4, test="t"),
        dict(method="plain", versus="ret<1>", metric="DINO", delta=-0.1, delta_ci95=NAN, p_value=NAN,
             wins=1, ties=0, losses=3, n_pairs=4, test="t")])
    lines = lb.markdown_table(board, compared).splitlines()
    assert lines[:4] == [
        "| Method | DINO (95% CI) | Score @ 85% PR | PR | KV bytes | Speed-up | FPS speed-up | FPS | Peak KV (MB) | "
        "Seeds | Tasks | Failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        "| ret&lt;1&gt; | 0.5000 | 0.4568 | 50.00% | — | — | — | — | 3.00 | 1 | 4 | 0 |",
        "| plain † | 0.4000 | — | 50.00% | — | — | — | — | 1.00 | 1 | 4 | 0 |",
    ]
    at = lines.index("| Method | Peak KV (MB) | Peak store (MB) | Moved per chunk (MB) |")
    assert lines[at - 2].startswith("Host store (methods that move history off the device")
    assert lines[at - 3] == "" and lines[at - 1] == ""  # a blank line either side of the section's title
    assert lines[at + 1:at + 3] == ["|---|---|---|---|", "| ret&lt;1&gt; | 3.00 | 12.35 | 0.457 |"]
    assert lines[at + 3] == ""  # only the entry with a store
    at = lines.index("| Method | Subject Consistency | Imaging Quality |")
    assert lines[at - 2].startswith("Quality (VBench's metrics on the same continuations")
    assert lines[at + 1:at + 4] == ["|---|---|---|", "| ret&lt;1&gt; | 0.9000 ± 0.0123 | 0.5000 |",
                                    "| plain † | — | 0.2500 ± 0.1000 |"]
    assert lines[at + 5] == lb.MATCHED_NOTE
    at = lines.index("| Method | vs | Δ (95% CI) | p | adjusted p | verdict | W / T / L | Pairs |")
    assert lines[at - 2] == ("Paired comparisons (DINO: method minus versus over the (task, seed) pairs both finished; "
                             "95% CI clustered by context; p: cluster-robust paired t-test; adjusted p: p times the 1 "
                             "tests of this table, Bonferroni; verdict: the method against versus as an equivalence "
                             "claim on the table's simultaneous intervals, docs/verdicts.md)")
    assert lines[at + 1:] == ["|---|---|---|---|---|---|---|---|",  # one p-value: one test, adjusted by 1
                              "| ret&lt;1&gt; | plain | +0.1000 ± 0.0500 | 0.0123 | 0.0123 | — | 3 / 0 / 1 | 4 |",
                              "| plain | ret&lt;1&gt; | -0.1000 | — | — | — | 1 / 0 / 3 | 4 |"]
    two = compared.assign(p_value=[0.0123, 0.4])  # two tests: each p doubled, at most 1
    assert "| 0.0123 | 0.0246 |" in lb.markdown_table(board, two) and "| 0.4 | 0.8 |" in lb.markdown_table(board, two)
    said = compared.assign(verdict=["below plain by more than 0.05", "above ret<1> by more than 0.05"])
    assert "| 0.0123 | 0.0123 | below plain by more than 0.05 | 3 / 0 / 1 |" in lb.markdown_table(board, said)
    assert "Paired comparisons" not in lb.markdown_table(board, compared.iloc[:0])
    older = board.drop(columns=list(lb.STORE_COLUMNS))  # a board from before the host-store columns
    assert "Host store" not in lb.markdown_table(older) and "| ret&lt;1&gt; | 0.5000 |" in lb.markdown_table(older)


def test_markdown_fidelity_section_shows_the_columns_and_entries_with_values():
    board = board_frame([dict(method="fullkv", score=0.6, pr=0.0), dict(method="a|b", score=0.5, pr=0.5),
                         dict(method="apart", score=0.4, pr=0.5)],  # apart: no pair with FullKV, no row
                        psnr_vs_fullkv=[math.inf, 31.236, NAN], ssim_vs_fullkv=[1.0, 0.81254, NAN],
                        last_frame_psnr_vs_fullkv=[math.inf, 24.5, NAN], last_frame_ssim_vs_fullkv=[NAN] * 3)
    lines = lb.markdown_table(board).splitlines()
    at = lines.index("| Method | PSNR vs FullKV (dB) | SSIM vs FullKV | Last-frame PSNR vs FullKV (dB) |")
    assert lines[at - 2].startswith("Fidelity to FullKV (each continuation against FullKV's of the same task and seed")
    assert lines[at + 1:at + 5] == ["|---|---|---|---|", "| fullkv | ∞ | 1.0000 | ∞ |",
                                    "| a\\|b | 31.24 | 0.8125 | 24.50 |"]
    assert not any(line.startswith("| apart |") for line in lines[at:])
    assert "Fidelity" not in lb.markdown_table(board.drop(columns=list(lb.FIDELITY_LABELS)))  # a board from before


def test_an_escaped_metric_name_heads_the_table():
    text = lb.markdown_table(board_frame([dict(method="a", score=0.5, pr=0.5, metric="x|y")]))
    assert text.startswith("| Method | x\\|y (95% CI) | PR |")


# ------------------------------------------------------------------------------------------ plot
def test_the_pareto_plot_places_each_measured_entry_with_clipped_error_bars(tmp_path, monkeypatch):
    made = []
    real = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    board = board_frame([dict(method="hi", score=0.9, score_ci95=0.3, pr=0.5),
                         dict(method="noci", score=0.4, score_ci95=NAN, pr=0.8),
                         dict(method="neg", score=-0.1, score_ci95=0.5, pr=0.25),
                         dict(method="nopr", score=0.5, score_ci95=0.1, pr=NAN),
                         dict(method="failed", score=NAN, score_ci95=NAN, pr=0.5)])
    path = lb.pareto_plot(board, tmp_path / "p.png")
    assert path == tmp_path / "p.png" and path.stat().st_size > 1000
    (fig, ax), = made
    assert [t.get_text() for t in ax.texts] == ["hi", "noci", "neg"]
    assert [t.xy for t in ax.texts] == [(50.0, 0.9), (80.0, 0.4), (25.0, -0.1)]
    # range [min(0, -0.1), max(1, 0.9)] = [-0.1, 1.0], a 0.03 margin either side; bars clipped to the range
    assert ax.get_ylim() == pytest.approx((-0.13, 1.03))
    spans = [c.lines[2][0].get_segments()[0][:, 1].tolist() for c in ax.containers]
    assert spans == [pytest.approx([0.6, 1.0]), pytest.approx([0.4, 0.4]), pytest.approx([-0.1, 0.4])]
    # one point per placed entry at (100 PR, score): the bars above are its CI, a zero-length one without it
    assert [(c.lines[0].get_xdata().tolist(), c.lines[0].get_ydata().tolist()) for c in ax.containers] == [
        ([50.0], [0.9]), ([80.0], [0.4]), ([25.0], [-0.1])]
    assert all(c.lines[0].get_marker() not in (None, "", " ", "None") for c in ax.containers)  # a visible point
    renderer = FigureCanvasAgg(fig).get_renderer()  # the figure is closed: lay it out again
    for text in ax.texts:  # each name beside its point (an offset of a few points, not a place in data space)
        x, y = ax.transData.transform(text.xy)
        box = text.get_window_extent(renderer)
        edge = box.x1 if text.get_horizontalalignment() == "right" else box.x0  # right of the plot: label on its left
        assert abs(edge - x) < 20 and abs(box.y0 - y) < 20, text.get_text()
    assert ax.get_xlabel() == "pruning ratio PR (%)" and ax.get_ylabel() == "DINO (mean max-similarity)"
    assert ax.get_title() == "CMBench: DINO score vs pruning ratio"
    lb.pareto_plot(board, tmp_path / "q.png", title="mine")
    assert made[-1][1].get_title() == "mine"
    lb.pareto_plot(board.iloc[::-1], tmp_path / "r.png")  # the entries with nothing to place first
    assert [t.get_text() for t in made[-1][1].texts] == ["neg", "noci", "hi"]


# ------------------------------------------------------------------------------------------ writing
def test_a_board_is_written_into_a_folder_whose_parents_do_not_exist_yet(tmp_path):
    out = tmp_path / "deep" / "er" / "board"
    written = lb.write_reports([write_run(tmp_path / "fullkv", full_rows())], out)
    assert written["leaderboard.csv"] == out / "leaderboard.csv" and (out / "leaderboard.md").is_file()


def test_a_board_is_written_best_first_in_six_digit_csvs_with_every_file(tmp_path, capsys):
    full = write_run(tmp_path / "fullkv", full_rows())
    runs = [write_run(tmp_path / "m", method_rows()),
            write_run(tmp_path / "tie", [{**r, "label": "tie"} for r in full_rows()]), full,
            write_run(tmp_path / "low", [{**r, "label": "low", "score": r["score"] - 0.5} for r in full_rows()])]
    out = tmp_path / "board"
    paths = lb.write_reports(runs, out)
    # comparisons: each vs FullKV; the families board only with families=True
    assert sorted(paths) == sorted(set(lb.REPORT_FILES) - {"backbone_gate.csv", "families.csv", "families.png"})
    assert all(p == out / name and p.is_file() for name, p in paths.items())
    board = pd.read_csv(paths["leaderboard.csv"])
    assert board["method"].tolist() == ["m", "tie", "fullkv", "low"]  # 0.667, then 0.65 twice in the given order
    assert ",0.666667," in paths["leaderboard.csv"].read_text()  # %.6g
    md = paths["leaderboard.md"].read_text()
    assert [line.split(" | ")[0] for line in md.splitlines()[2:6]] == ["| m", "| tie", "| fullkv", "| low"]
    assert capsys.readouterr().err == ""  # nothing removed, nothing kept, no gate
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_new_board_replaces_the_old_one_whole_and_leaves_other_files(tmp_path, capsys):
    out = tmp_path / "board"
    board_folder(out).add("comparisons.csv", "backbone_gate.csv", "leaderboard.md")  # an earlier board's files
    for name in ("comparisons.csv", "backbone_gate.csv", "leaderboard.md", "notes.txt"):  # notes.txt: the user's
        (out / name).write_text("old\n")
    paths = lb.write_reports([write_run(tmp_path / "fullkv", full_rows())], out)
    assert not (out / "comparisons.csv").exists() and not (out / "backbone_gate.csv").exists()
    assert (out / "notes.txt").read_text() == "old\n" and paths["leaderboard.md"].read_text() != "old\n"
    assert capsys.readouterr().err == ""


def test_a_move_that_fails_never_leaves_the_previous_board_without_a_file(tmp_path, capsys):
    full = write_run(tmp_path / "fullkv", full_rows())
    out = tmp_path / "board"
    lb.write_reports([full], out)
    (out / "leaderboard.csv").unlink()
    (out / "leaderboard.csv").mkdir()  # the first file cannot be moved in
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(ReportError, match=f"cannot write the leaderboard into {out}: Is a directory"):
        lb.write_reports([full], out)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert "the previous leaderboard in" in capsys.readouterr().err


def test_a_move_that_fails_half_way_keeps_the_previous_board(tmp_path, capsys):
    full = write_run(tmp_path / "fullkv", full_rows())
    plug = write_run(tmp_path / "m", [{**r, "code": {"method": "h"}} for r in method_rows()])
    out = tmp_path / "board"
    lb.write_reports([full, plug], out)  # with comparisons.csv
    (out / "pareto.png").unlink()
    (out / "pareto.png").mkdir()  # the last file cannot be moved in
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(ReportError, match="Is a directory"):
        lb.write_reports([full], out)
    assert "the previous leaderboard in" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_refused_board_keeps_the_previous_one_and_says_so_only_when_there_is_one(tmp_path, capsys):
    full = write_run(tmp_path / "fullkv", full_rows())
    short = write_run(tmp_path / "short", [record("short", "a1", 0.5)])
    out = tmp_path / "board"
    with pytest.raises(ReportError, match="runs differ in task set"):
        lb.write_reports([full, short], out)
    assert capsys.readouterr().err == "" and not out.exists()
    lb.write_reports([full], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ReportError, match="runs differ in task set"):
        lb.write_reports([full, short], out)
    assert capsys.readouterr().err == (f"leaderboard: not written; the previous leaderboard in {out} is kept as it "
                                       "was (it does not show these runs)\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not list(tmp_path.glob(".board.tmp-*"))


@pytest.mark.parametrize("error, shown", [(OSError(28, "No space left on device"), "No space left on device"),
                                          (OSError("disk gone"), "disk gone")])
def test_a_write_that_fails_is_one_line_and_keeps_the_previous_board(tmp_path, monkeypatch, capsys, error, shown):
    full = write_run(tmp_path / "fullkv", full_rows())
    out = tmp_path / "board"
    lb.write_reports([full], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(lb, "pareto_plot", fail)
    with pytest.raises(ReportError) as err:
        lb.write_reports([full], out)
    assert str(err.value) == f"cannot write the leaderboard into {out}: {shown}"
    assert isinstance(err.value.__cause__, OSError)
    assert "the previous leaderboard in" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not list(tmp_path.glob(".board.tmp-*"))


def test_killed_builds_are_removed_and_named(tmp_path, capsys):
    full = write_run(tmp_path / "fullkv", full_rows())
    dead = [tmp_path / ".board.tmp-999999998", tmp_path / ".board.tmp-999999999"]
    for folder in dead:
        folder.mkdir()
        (folder / "leaderboard.csv").write_text("half")
    alive = tmp_path / f".board.tmp-{os.getpid()}-x"
    alive.mkdir()
    assert lb.remove_stale_builds(tmp_path / "other") == []
    lb.write_reports([full], tmp_path / "board")
    assert capsys.readouterr().err == ("leaderboard: removed 2 folder(s) left by killed leaderboards: "
                                       ".board.tmp-999999998, .board.tmp-999999999\n")
    assert not any(f.exists() for f in dead) and alive.is_dir()


def test_the_gate_is_written_and_a_failing_backbone_warned_about(tmp_path, capsys):
    good = lb.write_reports(gate_runs(tmp_path / "g", "tiny", *GOOD), tmp_path / "good")
    assert "backbone_gate.csv" in good and capsys.readouterr().err == ""
    assert "- PASS tiny:" in good["leaderboard.md"].read_text()
    flat = lb.write_reports(gate_runs(tmp_path / "f", "flat", *FLAT), tmp_path / "flat")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("leaderboard: warning: FullKV is level with the no-context control")
    assert "- WARN flat:" in flat["leaderboard.md"].read_text()


def test_curves_beside_the_board_or_named_fill_score_at_85_pr(tmp_path):
    full = write_run(tmp_path / "fullkv", full_rows())
    out = tmp_path / "board"
    assert lb.find_curves(out) is None
    board_folder(out, ["curves.csv"]).add("curves.csv")  # written by curves, as that command claims it
    (out / "curves.csv").write_text("method,test_pr,score\nfullkv,0.8,0.6\nfullkv,0.9,0.4\n")
    (tmp_path / "named.csv").write_text("method,test_pr,score\nfullkv,0.8,0.2\nfullkv,0.9,0.4\n")
    assert lb.find_curves(out)["score"].tolist() == [0.6, 0.4]
    beside = pd.read_csv(lb.write_reports([full], out)["leaderboard.csv"])
    assert beside.columns[4] == "score_at_85pr" and beside["score_at_85pr"].tolist() == pytest.approx([0.5])
    named = pd.read_csv(lb.write_reports([full], out, curves=tmp_path / "named.csv")["leaderboard.csv"])
    assert named["score_at_85pr"].tolist() == pytest.approx([0.3])
    with pytest.raises(ReportError, match=r"missing.csv: no curves file"):
        lb.find_curves(out, tmp_path / "missing.csv")


# ------------------------------------------------------------------------------------------ refill
def test_numeric_columns_name_the_file_line_and_column_of_a_bad_cell(tmp_path):
    frame = pd.DataFrame({"a": ["1", None, "2.5"], "b": ["x", "y", "z"]})
    assert lb.numeric_columns(frame.copy(), tmp_path / "t.csv", ["a"])["a"].tolist()[::2] == [1.0, 2.5]
    bad = pd.DataFrame({"a": ["1", "2", "three", "four"]})
    with pytest.raises(ReportError, match=re.escape(f"{tmp_path / 't.csv'}:4: column a: 'three' is not a number")):
        lb.numeric_columns(bad, tmp_path / "t.csv", ["a"])


def test_refilling_score_at_85_pr_rewrites_only_the_board_and_its_markdown(tmp_path):
    plug = [{**r, "label": "m", "code": {"method": "h"}} for r in method_rows()]
    runs = [write_run(tmp_path / "fullkv", full_rows()), write_run(tmp_path / "m", plug)]
    out = tmp_path / "board"
    first = lb.write_reports(runs, out)
    kept = {name: first[name].read_bytes() for name in ("paired_deltas.csv", "comparisons.csv", "pareto.png")}
    with pytest.raises(ReportError, match="curves.csv: no curves file"):
        lb.refresh_matched_column(out)
    (out / "curves.csv").write_text("method,test_pr,score\nm,0.8,0.6\nm,0.9,0.4\n")
    written = lb.refresh_matched_column(out)
    assert written == {"leaderboard.csv": out / "leaderboard.csv", "leaderboard.md": out / "leaderboard.md",
                       "leaderboard.json": out / "leaderboard.json"}  # its Score @ 85% PR refilled as well
    board = pd.read_csv(out / "leaderboard.csv")
    assert board.columns[4] == "score_at_85pr" and board["method"].tolist() == ["m", "fullkv"]
    assert board["score_at_85pr"][0] == pytest.approx(0.5) and math.isnan(board["score_at_85pr"][1])
    fresh = lb.write_reports(runs, tmp_path / "fresh")  # the same board a full leaderboard with the curves writes
    pd.testing.assert_frame_equal(board.drop(columns="score_at_85pr"), pd.read_csv(fresh["leaderboard.csv"]))
    md = (out / "leaderboard.md").read_text()
    assert "| m | 0.6667 ± 0.2824 | 0.5000 | 80.00% |" in md and "| m | fullkv | -0.0333 ± 0.2824 |" in md
    (tmp_path / "other.csv").write_text("method,test_pr,score\nm,0.8,0.2\nm,0.9,0.4\nfullkv,0.8,0.7\nfullkv,0.9,0.7\n")
    lb.refresh_matched_column(out, tmp_path / "other.csv")  # the column is there now: replaced, not added twice
    again = pd.read_csv(out / "leaderboard.csv")
    assert list(again.columns) == list(board.columns) and again["score_at_85pr"].tolist() == pytest.approx([0.3, 0.7])
    assert {name: (out / name).read_bytes() for name in kept} == kept
    (out / "comparisons.csv").unlink()
    lb.refresh_matched_column(out)
    assert "Paired comparisons" not in (out / "leaderboard.md").read_text()


def test_refilling_reads_the_gate_again_from_its_numbers(tmp_path):
    out = tmp_path / "board"
    lb.write_reports(gate_runs(tmp_path, "tiny", *GOOD), out)
    (out / "curves.csv").write_text("method,test_pr,score\nx,0.8,0.6\n")
    gate = pd.read_csv(out / "backbone_gate.csv")
    gate.loc[0, ["delta", "delta_ci95"]] = [0.01, 0.02]  # too small: a warning whatever the file's verdict says
    gate.to_csv(out / "backbone_gate.csv", index=False)
    lb.refresh_matched_column(out)
    assert "- WARN tiny: warning: FullKV is level with" in (out / "leaderboard.md").read_text()
    (out / "backbone_gate.csv").unlink()
    lb.refresh_matched_column(out)
    assert "Backbone gate" not in (out / "leaderboard.md").read_text()


def _spoil(path, row: int, column: str, text: str) -> None:
    """Write ``text`` into one cell (data row ``row``) of a CSV table."""
    table = pd.read_csv(path)
    table[column] = table[column].astype(object)
    table.loc[row, column] = text
    table.to_csv(path, index=False)


def test_a_bad_number_in_the_boards_comparisons_is_named(tmp_path):
    plug = [{**r, "label": "m", "code": {"method": "h"}} for r in method_rows()]
    out = tmp_path / "board"
    lb.write_reports([write_run(tmp_path / "fullkv", full_rows()), write_run(tmp_path / "m", plug)], out)
    (out / "curves.csv").write_text("method,test_pr,score\nm,0.8,0.6\n")
    _spoil(out / "comparisons.csv", 0, "wins", "many")
    with pytest.raises(ReportError, match=r"comparisons.csv:2: column wins: 'many' is not a number"):
        lb.refresh_matched_column(out)
    _spoil(out / "leaderboard.csv", 1, "peak_kv_bytes", "big")
    with pytest.raises(ReportError, match=r"leaderboard.csv:3: column peak_kv_bytes: 'big' is not a number"):
        lb.refresh_matched_column(out)

