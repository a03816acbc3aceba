"""A ``-m`` sweep's boards: its own (its runs, on the tasks it ran) in a folder of its own, and the board over
every run refreshed, so a second sweep never replaces the first one's rows."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from omegaconf import OmegaConf

from cmbench.cli.leaderboard import write_sweep_leaderboards
from test_report import TASKS, record, write_run
from test_run_command import cmbench, setup  # noqa: F401  (setup: a fixture)


def config(out_dir):
    return OmegaConf.create({"out_dir": str(out_dir), "data": {"name": "miniworld"}, "runs": None, "leaderboard": {
        "out": None, "allow_mixed": False, "focus": None, "compare": None, "curves": None,
        "reference_aggregation": None}})


def methods(csv):
    return sorted(pd.read_csv(csv)["method"])


def sweep_boards(board):
    return {folder.name: methods(folder / "leaderboard.csv") for folder in (board / "sweeps").iterdir()
            if folder.is_dir()}  # the folder's write-guard marker is a file beside the sweeps


def test_a_second_sweep_keeps_the_first_sweeps_rows_on_the_full_board(tmp_path, capsys):
    base = tmp_path / "runs" / "miniworld"
    run = {label: write_run(base / f"{label}__tiny__light__{n:010d}", [record(label, t, 0.5) for t in TASKS])
           for n, label in enumerate(("fullkv", "streaming", "decoprune", "random"))}
    cfg, board = config(tmp_path / "runs"), base / "leaderboard"
    assert write_sweep_leaderboards(cfg, [run["fullkv"], run["streaming"]], TASKS) == 0
    assert write_sweep_leaderboards(cfg, [run["decoprune"], run["random"]], TASKS) == 0
    assert methods(board / "leaderboard.csv") == ["decoprune", "fullkv", "random", "streaming"]
    boards = sweep_boards(board)  # each sweep's own board, named by its methods
    assert sorted((name.split("__")[0], rows) for name, rows in boards.items()) == [
        ("decoprune+random", ["decoprune", "random"]), ("fullkv+streaming", ["fullkv", "streaming"])]
    assert all(re.fullmatch(r"[a-z+]+__[0-9a-f]{10}", name) for name in boards)
    out = capsys.readouterr().out
    assert "| decoprune |" in out and f"refreshed the full leaderboard (4 runs) in {board}" in out
    # the same sweep again writes its own folder again, not another one
    write_sweep_leaderboards(cfg, [run["random"], run["decoprune"]], TASKS)
    assert sweep_boards(board) == boards


def test_a_full_board_that_is_refused_keeps_the_previous_one_and_the_sweep_succeeds(tmp_path, capsys):
    base = tmp_path / "runs" / "miniworld"
    full = write_run(base / "fullkv__tiny__light__0000000000", [record("fullkv", t, 0.5) for t in TASKS])
    cfg, board = config(tmp_path / "runs"), base / "leaderboard"
    write_sweep_leaderboards(cfg, [full], TASKS)
    before = (board / "leaderboard.csv").read_bytes()
    fewer = write_run(base / "random__tiny__light__0000000001", [record("random", t, 0.4) for t in TASKS[:2]])
    assert write_sweep_leaderboards(cfg, [fewer], TASKS[:2]) == 0
    assert (board / "leaderboard.csv").read_bytes() == before
    err = capsys.readouterr().err
    assert f"the full leaderboard in {board} is not refreshed: " in err and "runs differ in task set" in err
    assert ["random"] in sweep_boards(board).values()


@pytest.mark.slow
def test_two_sweeps_of_the_run_command_leave_a_full_board_of_both(setup, tmp_path):  # noqa: F811
    tmp, weights = setup
    runs, one_task = f"out_dir={tmp_path / 'runs'}", "task_ids=[syn_001_reappear_01]"
    first = cmbench(tmp, weights, "-m", "method=fullkv,streaming", one_task, runs)
    assert first.returncode == 0, first.stderr
    second = cmbench(tmp, weights, "-m", "method=streaming", "method.recent_chunks=0,3", one_task, runs)
    assert second.returncode == 0, second.stderr
    board = tmp_path / "runs" / "miniworld" / "leaderboard"
    assert methods(board / "leaderboard.csv") == ["fullkv", "streaming", "streaming@recent_chunks=0",
                                                  "streaming@recent_chunks=3"]
    assert sorted(sweep_boards(board).values()) == [["fullkv", "streaming"],
                                                    ["streaming@recent_chunks=0", "streaming@recent_chunks=3"]]
    assert "| streaming@recent_chunks=3 |" in second.stdout and "| fullkv |" not in second.stdout
