"""The leaderboard over shared folders: a refused board keeps the previous one, says why, and writes markup as text."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from cmbench.report import ReportError, write_reports
from cmbench.lock import RunLock
from cmbench.runs.records import records_path
from test_report import TASKS, record, seed_runs, seeded, write_run  # noqa: F401  (seed_runs: a fixture)
from test_run_command import cmbench, setup  # noqa: F401  (setup: a fixture)


def board_files(out):
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_a_refused_leaderboard_keeps_the_previous_board_and_says_so(seed_runs, capsys):  # noqa: F811
    tmp, folders = seed_runs
    out = tmp / "board"
    write_reports(folders, out)
    before = board_files(out)
    subset = write_run(tmp / "sub", [seeded("streaming", t, 0.3, 2, "S_s") for t in TASKS[:2]])
    with pytest.raises(ReportError, match=r"runs differ in task set.*pass leaderboard\.allow_mixed=true"):
        write_reports([*folders, subset], out)
    assert board_files(out) == before
    assert f"the previous leaderboard in {out} is kept as it was" in capsys.readouterr().err
    assert not list(tmp.glob(".board.tmp-*"))


def test_killed_leaderboards_leave_no_build_folders_behind(seed_runs, capsys):  # noqa: F811
    tmp, folders = seed_runs
    dead = tmp / ".board.tmp-999999999"  # no such process
    dead.mkdir()
    (dead / "leaderboard.csv").write_text("half")
    live = tmp / f".board.tmp-{os.getppid()}"  # another leaderboard still building
    live.mkdir()
    write_reports(folders, tmp / "board")
    assert not dead.exists() and live.exists()
    assert ".board.tmp-999999999" in capsys.readouterr().err


def test_a_leaderboard_taken_while_a_run_is_writing_says_so_and_keeps_the_previous_board(seed_runs):  # noqa: F811
    tmp, folders = seed_runs
    out = tmp / "board"
    write_reports(folders, out)
    before = board_files(out)
    with RunLock(records_path(folders[0])):
        with pytest.raises(ReportError, match=rf"{folders[0]}: a run is still writing it \(process {os.getpid()}\)"):
            write_reports(folders, out)
    assert board_files(out) == before
    write_reports(folders, out)  # finished: the board is made


def test_an_unwritable_output_folder_is_a_one_line_error(seed_runs, monkeypatch):  # noqa: F811
    tmp, folders = seed_runs
    out = tmp / "board"
    write_reports(folders, out)
    before = board_files(out)

    def read_only(self, path, *args, **kwargs):
        raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr(pd.DataFrame, "to_csv", read_only)
    with pytest.raises(ReportError, match=rf"^cannot write the leaderboard into {out}: Read-only file system"):
        write_reports(folders, out)
    assert board_files(out) == before


def test_labels_are_written_into_the_markdown_as_text(tmp_path):
    hostile = "<script>alert(1)</script> | *x*"
    run = write_run(tmp_path / "a", [record(hostile, t, 0.5) for t in ("a1", "a2")])
    text = write_reports([run], tmp_path / "board")["leaderboard.md"].read_text()
    assert "<script>" not in text and "| *x*" not in text
    row = next(line for line in text.splitlines() if "alert" in line)
    assert row.startswith("| &lt;script&gt;alert(1)&lt;/script&gt; \\| \\*x\\* |")
    assert len(row.split(" | ")) == 11  # the label's pipe does not add a column


def test_a_board_over_chosen_tasks_reads_only_those(tmp_path):
    full = write_run(tmp_path / "full", [record("fullkv", t, 0.5) for t in ("a1", "a2")])
    many = write_run(tmp_path / "many", [record("decoprune", t, s) for t, s in
                                         (("a1", 0.4), ("a2", 0.2), ("b1", 0.9), ("b2", 0.9))])
    with pytest.raises(ReportError, match="runs differ in task set"):
        write_reports([full, many], tmp_path / "board")
    board = pd.read_csv(write_reports([full, many], tmp_path / "board", task_ids=["a1", "a2"])["leaderboard.csv"])
    row = board.set_index("method").loc["decoprune"]
    assert row["n_tasks"] == 2 and row["score"] == pytest.approx(0.3)


def test_a_sweeps_board_covers_the_tasks_the_sweep_ran(setup, tmp_path):  # noqa: F811
    """A sweep on one task after a run of two: its closing board compares the methods on that task."""
    tmp, weights = setup
    runs = f"out_dir={tmp_path / 'runs'}"
    first = cmbench(tmp, weights, "method=streaming", "task_ids=[syn_001_revisit_01,syn_001_reappear_01]", runs)
    assert first.returncode == 0, first.stderr
    sweep = cmbench(tmp, weights, "-m", "method=fullkv,streaming", "task_ids=[syn_001_reappear_01]", runs)
    assert sweep.returncode == 0, sweep.stderr
    (csv,) = (tmp_path / "runs" / "miniworld" / "leaderboard" / "sweeps").glob("*/leaderboard.csv")
    board = pd.read_csv(csv).set_index("method")
    assert board.loc["streaming", "n_tasks"] == 1 and board.loc["fullkv", "n_tasks"] == 1
    assert "the full leaderboard in" in sweep.stderr and "runs differ in task set" in sweep.stderr  # over 1 and 2


def test_a_run_folders_config_is_read_as_text_never_resolved(tmp_path, monkeypatch, capsys):
    """``${oc.env:...}`` in a received config.yaml must not pull the reader's environment into a board."""
    monkeypatch.setenv("CMBENCH_PROBE_SECRET", "hunter2")
    runs = []
    for name, value in (("a", "${oc.env:CMBENCH_PROBE_SECRET}"), ("b", "plain")):
        run = write_run(tmp_path / name, [record("x", t, 0.5) for t in ("a1", "a2")])
        (run / "config.yaml").write_text(f"seed: 0\nnote: '{value}'\n")
        runs.append(run)
    board = pd.read_csv(write_reports(runs, tmp_path / "board")["leaderboard.csv"])
    assert "hunter2" not in " ".join(board["method"]) + capsys.readouterr().err
    assert "x[note=${oc.env:CMBENCH_PROBE_SECRET}]" in list(board["method"])
