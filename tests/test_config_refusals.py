"""Configuration a command must refuse in one line, before any work: each case was accepted silently, hung
or ended in a traceback. Config cases run the real command line in-process (Hydra composes, the spec
refuses); Ctrl-C is a real SIGINT sent to a subprocess running the task loop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cmbench.cli.main import main
from cmbench.errors import ConfigError
from cmbench.identity.labels import check_label, safe_label
from cmbench.spec import MAX_CONTINUATION_FRAMES, MAX_SEED, MAX_THREADS

ROOT = Path(__file__).resolve().parent.parent


def _refused(capsys, *argv: str) -> str:
    """Run the command line; it must exit 1 with one line on stderr and nothing like a traceback."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


RUN = ("run", "method=streaming", "limit=1", "progress=false")


@pytest.mark.parametrize("override, said", [
    (f"threads={MAX_THREADS + 1}", f"threads={MAX_THREADS + 1}: expected at most {MAX_THREADS}"),
    ("threads=1000000", f"threads=1000000: expected at most {MAX_THREADS}"),
    (f"seed={2**70}", f"seed={2**70}: expected at most {MAX_SEED}"),
    (f"seed={MAX_SEED + 1}", f"seed={MAX_SEED + 1}: expected at most {MAX_SEED}"),
    (f"sample_seed={2**64}", f"sample_seed={2**64}: expected at most {MAX_SEED}"),
    ("shard.count=2.5", "shard.count=2.5: expected a whole number of shards >= 1"),
    ("shard.index=0.5", "shard.index=0.5: expected a whole shard number >= 0"),
    ("+foo=1", "unknown config key(s) foo: nothing reads them"),
    ("+generation.bogus=2", "unknown config key(s) generation.bogus: nothing reads them"),
    ("generation.continuation_frames=1000000000",
     f"generation.continuation_frames=1000000000: expected at most {MAX_CONTINUATION_FRAMES}"),
    ("label=../../evil", "label=../../evil: holds '/', which is a path separator"),
    ("label=a|b", "label=a|b: holds '|', which separates a markdown table's cells"),
    ("label=..x", "label=..x: holds '..', which names a parent folder"),
    ("data.root=/", "data.root=/: the file system's root, not a dataset folder"),
    ("data.root=/dev/zero", "data.root=/dev/zero: not a folder"),
])
def test_run_refuses_in_one_line(capsys, tmp_path, override, said):
    line = _refused(capsys, *RUN, f"out_dir={tmp_path / 'runs'}", override)
    assert said in line
    assert not (tmp_path / "runs").exists()  # refused before any work


def test_a_file_as_data_root_is_refused(capsys, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("not a dataset")
    assert f"data.root={data}: not a folder" in _refused(capsys, *RUN, f"out_dir={tmp_path}", f"data.root={data}")


def test_the_largest_seed_and_threads_are_accepted(capsys):
    from cmbench.spec import thread_count, whole

    assert whole(MAX_SEED, "seed", 0, maximum=MAX_SEED) == MAX_SEED
    assert thread_count(MAX_THREADS) == MAX_THREADS and thread_count(None) is None
    with pytest.raises(ConfigError, match="threads=0: expected a whole number of torch threads >= 1"):
        thread_count(0)


@pytest.mark.parametrize("argv, said", [
    (("check", "check.context_chunks=100000"), "check.context_chunks=100000: expected at most 64"),
    (("check", "check.continuation_chunks=65"), "check.continuation_chunks=65: expected at most 64"),
    (("plan", "generation.continuation_frames=1000000000"),
     f"generation.continuation_frames=1000000000: expected at most {MAX_CONTINUATION_FRAMES}"),
])
def test_check_and_plan_refuse_sizes_above_their_limits_before_any_work(capsys, argv, said):
    assert said in _refused(capsys, *argv)


@pytest.mark.parametrize("command", ["leaderboard", "report"])
def test_allow_mixed_must_be_a_boolean(capsys, tmp_path, command):
    out = "leaderboard.out" if command == "leaderboard" else "report.out"
    line = _refused(capsys, command, f"runs=[{tmp_path}]", f"{out}={tmp_path / 'o'}", "leaderboard.allow_mixed=maybe")
    assert "leaderboard.allow_mixed='maybe': expected true or false" in line


@pytest.mark.parametrize("label", ["a\x00b", "a\nb", "a\rb", "red\x1b[31m", "a\u2028b"])
def test_labels_with_control_characters_are_refused(label):
    with pytest.raises(ConfigError, match="holds the control character") as err:
        check_label(label)
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value) and "\x00" not in str(err.value)


