"""CMBench writes only into a folder that is empty or that it made (its marker lists what it wrote), and
replaces or removes only what that list names (cmbench/runs/output_folder.py, and every command that
writes a folder: the leaderboard and its sweep boards, score, report, diagnose, run)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cmbench.report import leaderboard as lb
from cmbench.report.board_folder import board_folder, sweeps_folder
from cmbench.report.html import check_report_folder
from cmbench.runs.experiment import run_folder
from cmbench.runs.output_folder import MARKER, Legacy, OutputFolder, OutputFolderError, claim, read_marker
from test_leaderboard_units import full_rows
from test_report import write_run


def user_folder(path: Path, files: dict[str, str]) -> dict[str, str]:
    """A folder of a user's holding ``files`` (``figs/`` too); its content, to compare after."""
    (path / "figs").mkdir(parents=True)
    (path / "figs" / "plot.pdf").write_text("figure")
    for name, text in files.items():
        (path / name).write_text(text)
    return content(path)


def content(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ the rule


def test_a_new_or_empty_folder_is_claimed_and_the_marker_lists_what_is_written(tmp_path):
    for folder in (tmp_path / "new" / "deeper", tmp_path / "empty"):
        if folder.name == "empty":
            folder.mkdir()
        claimed = claim(folder, "diagnose", "out", names=["a.csv"])
        assert not (folder / MARKER).exists() or folder.name == "empty"  # nothing is written by a claim
        claimed.add("a.csv")
        assert read_marker(folder, "out") == ("diagnose", {"a.csv"})


def test_a_folder_cmbench_did_not_write_is_refused_naming_what_is_in_it(tmp_path):
    folder = tmp_path / "paper"
    before = user_folder(folder, {"main.tex": "years of work", "comparisons.csv": "mine"})
    with pytest.raises(OutputFolderError) as err:
        claim(folder, "leaderboard", "leaderboard.out", names=["comparisons.csv"])
    assert str(err.value) == (f"leaderboard.out={folder}: not empty and not written by CMBench (it holds "
                              f"comparisons.csv, figs, main.tex); choose an empty or new folder for leaderboard.out, "
                              f"so nothing of yours is replaced")
    assert content(folder) == before


def test_a_file_a_link_or_the_root_is_never_an_output_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(OutputFolderError, match=r"^out=.*/file: is a file, not a folder; choose"):
        claim(tmp_path / "file", "score", "out")
    with pytest.raises(OutputFolderError, match=r"^out=.*/link: is a link"):
        claim(tmp_path / "link", "score", "out")
    with pytest.raises(OutputFolderError, match=r"^out=/: not empty and not written by CMBench"):
        claim(Path("/"), "score", "out")


def test_a_name_cmbench_did_not_write_is_refused_even_in_its_own_folder(tmp_path):
    folder = tmp_path / "board"
    claim(folder, "leaderboard", "leaderboard.out").add("leaderboard.md")
    (folder / "comparisons.csv").write_text("the user's own table")
    (folder / "notes.txt").write_text("kept beside")
    claim(folder, "leaderboard", "leaderboard.out", names=["leaderboard.md"])  # notes.txt is not in the way
    with pytest.raises(OutputFolderError) as err:
        claim(folder, "leaderboard", "leaderboard.out", names=["leaderboard.md", "comparisons.csv"])
    assert str(err.value).startswith(f"leaderboard.out={folder}: comparisons.csv is there and CMBench did not write "
                                     f"it (not listed in {MARKER})")
    with pytest.raises(OutputFolderError, match="comparisons.csv is there"):
        OutputFolder(folder, "leaderboard", "leaderboard.out", {"leaderboard.md"}).add("comparisons.csv")


def test_a_folder_of_another_kind_is_refused(tmp_path):
    claim(tmp_path / "run", "run", "the run directory").add("run.json")
    with pytest.raises(OutputFolderError, match=r"holds the records of a run, not a leaderboard"):
        claim(tmp_path / "run", "leaderboard", "leaderboard.out")


def test_a_whole_folder_replaced_must_hold_only_what_cmbench_wrote(tmp_path):
    folder = tmp_path / "report"
    claim(folder, "report", "report.out").add("index.html")
    (folder / ".index.html.ab12cd34.tmp").write_text("a killed writer's")
    claim(folder, "report", "report.out", whole=True)
    (folder / "thesis.tex").write_text("mine")
    with pytest.raises(OutputFolderError, match="thesis.tex is there and CMBench did not write it"):
        claim(folder, "report", "report.out", whole=True)


@pytest.mark.parametrize("marker", ["not json", json.dumps({"kind": "run", "files": ["../escape"]}),
                                    json.dumps({"kind": "run", "files": "records.jsonl"}), json.dumps([1])])
def test_a_marker_that_is_not_cmbench_s_is_refused_in_one_line(tmp_path, marker):
    (tmp_path / MARKER).write_text(marker)
    with pytest.raises(OutputFolderError, match=rf"^out={tmp_path}: its {MARKER}"):
        claim(tmp_path, "run", "out")


def test_a_marker_that_is_a_link_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"kind": "run", "files": ["main.tex"]}))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / MARKER).symlink_to(elsewhere)
    with pytest.raises(OutputFolderError, match="is not a marker CMBench wrote"):
        claim(tmp_path / "run", "run", "out")


