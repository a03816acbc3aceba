"""`python -m cmbench run` end to end on a small MiniWorld suite with a small random tiny model.

Checks what a user relies on: the run directory and its files, resume after SIGKILL, a failing task
recorded while the run goes on, and a -m sweep ending with its leaderboard.

The command runs in a real subprocess where the process is what is tested (the run directory written by
``python -m cmbench run``, a SIGKILL mid-run, a user's plugin edited between runs, ``leaderboard`` on odd
names); elsewhere it runs in this process (:func:`run_here`: the same ``main`` the command line calls,
without paying Python, torch and Hydra's start-up again).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cmbench.cli.main import main
from cmbench.runs.records import read_all_records
from test_tiny_backbone import random_model

pytestmark = pytest.mark.slow  # subprocesses of the real command line

REPO = Path(__file__).resolve().parents[1]
TIMING = {"prefill_seconds", "continuation_seconds", "continuation_fps", "traceback", "recorded_ns"}
SMALL_SUITE = [
    "data.clip_frames=24",
    "data.min_absence_frames=16",
    "data.sources.synthetic.videos=2",
    "data.sources.synthetic.reappear=2",
    "data.sources.synthetic.revisit=1",
    "data.sources.real.videos=1",
    "data.sources.real.reappear=1",
    "data.sources.real.revisit=0",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    weights = tmp / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    return tmp, weights


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """The small suite as ``python -m cmbench prepare`` builds it (a real process), once for the module: the tests
    that damage a suite copy it (what they check is how run and validate read a damaged suite; the builder's own
    tests are tests/test_miniworld_suite.py)."""
    suite = tmp_path_factory.mktemp("prepared") / "suite"
    build = subprocess.run([sys.executable, "-m", "cmbench", "prepare", "data=miniworld", f"data.root={suite}",
                            *SMALL_SUITE, "data.check_counts=false"], cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr
    return suite


def copy_of(suite: Path, where: Path) -> Path:
    shutil.copytree(suite, where)
    return where


def cmbench(tmp: Path, weights: Path, *args: str, data_root: Path | None = None, background: bool = False):
    cmd = [sys.executable, "-m", "cmbench", "run", f"data.root={data_root or tmp / 'suite'}", *SMALL_SUITE,
           f"backbone.path={weights}", f"out_dir={tmp / 'runs'}", "progress=false", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if background:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def run_here(capsys, tmp: Path, weights: Path, *args: str, data_root: Path | None = None,
             command: str = "run") -> subprocess.CompletedProcess:
    """What :func:`cmbench` does (the same arguments, ``out_dir`` last wins), in this process: the exit code
    and what it printed, as a finished process."""
    argv = [command, f"data.root={data_root or tmp / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}",
            f"out_dir={tmp / 'runs'}", "progress=false", *args]
    capsys.readouterr()
    code = main(argv)
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, printed.out, printed.err)


def stable(records):
    return sorted(json.dumps({k: v for k, v in r.items() if k not in TIMING}, sort_keys=True) for r in records)


def only_run_dir(root: Path) -> Path:
    (run_dir,) = [p for p in (root / "miniworld").iterdir() if p.is_dir() and p.name != "leaderboard"]
    return run_dir


@pytest.fixture(scope="module")
def decoprune_run(setup):
    """``python -m cmbench run method=decoprune method.quota_pr=0.8`` on the small suite, in a real process,
    once: the run directory the first test checks and the last test rescores (neither writes into it)."""
    tmp, weights = setup
    return cmbench(tmp, weights, "method=decoprune", "method.quota_pr=0.8", f"out_dir={tmp / 'decoprune'}")


def test_run_writes_a_complete_run_directory_and_resumes(setup, decoprune_run, capsys):
    tmp, weights = setup
    out = decoprune_run
    assert out.returncode == 0, out.stderr
    run_dir = only_run_dir(tmp / "decoprune")
    assert run_dir.name.startswith("decoprune__tiny__light__")
    assert (run_dir / "config.yaml").is_file()
    records = read_all_records(run_dir)
    assert sorted(r["task_id"] for r in records) == [
        "real_001_reappear_01", "syn_001_reappear_01", "syn_001_revisit_01", "syn_002_reappear_01"
    ]
    for r in records:
        # the automatic label names the knob that differs from DeCoPrune's class default
        assert r["status"] == "ok" and r["label"] == "decoprune@quota_pr=0.8" and r["method_config"]["quota_pr"] == 0.8
        assert 0.0 <= r["score"] <= 1.0 and 0.0 <= r["detection_rate"] <= 1.0
        assert abs(r["pr"] - 0.8) < 0.02  # quota mode realises its target
        assert r["target_pr"] == 0.8 and r["calibration_pr"] is None  # a quota: no calibration
        assert r["continuation_frames"] == 16 and len(r["similarities"]) == 16
        assert r["peak_kv_bytes"] > 0 and r["prefill_seconds"] > 0 and r["continuation_seconds"] > 0
        assert r["versions"]["torch"] and r["git_commit"] and len(r["scorer_hash"]) == 12
        assert (run_dir / "videos" / f"{r['task_id']}.mp4").stat().st_size > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks_ok"] == 4 and summary["tasks_failed"] == 0
    assert summary["pr"] == pytest.approx(sum(r["pr"] for r in records) / 4)
    again = run_here(capsys, tmp, weights, "method=decoprune", "method.quota_pr=0.8", f"out_dir={tmp / 'decoprune'}")
    assert again.returncode == 0 and "(0 run now, 4 cached)" in again.stdout
    assert len(read_all_records(run_dir)) == 4


def first_record(out_dir: Path, proc: subprocess.Popen, seconds: float = 300) -> Path | None:
    """The records file of the run ``proc`` writes under ``out_dir`` once it holds a record (None if the
    process ended or ``seconds`` passed first)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(out_dir.glob("miniworld/*/records.jsonl"))
        if found and found[0].read_text().count("\n") >= 1:
            return found[0]
        time.sleep(0.05)
    return None


