"""Each committed board recomputes from the records committed beside it: the leaderboard over
results/miniworld/<board>_runs/ gives the committed board's scores, intervals, PRs and device bytes, and its paired
comparisons the committed ones (what `BOARD_ONLY=1 OUT=results/miniworld/<board>_runs bash scripts/<board>.sh`
rebuilds)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cmbench.cli.main import main

REPO = Path(__file__).resolve().parents[1]
BOARDS = {
    "families": ("results/miniworld/families_runs", "leaderboard.focus=all", "results/miniworld/families_bytes.csv",
                 "results/miniworld/families_bytes_comparisons.csv"),
    "kvpress": ("results/miniworld/kvpress_runs", "leaderboard.focus=[decoprune@pr85,random@pr85]",
                "results/miniworld/kvpress_leaderboard.csv", "results/miniworld/kvpress_comparisons.csv"),
}
BOARD_NUMBERS = ("score", "score_ci95", "pr", "kv_bytes_ratio", "n_tasks")
PAIR_NUMBERS = ("delta", "delta_ci95", "p_value", "n_pairs")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BOARDS))
def test_the_committed_board_is_what_its_committed_records_give(name, tmp_path):
    runs, focus, board, pairs = BOARDS[name]
    assert main(["leaderboard", f"out_dir={REPO / runs}", focus, f"leaderboard.out={tmp_path / 'board'}"]) == 0
    fresh = pd.read_csv(tmp_path / "board" / "leaderboard.csv").set_index("method")
    committed = pd.read_csv(REPO / board).set_index("method")
    assert sorted(fresh.index) == sorted(committed.index)
    for column in BOARD_NUMBERS:
        pd.testing.assert_series_equal(fresh.loc[committed.index, column].astype(float),
                                       committed[column].astype(float), rtol=1e-5, obj=f"{board}: {column}")
    fresh_pairs = pd.read_csv(tmp_path / "board" / "comparisons.csv").set_index(["method", "versus"])
    committed_pairs = pd.read_csv(REPO / pairs).set_index(["method", "versus"])
    assert sorted(fresh_pairs.index) == sorted(committed_pairs.index)
    for column in PAIR_NUMBERS:
        pd.testing.assert_series_equal(fresh_pairs.loc[committed_pairs.index, column].astype(float),
                                       committed_pairs[column].astype(float), rtol=1e-5, obj=f"{pairs}: {column}")


@pytest.mark.slow
@pytest.mark.parametrize(("table", "methods"), [
    ("retrieval_comparison", "worldkv_fixed_window,key_retrieval,decoprune,random,streaming"),
    ("retrieval_comparison_worldkv_rules", "worldkv,worldkv_fixed_window")])
def test_the_committed_retrieval_tables_and_verdicts_are_what_their_records_give(table, methods, tmp_path, monkeypatch):
    """Both retrieval tables and their verdict CSVs, rebuilt from results/miniworld/retrieval_runs (its points.csv:
    the run folder of every point) as scripts/retrieval_comparison.sh builds them."""
    import subprocess
    import sys

    monkeypatch.chdir(REPO)  # the points name their run folders relative to the repository
    points = pd.read_csv("results/miniworld/retrieval_runs/points.csv")
    fullkv = str(points.loc[points["method"] == "fullkv", "run_dir"].iloc[0])
    done = subprocess.run([sys.executable, "scripts/retrieval_comparison.py", "results/miniworld/retrieval_runs/points.csv",
                           fullkv, "--methods", methods, "--out", str(tmp_path / "t.csv"), "--verdicts",
                           str(tmp_path / "v.csv")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    fresh, committed = pd.read_csv(tmp_path / "t.csv"), pd.read_csv(f"results/miniworld/{table}.csv")
    assert list(fresh["method"]) == list(committed["method"])
    for column in ("device_pr", "score", "score_reappear", "score_revisit", "peak_kv_mb", "peak_store_mb"):
        pd.testing.assert_series_equal(fresh[column], committed[column], rtol=1e-5, obj=f"{table}: {column}")
    fresh_v, committed_v = pd.read_csv(tmp_path / "v.csv"), pd.read_csv(f"results/miniworld/{table}_verdicts.csv")
    assert list(fresh_v["claim"]) == list(committed_v["claim"]) and list(fresh_v["verdict"]) == list(committed_v["verdict"])
    pd.testing.assert_series_equal(fresh_v["high"], committed_v["high"], rtol=1e-5, obj=f"{table}_verdicts: high")