@pytest.mark.parametrize("attack", ["sparse", "fifo"])
def test_a_marker_too_large_or_no_regular_file_is_refused_without_reading_it(tmp_path, attack):
    """A 6 GiB sparse marker (over the 1 MiB limit of a marker) or a FIFO in its place: one line, nothing
    read or waited on."""
    marker = tmp_path / MARKER
    if attack == "sparse":
        with open(marker, "wb") as handle:
            handle.truncate(6 * 2**30)
    else:
        os.mkfifo(marker)
    with pytest.raises(OutputFolderError, match=rf"^out={tmp_path}: its {MARKER} is not a marker CMBench wrote"):
        claim(tmp_path, "run", "out")


def test_two_writers_adding_at_once_keep_both_names(tmp_path):
    first, second = (claim(tmp_path, "run", "run") for _ in range(2))
    first.add("records.shard-0-of-2.jsonl")
    second.add("records.shard-1-of-2.jsonl")
    assert read_marker(tmp_path, "run") == ("run", {"records.shard-0-of-2.jsonl", "records.shard-1-of-2.jsonl"})


def test_a_folder_another_writer_is_creating_is_claimed_while_its_marker_is_not_yet_written(tmp_path):
    """Two processes claiming one new folder at once (two lanes of one calibration): the first has made the
    folder and holds its marker's lock, or is renaming a temporary file into place, when the second looks.
    A folder holding only CMBench's transient files is empty, not someone else's."""
    for n, leftover in enumerate((f".{MARKER}.lock", f".{MARKER}.1234abcd.tmp")):
        folder = tmp_path / f"calibration{n}"
        folder.mkdir()
        (folder / leftover).write_text("")
        claimed = claim(folder, "calibration", "out_dir's calibration folder", names=["keyed"])
        claimed.add("keyed")
        assert read_marker(folder, "out") == ("calibration", {"keyed"})
    # a hidden file of the user's that only looks like a lock beside the user's work is still theirs
    folder = tmp_path / "theirs"
    user_folder(folder, {".notes.lock": "mine"})
    with pytest.raises(OutputFolderError, match="not empty and not written by CMBench"):
        claim(folder, "calibration", "out_dir's calibration folder")