def test_sigkill_then_rerun_equals_an_uninterrupted_run(setup, tmp_path, capsys):
    tmp, weights = setup
    clean = run_here(capsys, tmp, weights, "method=streaming", f"out_dir={tmp_path / 'clean'}")
    assert clean.returncode == 0, clean.stderr
    proc = cmbench(tmp, weights, "method=streaming", f"out_dir={tmp_path / 'killed'}", background=True)
    records_file = first_record(tmp_path / "killed", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert records_file is not None, "the run finished no task before the deadline"
    assert 1 <= len(read_all_records(records_file.parent)) < 4
    resumed = run_here(capsys, tmp, weights, "method=streaming", f"out_dir={tmp_path / 'killed'}")
    assert resumed.returncode == 0, resumed.stderr
    got = read_all_records(records_file.parent)
    assert len(got) == 4
    assert stable(got) == stable(read_all_records(only_run_dir(tmp_path / "clean")))


def test_a_failing_task_is_recorded_and_the_run_goes_on(setup, prepared, tmp_path, capsys):
    tmp, weights = setup
    suite = copy_of(prepared, tmp_path / "suite")
    for npz in (suite / "context").glob("*/syn_002.npz"):
        npz.write_bytes(b"corrupt")
    out = run_here(capsys, tmp, weights, "method=streaming", f"out_dir={tmp_path / 'runs'}", data_root=suite)
    assert out.returncode == 3
    assert "failed: syn_002_reappear_01" in out.stderr
    records = {r["task_id"]: r for r in read_all_records(only_run_dir(tmp_path / "runs"))}
    assert records["syn_002_reappear_01"]["status"] == "failed"
    assert "MiniWorldDataError" in records["syn_002_reappear_01"]["error"]
    assert "context/synthetic/syn_002.npz" in records["syn_002_reappear_01"]["error"]
    assert [t for t, r in records.items() if r["status"] == "ok"] != []
    summary = json.loads((only_run_dir(tmp_path / "runs") / "summary.json").read_text())
    assert summary["tasks_failed"] == 1 and summary["tasks_ok"] == 3


def test_sweep_ends_with_a_leaderboard(setup, tmp_path, capsys):
    tmp, weights = setup
    one_context = "task_ids=[syn_001_revisit_01,syn_001_reappear_01]"
    out = run_here(capsys, tmp, weights, "-m", "method=fullkv,streaming", one_context, f"out_dir={tmp_path / 'runs'}")
    assert out.returncode == 0, out.stderr
    board = tmp_path / "runs" / "miniworld" / "leaderboard"
    for name in ("leaderboard.csv", "leaderboard_by_source.csv", "leaderboard_by_type.csv", "paired_deltas.csv",
                 "leaderboard.md", "pareto.png"):
        assert (board / name).is_file(), name
    text = (board / "leaderboard.md").read_text()
    assert "| fullkv |" in text and "| streaming |" in text
    assert "| fullkv |" in out.stdout


def in_process(tmp: Path, weights: Path, out_dir: Path, *args: str) -> int:
    """``python -m cmbench run ...`` in this process (for refusals and simulated file-system faults)."""
    return main(["run", f"data.root={tmp / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}",
                 f"out_dir={out_dir}", "progress=false", *args])


@pytest.mark.parametrize(
    "override, message",
    [
        ("limit=abc", "limit='abc': expected a positive whole number of tasks"),
        ("limit=0", "limit=0: expected a positive whole number of tasks"),
        ("seed=abc", "seed='abc': expected a whole number >= 0"),
        ("threads=-1", "threads=-1: expected a whole number of torch threads >= 1"),
        ("threads=0", "threads=0: expected a whole number of torch threads >= 1"),
        ("task_ids=[]", "task_ids=[] selects no task"),
        ("data.name=..", "data.name='..' cannot name a folder"),
        ("label=/", "label=/: holds '/', which is a path separator; choose a plain name"),
        ("shard.index=2", "shard.index must be in [0, shard.count), got index=2 count=1"),
        ("method.quota_pr=1.5", "decoprune: quota_pr must be in [0, 1), got 1.5"),  # the method's own check
        ("method.target_pr=1.5", "method.target_pr=1.5: expected a pruning ratio in [0, 1), e.g. method.target_pr=0.85"),
        ("method.token_budget=3", "method 'decoprune' has no knob(s) token_budget"),  # the quota's old name
        ("method.probe_step=9", "decoprune: method.probe_step=9 names no step of the 4-step schedule"),
        ("method.gamma=-1", "method decoprune: gamma must be a number >= 0, got -1"),  # knob types and ranges
        ("method.gamma=abc", "method decoprune: gamma must be a number >= 0, got 'abc'"),
        ("method.probe_step=2.5", "method decoprune: probe_step must be a whole number >= 0, got 2.5"),
        ("method.post_prune=maybe", "method decoprune: post_prune must be true or false, got 'maybe'"),
        ("method.quota_tokens=-3", "method decoprune: quota_tokens must be a whole number >= 0 (or null), got -3"),
    ],
)
def test_a_refused_run_is_one_line_and_leaves_no_folder(setup, tmp_path, capsys, override, message):
    tmp, weights = setup
    out_dir = tmp_path / "runs"
    assert in_process(tmp, weights, out_dir, override) == 1
    err = capsys.readouterr().err
    assert f"cmbench: error: {message}" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not out_dir.exists()  # nothing created, or what was created removed


@pytest.mark.parametrize("override", ["method.gamma=-1", "method.probe_step=9"])
def test_a_refused_method_loads_no_data_and_no_backbone(setup, tmp_path, capsys, monkeypatch, override):
    """Knob and generation-setting checks run when the run is configured, before any data or model."""
    from cmbench.runs import evaluator, experiment

    tmp, weights = setup
    loaded = []
    monkeypatch.setattr(evaluator, "build_backbone", lambda *a, **k: loaded.append("backbone"))
    monkeypatch.setattr(experiment, "build_adapter", lambda *a, **k: loaded.append("data"))
    assert in_process(tmp, weights, tmp_path / "runs", "method=decoprune", override) == 1
    err = capsys.readouterr().err
    assert err.startswith("cmbench: error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert loaded == []


def test_an_unwritable_out_dir_or_a_full_disk_is_one_line(setup, tmp_path, capsys, monkeypatch):
    import errno

    from cmbench.runs import records

    tmp, weights = setup
    out_dir = tmp_path / "runs"
    real_mkdir = os.mkdir

    def read_only(path, *args, **kwargs):
        if str(path).startswith(str(out_dir)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only)
    assert in_process(tmp, weights, out_dir, "method=streaming", "task_ids=[syn_001_revisit_01]") == 1
    err = capsys.readouterr().err
    assert "cmbench: error: cannot create the run directory" in err and "Read-only file system" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    monkeypatch.undo()

    real_write = os.write

    def disk_full(fd, data):  # the disk fills up when the first record is written
        if os.readlink(f"/proc/self/fd/{fd}").endswith("records.jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(records.os, "write", disk_full)
    assert in_process(tmp, weights, out_dir, "method=streaming", "task_ids=[syn_001_revisit_01]") == 1
    err = capsys.readouterr().err
    assert "cmbench: error: cannot write" in err and "records.jsonl: No space left on device" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    monkeypatch.undo()
    assert in_process(tmp, weights, out_dir, "method=streaming", "task_ids=[syn_001_revisit_01]") == 0
    assert [r["status"] for r in read_all_records(only_run_dir(out_dir))] == ["ok"]


def test_a_changed_miniworld_knob_rebuilds_the_suite(setup, tmp_path, capsys):
    """data.world_seed=1 on a world_seed=0 suite must not reuse it (it did, recording world_seed 1)."""
    tmp, weights = setup
    suite = tmp_path / "suite"
    one = ["task_ids=[syn_001_revisit_01]", "method=streaming", f"out_dir={tmp_path / 'runs'}"]
    first = run_here(capsys, tmp, weights, *one, data_root=suite)
    assert first.returncode == 0, first.stderr
    manifest = (suite / "metadata.jsonl").read_text()
    second = run_here(capsys, tmp, weights, *one, "data.world_seed=1", data_root=suite)
    assert second.returncode == 0, second.stderr
    assert "rebuilding" in second.stderr and "world_seed: 0 -> 1" in second.stderr
    assert (suite / "metadata.jsonl").read_text() != manifest
    assert json.loads((suite / "build.json").read_text())["config"]["world_seed"] == 1


def test_run_and_leaderboard_agree_on_odd_data_names(setup, tmp_path, capsys):
    tmp, weights = setup
    out = run_here(capsys, tmp, weights, "task_ids=[syn_001_revisit_01]", "method=streaming", "data.name=mini world",
                   f"out_dir={tmp_path / 'runs'}")
    assert out.returncode == 0, out.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["mini-world"]
    board = subprocess.run([sys.executable, "-m", "cmbench", "leaderboard", "data.name=mini world",
                            f"out_dir={tmp_path / 'runs'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert board.returncode == 0, board.stderr
    assert "| streaming |" in board.stdout and (tmp_path / "runs" / "mini-world" / "leaderboard").is_dir()


def test_scoring_a_runs_saved_continuations_reproduces_its_scores_exactly(setup, decoprune_run, tmp_path, capsys):
    tmp, weights = setup
    out = decoprune_run
    assert out.returncode == 0, out.stderr
    run_dir = only_run_dir(tmp / "decoprune")
    ran = {r["task_id"]: r for r in read_all_records(run_dir)}
    assert all((run_dir / r["video"]).suffix == ".mkv" for r in ran.values())  # the lossless copies
    scored_dir = tmp_path / "rescored"
    rescore = in_this_process(capsys, "score", f"videos={run_dir / 'videos'}", f"data.root={tmp / 'suite'}",
                              *SMALL_SUITE, f"out={scored_dir}", "scorer.cache_dir=null")  # no cache: really recomputed
    assert rescore.returncode == 0, rescore.stdout + rescore.stderr
    assert "warning" not in rescore.stderr  # 16 frames of 32x32, as MiniWorld expects
    rescored = {r["task_id"]: r for r in read_all_records(scored_dir)}
    assert sorted(rescored) == sorted(ran)
    for task_id, r in ran.items():
        assert rescored[task_id]["score"] == r["score"], task_id  # exactly, not approximately
        assert rescored[task_id]["similarities"] == r["similarities"]
        assert rescored[task_id]["best_frame"] == r["best_frame"] and rescored[task_id]["best_box"] == r["best_box"]
    skipped = [line for line in rescore.stdout.splitlines() if ".mp4: " in line]
    assert len(skipped) == 4 and all(".mkv is scored instead" in line for line in skipped)
    board = in_this_process(capsys, "leaderboard", f"runs=[{run_dir},{scored_dir}]",
                            f"leaderboard.out={tmp_path / 'board'}")
    assert board.returncode == 0, board.stderr
    assert "| Method | light (95% CI) |" in board.stdout
    rows = {line.split("|")[1].strip(): line for line in board.stdout.splitlines() if line.startswith("| ")}
    assert rows["decoprune@quota_pr=0.8"].split("|")[2] == rows[run_dir.name].split("|")[2]  # same mean and CI


def test_validate_checks_miniworld_npz_files_as_run_reads_them(prepared, tmp_path, capsys):
    suite = copy_of(prepared, tmp_path / "suite")
    args = [f"data.root={suite}", *SMALL_SUITE, "data.check_counts=false"]
    (suite / "context" / "synthetic" / "syn_002.npz").write_bytes(b"corrupt")
    (suite / "ground_truth" / "real_001_reappear_01.npz").unlink()
    out = in_this_process(capsys, "validate", "data=miniworld", *args)
    assert out.returncode == 1
    assert "miniworld.context_frames: task syn_002_reappear_01: cannot read" in out.stderr
    assert "miniworld.ground_truth: task real_001_reappear_01:" in out.stderr and "not found" in out.stderr
    assert "2 problem(s)" in out.stderr and "Traceback" not in out.stderr


PLUGIN = '''
from dataclasses import dataclass

from cmbench.methods.decoprune import DeCoPrune


@dataclass
class MyPress(DeCoPrune):
    """A user's method outside CMBench."""

    name = "my_press"
    gamma: float = 0.1
'''
ONE_CONTEXT = "task_ids=[syn_001_revisit_01,syn_001_reappear_01]"


def in_this_process(capsys, *argv: str) -> subprocess.CompletedProcess:
    """``python -m cmbench <argv>`` in this process: its exit code and what it printed, as a finished process."""
    capsys.readouterr()
    code = main(list(argv))
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(list(argv), code, printed.out, printed.err)


def test_an_edited_plugin_is_recomputed_a_relabel_is_not_and_old_records_are_kept_only_loudly(setup, tmp_path, capsys):
    tmp, weights = setup
    code, conf = tmp_path / "code", tmp_path / "conf"
    (conf / "method").mkdir(parents=True)
    code.mkdir()
    (code / "my_press.py").write_text(PLUGIN)
    (conf / "method" / "my_press.yaml").write_text("_target_: my_press.MyPress\n")
    env = {"PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]),
           "CMBENCH_CONFIG_PATH": str(conf)}
    out_dir = f"out_dir={tmp_path / 'runs'}"

    def run(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "cmbench", "run", f"data.root={tmp / 'suite'}", *SMALL_SUITE,
               f"backbone.path={weights}", out_dir, "progress=false", "method=my_press", ONE_CONTEXT, *args]
        done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1", **env}, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return done

    assert "(2 run now, 0 cached)" in run().stdout
    run_dir = only_run_dir(tmp_path / "runs")
    assert "(0 run now, 2 cached)" in run().stdout
    (code / "my_press.py").write_text(PLUGIN.replace("gamma: float = 0.1", "gamma: float = 0.3"))
    edited = run()
    assert "(2 run now, 0 cached)" in edited.stdout  # the edit is computed, not served from the cache
    assert "my_press: 2 task(s) recomputed: their records came from other code (method source)" in edited.stderr
    assert only_run_dir(tmp_path / "runs") == run_dir  # the same run: the config did not change
    (code / "my_press.py").write_text(PLUGIN.replace("gamma: float = 0.1", "gamma: float = 0.3")
                                      .replace("outside CMBench", "of mine"))
    assert "(0 run now, 2 cached)" in run().stdout  # a docstring is not code
    relabelled = run("label=mine")
    assert "\nmine: 2/2 tasks ok (0 run now, 2 cached)" in relabelled.stdout
    board = in_this_process(capsys, "leaderboard", f"runs=[{run_dir}]", f"leaderboard.out={tmp_path / 'board'}")
    assert board.returncode == 0, board.stderr
    assert "| mine |" in board.stdout and "my_press" not in board.stdout  # the current label
    (code / "my_press.py").write_text(PLUGIN.replace("gamma: float = 0.1", "gamma: float = 0.5"))
    kept = run("label=mine", "keep_other_code=true")
    assert "(0 run now, 2 cached, 2 from other code)" in kept.stdout
    assert ("mine: warning: 2 task(s) kept from other code (method source) because keep_other_code=true; their "
            "results are not this code's: syn_001_") in kept.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks_other_code"] == 2 and len(summary["other_code_task_ids"]) == 2
    board = in_this_process(capsys, "leaderboard", f"runs=[{run_dir}]", f"leaderboard.out={tmp_path / 'board'}")
    assert "| mine † |" in board.stdout and "computed by other code" in board.stdout
    records = read_all_records(run_dir)
    assert len(records) == 4 and len({r["code_hash"] for r in records}) == 2
    assert all(r["code"]["method"] and r["code"]["cmbench"] and r["code"]["backbone"] and r["code"]["scorer"]
               for r in records)


def main_table(stdout):
    """The lines of the leaderboard's first table (the score table; the quality table follows it)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Method |"))
    return list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))


def main_rows(stdout):
    """The rows of the leaderboard's first table, ``{method: {column header: cell}}``."""
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in main_table(stdout)]
    return {row[0]: dict(zip(header, row)) for row in rows}


def test_a_knob_and_seed_sweep_gets_distinct_labels_one_row_per_setup_and_a_deterministic_cost(setup, tmp_path,
                                                                                               capsys):
    tmp, weights = setup
    out = run_here(capsys, tmp, weights, "-m", "method=decoprune", "method.quota_pr=0.8,0.9", "seed=2,3", ONE_CONTEXT,
                  f"out_dir={tmp_path / 'runs'}")
    assert out.returncode == 0, out.stderr
    rows = {method: row for method, row in main_rows(out.stdout).items() if method.startswith("d")}
    # one row each, 2 seeds; each marked suspect (§): the random-weight model's frames are noise, which does
    # not continue the context (continuity about 0.22, threshold 0.07)
    assert sorted(rows) == ["decoprune@quota_pr=0.8 §", "decoprune@quota_pr=0.9 §"]
    assert all(row["Seeds"].startswith("2 (sd ") and row["Tasks"] == "4" for row in rows.values())
    board = pd.read_csv(tmp_path / "runs" / "miniworld" / "leaderboard" / "leaderboard_by_seed.csv")
    assert sorted(board["seed"]) == [2, 2, 3, 3]
    again = run_here(capsys, tmp, weights, "method=decoprune", "method.quota_pr=0.8", "seed=2", ONE_CONTEXT,
                     f"out_dir={tmp_path / 'again'}")
    assert again.returncode == 0, again.stderr
    first = {r["task_id"]: r for run_dir in (tmp_path / "runs" / "miniworld").glob("decoprune__*")
             for r in read_all_records(run_dir) if r["run_seed"] == 2 and r["label"] == "decoprune@quota_pr=0.8"}
    second = {r["task_id"]: r for r in read_all_records(only_run_dir(tmp_path / "again"))}
    assert first.keys() == second.keys() and len(second) == 2
    for task_id, r in second.items():
        assert r["attention_flops"] > 0 and r["attention_keys_per_token"] > 0
        assert r["attention_flops"] == first[task_id]["attention_flops"]  # the same, however loaded the machine
        assert r["attention_keys_per_token"] == first[task_id]["attention_keys_per_token"]


def test_a_seed_sweep_with_a_limit_runs_the_same_tasks_for_every_seed(setup, tmp_path, capsys):
    """``limit=N`` draws its sample with ``sample_seed``, not the run's seed: a ``seed=2,6`` sweep is one
    leaderboard row over the same tasks (the run's seed drawing it made the seeds cover different tasks,
    and the sweep's leaderboard refused them: on this suite seeds 2 and 6 draw different pairs)."""
    tmp, weights = setup
    out = run_here(capsys, tmp, weights, "-m", "method=streaming", "seed=2,6", "limit=2", f"out_dir={tmp_path / 'runs'}")
    assert out.returncode == 0, out.stderr
    runs = sorted((tmp_path / "runs" / "miniworld").glob("streaming__*"))
    tasks = [sorted(r["task_id"] for r in read_all_records(run_dir)) for run_dir in runs]
    assert len(runs) == 2 and len(tasks[0]) == 2 and tasks[0] == tasks[1]
    (row,) = [row for method, row in main_rows(out.stdout).items() if method.startswith("streaming")]
    assert row["Seeds"].startswith("2 (sd ") and row["Tasks"] == "4"
