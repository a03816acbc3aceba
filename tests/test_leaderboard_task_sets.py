"""Runs over different tasks (the README's order: a full run, then a ``limit=8`` FullKV run) are refused by default
in one readable line that says how many tasks each ran, how many all share and how to board them;
``leaderboard.shared_tasks=true`` boards the shared tasks and says what each run left out, in a line and in
the markdown; ``leaderboard.allow_mixed=true`` never shows means over different tasks side by side without a note."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_report import record, write_run

from cmbench.cli.main import main
from cmbench.report import ReportError, write_reports

SCORES = {"a1": 0.8, "a2": 0.6, "b1": 0.2, "b2": 0.1}


@pytest.fixture
def full_and_quick(tmp_path):
    """decoprune over four tasks, fullkv (the quick look) over the first two."""
    deco = write_run(tmp_path / "decoprune", [record("decoprune", t, s) for t, s in SCORES.items()])
    full = write_run(tmp_path / "fullkv", [record("fullkv", t, 0.9) for t in ("a1", "a2")])
    return tmp_path, deco, full


def test_runs_over_different_tasks_are_refused_in_one_line_naming_the_fix(full_and_quick):
    tmp, deco, full = full_and_quick
    with pytest.raises(ReportError) as refused:
        write_reports([deco, full], tmp / "board")
    message = str(refused.value)
    assert "\n" not in message and not (tmp / "board").exists()
    assert "decoprune 4 tasks, fullkv 2 tasks (2 tasks shared by all)" in message
    assert "leaderboard.shared_tasks=true" in message and "leaderboard.allow_mixed=true" in message


def test_a_board_over_the_shared_tasks_says_what_each_run_left_out(full_and_quick, capsys):
    tmp, deco, full = full_and_quick
    paths = write_reports([deco, full], tmp / "board", shared_tasks=True)
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert board.loc["decoprune", "score"] == pytest.approx(0.7)  # a1 and a2 only, not the mean of all four
    assert board.loc["decoprune", "n_tasks"] == 2 and board.loc["decoprune", "unshared_tasks"] == 2
    assert board["task_count"].tolist() == [2, 2] and board.loc["fullkv", "unshared_tasks"] == 0
    note = "2 tasks shared by all runs, the board's task set (leaderboard.shared_tasks=true); left out: decoprune has 2 more"
    assert note in capsys.readouterr().err
    assert f"**Task sets:** {note}." in paths["leaderboard.md"].read_text()
    submitted = json.loads(paths["leaderboard.json"].read_text())
    assert sorted(submitted["task_set"]["task_ids"]) == ["a1", "a2"]


def test_runs_sharing_no_task_are_refused_even_on_shared_tasks(tmp_path):
    one = write_run(tmp_path / "one", [record("decoprune", "a1", 0.5)])
    other = write_run(tmp_path / "other", [record("fullkv", "b1", 0.5)])
    with pytest.raises(ReportError, match=r"^leaderboard.shared_tasks=true: the runs share no task \(decoprune 1 tasks"):
        write_reports([one, other], tmp_path / "board", shared_tasks=True)


def test_means_over_different_tasks_side_by_side_carry_a_note(full_and_quick):
    tmp, deco, full = full_and_quick
    md = write_reports([deco, full], tmp / "board", allow_mixed=True)["leaderboard.md"].read_text()
    assert ("**Task sets:** the runs cover different tasks (leaderboard.allow_mixed=true; tasks: decoprune 4, fullkv 2): "
            "their means are over different tasks") in md


def test_runs_over_one_task_set_get_no_note(full_and_quick):
    tmp, deco, _ = full_and_quick
    same = write_run(tmp / "same", [record("fullkv", t, 0.9) for t in SCORES])
    for shared in (False, True):
        md = write_reports([deco, same], tmp / f"board{shared}", shared_tasks=shared)["leaderboard.md"].read_text()
        assert "Task sets" not in md


def test_the_command_line_boards_the_shared_tasks(full_and_quick, capsys):
    tmp, deco, full = full_and_quick
    assert main(["leaderboard", f"runs=[{deco},{full}]", f"leaderboard.out={tmp / 'board'}",
                 "leaderboard.shared_tasks=true"]) == 0
    assert "left out: decoprune has 2 more" in capsys.readouterr().out