def test_only_listed_entries_are_removed(tmp_path):
    folder = claim(tmp_path, "leaderboard", "leaderboard.out")
    folder.add("comparisons.csv")
    (tmp_path / "comparisons.csv").write_text("ours")
    (tmp_path / "backbone_gate.csv").write_text("not listed")
    folder.remove("comparisons.csv")
    folder.remove("backbone_gate.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER, "backbone_gate.csv"]


# ------------------------------------------------------------------ folders of earlier versions (no marker)


def earlier_run(path: Path, extra: dict[str, str] | None = None) -> Path:
    (path / "videos").mkdir(parents=True)
    for name in ("config.yaml", "run.json", "records.jsonl", "summary.json", ".records.jsonl.lock", *(extra or {})):
        (path / name).write_text("{}")
    return path


def test_an_earlier_run_folder_is_recognised_by_its_run_json_and_only_a_runs_files(tmp_path):
    run = earlier_run(tmp_path / "run")
    with run_folder(run):
        pass
    assert read_marker(run, "run") == ("run", {"config.yaml", "run.json", "records.jsonl", "summary.json", "videos"})
    mixed = earlier_run(tmp_path / "mixed", {"notes.txt": "mine"})
    with pytest.raises(OutputFolderError, match="not empty and not written by CMBench"):
        with run_folder(mixed):
            pass
    assert not (mixed / MARKER).exists()


def test_an_earlier_board_is_adopted_but_a_folder_with_a_copy_of_one_is_not(tmp_path):
    board = tmp_path / "board"
    board.mkdir()
    for name in ("leaderboard.md", "leaderboard.csv", "comparisons.csv"):
        (board / name).write_text("x")
    assert board_folder(board).files == {"leaderboard.md", "leaderboard.csv", "comparisons.csv"}
    (board / "main.tex").write_text("mine")
    with pytest.raises(OutputFolderError):
        board_folder(board)


def test_a_legacy_rule_with_a_further_test(tmp_path):
    (tmp_path / "index.html").write_text("someone's page")
    rule = Legacy(required=(("index.html",),), names=("index.html",), recognise=lambda f: False)
    with pytest.raises(OutputFolderError):
        claim(tmp_path, "report", "report.out", legacy=rule)


# ------------------------------------------------------------------ the commands' writers


def test_a_leaderboard_into_a_users_folder_writes_nothing(tmp_path):
    paper = tmp_path / "paper"
    before = user_folder(paper, {"main.tex": "x", "comparisons.csv": "mine", "backbone_gate.csv": "mine too"})
    with pytest.raises(OutputFolderError, match=f"leaderboard.out={paper}: not empty"):
        lb.write_reports([write_run(tmp_path / "fullkv", full_rows())], paper)
    assert content(paper) == before


def test_a_leaderboard_into_a_run_folder_it_reads_writes_nothing(tmp_path):
    run = write_run(tmp_path / "fullkv", full_rows())
    OutputFolder(run, "run", "the run directory", {"records.jsonl", "config.yaml"}).add()
    before = content(run)
    with pytest.raises(OutputFolderError, match="holds the records of a run, not a leaderboard"):
        lb.write_reports([run], run)
    assert content(run) == before


def test_a_board_replaces_its_own_files_and_leaves_a_users_beside_them(tmp_path):
    run = write_run(tmp_path / "fullkv", full_rows())
    board = tmp_path / "board"
    lb.write_reports([run], board)
    assert read_marker(board, "x")[1] >= {"leaderboard.md", "leaderboard.csv", "pareto.png"}
    (board / "notes.txt").write_text("mine")
    lb.write_reports([run], board)
    assert (board / "notes.txt").read_text() == "mine"
    (board / "comparisons.csv").write_text("mine, after the board")
    with pytest.raises(OutputFolderError, match="comparisons.csv is there"):
        lb.write_reports([run], board)
    assert (board / "comparisons.csv").read_text() == "mine, after the board"


def test_a_sweep_board_goes_into_a_claimed_sweeps_folder(tmp_path):
    board = tmp_path / "board"
    sweep = sweeps_folder(board, "fullkv__abc")
    assert sweep == board / "sweeps" / "fullkv__abc" and not sweep.exists()
    assert read_marker(board, "x") == ("leaderboard", {"sweeps"})
    assert read_marker(board / "sweeps", "x") == ("sweeps", {"fullkv__abc"})
    paper = tmp_path / "paper"
    before = user_folder(paper, {"main.tex": "x"})
    with pytest.raises(OutputFolderError):
        sweeps_folder(paper, "fullkv__abc")
    assert content(paper) == before


def test_a_report_folder_must_be_new_empty_or_a_report(tmp_path):
    mine = tmp_path / "mine"
    user_folder(mine, {"thesis.tex": "years of work"})
    with pytest.raises(OutputFolderError, match=f"report.out={mine}: not empty and not written by CMBench"):
        check_report_folder(mine)