def test_a_received_label_is_shown_with_its_control_characters_escaped():
    assert safe_label("a\x00b\nc\r\x1b[31mred") == "a\\x00b\\nc\\r\\x1b[31mred"
    assert safe_label("decoprune@gamma=0.2") == "decoprune@gamma=0.2"


def _received_run(folder: Path, label: str) -> Path:
    folder.mkdir(parents=True)
    row = {"task_id": "t1", "status": "ok", "kind": "score", "label": label, "score": 0.5, "context_id": "c",
           "source": "real", "task_type": "revisit", "scorer_hash": "h", "metric": "light", "schema_version": 5,
           "recorded_ns": 1}
    (folder / "records.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "run.json").write_text(json.dumps({"label": label}) + "\n")
    return folder


def test_labels_read_from_a_received_folder_are_made_safe(tmp_path):
    from cmbench.report.reading import read_records

    run = read_records(_received_run(tmp_path / "a", "evil\x1b[2J\nrow"))
    assert run.label == "evil\\x1b[2J\\nrow" and set(run.frame["label"]) == {"evil\\x1b[2J\\nrow"}


def test_labels_differing_only_in_case_are_one_label_made_distinct(tmp_path, capsys):
    from cmbench.report.leaderboard import leaderboard, load_runs

    runs = load_runs([_received_run(tmp_path / "first", "Mine"), _received_run(tmp_path / "second", "mine")])
    labels = [r.label for r in runs]
    assert labels == ["Mine[first]", "mine[second]"]
    board = leaderboard(runs)
    assert len({m.casefold() for m in board["method"]}) == 2 and isinstance(board, pd.DataFrame)


# ------------------------------------------------------------------ Ctrl-C

INTERRUPTIBLE = """
import sys, time
from pathlib import Path
import cmbench.cli.main
from cmbench.data import Reference, Task
from cmbench.runs.runner import run_tasks

class Slow:
    calls = 0
    def prepare(self, tasks):
        return None
    def evaluate(self, task, prepared, seed):
        Slow.calls += 1
        if Slow.calls > 2:
            Path(sys.argv[2]).write_text("waiting")
            time.sleep(120)
        return {"score": 0.5}

ref = Reference(timestamp_seconds=0.0, bbox_xyxy_normalized=[0.1, 0.1, 0.5, 0.5], frame_index=0)
tasks = [Task(task_id=f"t{i}", source="real", scene="s", video=f"v{i}.mp4", context_clip_prompts=("p",) * 6,
              continue_prompt="c", task_type="revisit", target_label="mug", target_aliases=(), references=(ref,))
         for i in range(4)]
cli = sys.modules["cmbench.cli.main"]  # the module (the package exports its main function under the name)
cli._main = lambda argv: run_tasks(tasks, Slow(), Path(sys.argv[1]), global_seed=0,
                                   base_record={"kind": "run", "label": "x"}, show_progress=False) and 0
raise SystemExit(cli.main([]))
"""


def test_ctrl_c_during_a_run_is_one_line_saying_what_was_kept(tmp_path):
    run_dir, waiting = tmp_path / "run", tmp_path / "waiting"
    run_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE, str(run_dir), str(waiting)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 120
    while not waiting.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert waiting.exists(), proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        "cmbench: interrupted; 2 records kept; rerun to resume")
    assert len((run_dir / "records.jsonl").read_text().splitlines()) == 2
