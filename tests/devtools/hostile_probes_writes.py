"""The hostile pass's probes on outputs pointed at a folder CMBench did not write, and received files that are links.

Each probe attacks the real command line (see :mod:`devtools.hostile`); the shared inputs (a small
suite, one real run folder) come from :mod:`devtools.hostile_probes`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from devtools.hostile import Probe, ProbeFailed, Workspace, refused, same_bytes, snapshot, succeeded, unchanged
from devtools.hostile_probes import base_run, copy_run, leaderboard, score

VICTIM = b"v" * 1000  # someone's file outside the received folder


def papers_folder(folder: Path) -> Path:
    """A user's folder: a paper, its figures and tables named as CMBench names its own."""
    paper = folder / "paper"
    (paper / "figs").mkdir(parents=True)
    (paper / "figs" / "pareto.pdf").write_bytes(b"a figure")
    (paper / "main.tex").write_text("\\section{Results}\n")
    (paper / "comparisons.csv").write_text("the user's own table\n")
    (paper / "backbone_gate.csv").write_text("the user's own gate\n")
    return paper


def leaderboard_out_over_a_users_folder(ws: Workspace, folder: Path) -> None:
    paper = papers_folder(folder)
    before = snapshot(paper)
    done = leaderboard(ws, [base_run(ws)], paper)
    refused(done, f"leaderboard.out={paper}", "not empty and not written by CMBench")
    unchanged(paper, before, "the user's folder")


def leaderboard_out_over_a_run_folder_it_reads(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder)
    before = snapshot(run)
    done = leaderboard(ws, [run], run)
    refused(done, f"leaderboard.out={run}", "holds the records of a run")
    unchanged(run, before, "the run folder")


def score_out_over_a_users_folder(ws: Workspace, folder: Path) -> None:
    mine = folder / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("notes\n")
    (mine / "summary.json").write_text('{"the user": "own summary"}\n')
    before = snapshot(mine)
    done = score(ws, base_run(ws) / "videos", mine)
    refused(done, f"out={mine}", "not empty and not written by CMBench")
    unchanged(mine, before, "the user's folder")


def score_out_at_the_root(ws: Workspace, folder: Path) -> None:
    names = ("config.yaml", "records.jsonl", "summary.json")
    there = {name for name in names if os.path.lexists(f"/{name}")}
    done = score(ws, base_run(ws) / "videos", Path("/"))
    made = [f"/{name}" for name in names if name not in there and os.path.lexists(f"/{name}")]
    for path in made:  # written by the command: taken away again
        os.unlink(path)
    if made:
        raise ProbeFailed(f"score out=/ wrote {', '.join(made)}")
    refused(done, "out=/", "not empty and not written by CMBench")


def score_out_in_the_videos_folder(ws: Workspace, folder: Path) -> None:
    videos = copy_run(ws, folder) / "videos"
    before = snapshot(videos)
    done = score(ws, videos, videos)
    refused(done, f"out={videos}", "not empty and not written by CMBench")
    unchanged(videos, before, "the videos folder")


def copied_suite(ws: Workspace, folder: Path) -> Path:
    """A copy of the shared MiniWorld suite at ``folder/suite``."""
    base_run(ws)  # the shared suite exists once the shared run does
    suite = folder / "suite"
    shutil.copytree(ws.root / "suite", suite, symlinks=True)
    return suite


def suite_overrides_at(ws: Workspace, root: Path) -> list[str]:
    """The small suite's overrides with ``data.root`` moved to ``root``."""
    return [f"data.root={root}", *(o for o in ws.suite_overrides if not o.startswith("data.root="))]


def score_out_in_the_dataset_folder(ws: Workspace, folder: Path) -> None:
    suite = copied_suite(ws, folder)
    before = snapshot(suite)
    done = ws.cmbench("score", f"videos={base_run(ws) / 'videos'}", f"out={suite}", *suite_overrides_at(ws, suite))
    refused(done, f"out={suite}", "not empty and not written by CMBench")
    unchanged(suite, before, "the dataset folder")


def diagnose_out_is_a_file(ws: Workspace, folder: Path) -> None:
    passwd = Path("/etc/passwd")
    content = passwd.read_bytes()
    done = ws.cmbench("diagnose", "method=streaming", f"out={passwd}", *ws.suite_overrides)
    refused(done, f"out={passwd}", "is a file, not a folder")
    same_bytes(passwd, content, "/etc/passwd")


def resumed_run_writes_through_no_hard_link(ws: Workspace, folder: Path) -> None:
    """A received run whose records file, videos and lock file are hard links to files outside it, its
    records from other code (so the resumed run computes every task again: appends records, writes
    videos, takes the lock): every outside file keeps its bytes."""
    run = copy_run(ws, folder)
    outside = folder / "outside"
    outside.mkdir()
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    (run / "records.jsonl").write_text("".join(json.dumps({**r, "code_hash": "0" * 16}) + "\n" for r in rows))
    victims = {}
    for path in [run / "records.jsonl", *sorted((run / "videos").iterdir())]:
        victim = outside / path.name
        os.replace(path, victim)
        os.link(victim, path)
        victims[victim] = victim.read_bytes()
    lock = outside / "lock_victim"
    lock.write_bytes(VICTIM)
    os.link(lock, run / ".records.jsonl.lock")
    victims[lock] = VICTIM
    done = ws.cmbench("run", "method=streaming", "limit=2", f"out_dir={folder / 'runs'}", "progress=false",
                      *ws.suite_overrides)
    succeeded(done)
    if "recomputed" not in done.stdout + done.stderr:
        raise ProbeFailed("the resumed run recomputed nothing: no write was attacked")
    for victim, content in victims.items():
        same_bytes(victim, content, "a file outside the run folder that one of its files was a hard link to")
    if len((run / "records.jsonl").read_text().splitlines()) != 2 * len(rows):
        raise ProbeFailed("the resumed run's records are not the earlier ones followed by the new ones")


def calibrate_into_a_users_calibration_folder(ws: Workspace, folder: Path) -> None:
    """``calibrate out_dir=`` a folder whose ``calibration/`` is someone's: refused before any work."""
    mine = folder / "out" / "calibration"
    mine.mkdir(parents=True)
    (mine / "streaming_pr50.json").write_text('{"the user": "own notes"}\n')
    (mine / "notes.txt").write_text("notes\n")
    before = snapshot(mine)
    done = ws.cmbench("calibrate", "method=streaming", "target_pr=0.5", f"out_dir={mine.parent}", *ws.suite_overrides)
    refused(done, f"calibration folder {mine}", "not empty and not written by CMBench")
    unchanged(mine, before, "the user's calibration folder")


def calibrate_writes_through_no_linked_sub_folder(ws: Workspace, folder: Path) -> None:
    """A received calibration folder (CMBench's marker) whose ``keyed/`` is a link to a folder outside it:
    refused before any work, the outside folder untouched."""
    cal = folder / "out" / "calibration"
    cal.mkdir(parents=True)
    (cal / ".cmbench-written.json").write_text(json.dumps({"written_by": "cmbench", "kind": "calibration",
                                                           "files": ["keyed", "method"]}))
    outside = folder / "outside"
    outside.mkdir()
    (outside / "victim.json").write_bytes(VICTIM)
    (cal / "keyed").symlink_to(outside)
    before = snapshot(outside)
    done = ws.cmbench("calibrate", "method=streaming", "target_pr=0.5", f"out_dir={cal.parent}", *ws.suite_overrides)
    refused(done, f"calibration folder {cal}", "its keyed is a link")
    unchanged(outside, before, "the folder outside that keyed/ linked to")


def prepare_over_a_folder_with_a_build_json_of_someone_else(ws: Workspace, folder: Path) -> None:
    """``prepare data.root=`` a user's folder that happens to hold a ``build.json``: a build replaces its
    root as a whole, so it is refused and every file kept."""
    mine = folder / "project"
    mine.mkdir()
    (mine / "build.json").write_text('{"build_hash": "make", "targets": ["all"]}\n')
    (mine / "main.c").write_text("int main(void) { return 0; }\n")
    before = snapshot(mine)
    done = ws.cmbench("prepare", *suite_overrides_at(ws, mine))
    refused(done, f"data.root={mine}", "not a MiniWorld build")
    unchanged(mine, before, "the user's folder")


def prepare_over_a_suite_with_a_file_of_yours(ws: Workspace, folder: Path) -> None:
    """A MiniWorld suite with a user's file added, rebuilt with another knob: refused, the file kept."""
    suite = copied_suite(ws, folder)
    (suite / "notes.txt").write_text("my notes on the suite\n")
    before = snapshot(suite)
    done = ws.cmbench("prepare", *suite_overrides_at(ws, suite), "data.world_seed=7")
    refused(done, f"data.root={suite}", "also holds notes.txt")
    unchanged(suite, before, "the suite with the user's file")


PROBES: list[Probe] = [
    Probe("leaderboard-out-over-a-users-folder", leaderboard_out_over_a_users_folder),
    Probe("leaderboard-out-over-a-run-folder-it-reads", leaderboard_out_over_a_run_folder_it_reads),
    Probe("score-out-over-a-users-folder", score_out_over_a_users_folder),
    Probe("score-out-at-the-root", score_out_at_the_root),
    Probe("score-out-in-the-videos-folder", score_out_in_the_videos_folder),
    Probe("score-out-in-the-dataset-folder", score_out_in_the_dataset_folder),
    Probe("diagnose-out-is-a-file", diagnose_out_is_a_file),
    Probe("resumed-run-writes-through-no-hard-link", resumed_run_writes_through_no_hard_link),
    Probe("calibrate-into-a-users-calibration-folder", calibrate_into_a_users_calibration_folder),
    Probe("calibrate-writes-through-no-linked-sub-folder", calibrate_writes_through_no_linked_sub_folder),
    Probe("prepare-over-a-folder-with-a-build-json-of-someone-else", prepare_over_a_folder_with_a_build_json_of_someone_else),
    Probe("prepare-over-a-suite-with-a-file-of-yours", prepare_over_a_suite_with_a_file_of_yours),
]
