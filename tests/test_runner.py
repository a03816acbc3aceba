"""The task loop: seeds, selection, sharding, resume after SIGKILL, failure isolation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from cmbench.data import load_manifest
from cmbench.errors import ConfigError
from cmbench.runs.records import RecordWriter, read_all_records, read_task_records
from cmbench.hashing import task_seed
from cmbench.runs.runner import select_tasks, shard_tasks, run_tasks
from cmbench.runs.summary import summarise
import fake_evaluator
from fake_evaluator import FakeEvaluator
from official_fixture import build_official_layout

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    root = tmp_path_factory.mktemp("official")
    build_official_layout(root)
    return root, load_manifest(root, check_videos=False)


def canonical(records):
    """Records without what legitimately differs between runs (tracebacks, when each was written),
    keyed and sorted by task."""
    return sorted(json.dumps({k: v for k, v in r.items() if k not in ("traceback", "recorded_ns")}, sort_keys=True)
                  for r in records)


def test_task_seed_is_stable_and_distinct():
    assert task_seed(0, "syn_001_reappear_01") == task_seed(0, "syn_001_reappear_01")
    assert task_seed(0, "syn_001_reappear_01") != task_seed(1, "syn_001_reappear_01")
    assert len({task_seed(0, f"t{i}") for i in range(1000)}) == 1000
    assert 0 <= task_seed(3, "x") < 2**31


def test_limit_is_a_seeded_stratified_sample(official):
    _, tasks = official
    pick = select_tasks(tasks, limit=10, seed=0)
    assert len(pick) == 10
    assert pick == select_tasks(tasks, limit=10, seed=0)
    assert pick != select_tasks(tasks, limit=10, seed=1)
    strata = Counter((t.source, t.task_type) for t in pick)
    # proportional shares of 10 from 67/35/10/4 of 116: 5.78, 3.02, 0.86, 0.34 -> 6, 3, 1, 0
    assert strata == {("synthetic", "reappear"): 6, ("synthetic", "revisit"): 3, ("real", "reappear"): 1}
    assert [t.line for t in pick] == sorted(t.line for t in pick)  # manifest order kept
    assert pick != tasks[:10]


def test_task_ids_pick_and_unknown_ids_are_named(official):
    _, tasks = official
    assert [t.task_id for t in select_tasks(tasks, task_ids=["real_002_reappear_01", "syn_001_reappear_01"])] == [
        "syn_001_reappear_01",
        "real_002_reappear_01",
    ]
    with pytest.raises(ConfigError, match=r"'syn_001_reapear_01' \(did you mean 'syn_001_reappear_01'\?\)"):
        select_tasks(tasks, task_ids=["syn_001_reapear_01"])


def test_shards_partition_whole_contexts(official):
    _, tasks = official
    shards = [shard_tasks(tasks, 3, i) for i in range(3)]
    ids = [t.task_id for s in shards for t in s]
    assert sorted(ids) == sorted(t.task_id for t in tasks)
    contexts = [{t.context_id for t in s} for s in shards]
    assert not (contexts[0] & contexts[1]) and not (contexts[1] & contexts[2])
    with pytest.raises(ConfigError):
        shard_tasks(tasks, 2, 2)


def test_failures_are_recorded_and_the_run_goes_on(official, tmp_path):
    _, tasks = official
    subset = tasks[:9]  # contexts syn_001..syn_004
    ev = FakeEvaluator(fail_on="syn_002_revisit", fail_prepare_on="syn_003")
    result = run_tasks(subset, ev, tmp_path, global_seed=7, base_record={"label": "fake"}, show_progress=False)
    records = read_all_records(tmp_path)
    status = {r["task_id"]: r["status"] for r in records}
    assert len(records) == 9 and result.done == 9
    failed = sorted(k for k, v in status.items() if v == "failed")
    assert failed == ["syn_002_revisit_03", "syn_003_reappear_01", "syn_003_reappear_02"]
    assert result.failed == 3
    err = {r["task_id"]: r["error"] for r in records}
    assert err["syn_002_revisit_03"] == "ValueError: boom on syn_002_revisit_03"
    assert err["syn_003_reappear_01"] == "RuntimeError: cannot prefill videos/synthetic/syn_003"
    assert ev.prepared == ["videos/synthetic/syn_001", "videos/synthetic/syn_002", "videos/synthetic/syn_004"]
    summary = summarise(read_task_records(tmp_path), [t.task_id for t in subset])
    assert summary["tasks_failed"] == 3 and summary["tasks_ok"] == 6 and summary["missing_task_ids"] == []
    # rerun: only the failed tasks run again, and now succeed
    again = run_tasks(subset, FakeEvaluator(), tmp_path, global_seed=7, base_record={"label": "fake"},
                      show_progress=False)
    assert (again.done, again.cached, again.failed) == (3, 6, 0)
    assert summarise(read_task_records(tmp_path), [t.task_id for t in subset])["tasks_failed"] == 0


def test_two_shards_equal_one_process(official, tmp_path):
    _, tasks = official
    subset = tasks[:20]
    run_tasks(subset, FakeEvaluator(), tmp_path / "one", global_seed=7, base_record={"label": "fake"},
              show_progress=False)
    for i in range(2):
        run_tasks(subset, FakeEvaluator(), tmp_path / "two", global_seed=7, base_record={"label": "fake"},
                  shard=(2, i), show_progress=False)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [
        "records.shard-0-of-2.jsonl",
        "records.shard-1-of-2.jsonl",
    ]
    assert canonical(read_all_records(tmp_path / "one")) == canonical(read_all_records(tmp_path / "two"))


def test_torn_last_line_is_cut_off(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"task_id": "a", "status": "ok"}\n{"task_id": "b", "sta')
    RecordWriter(path).write({"task_id": "c", "status": "ok"})
    assert [r["task_id"] for r in read_all_records(tmp_path)] == ["a", "c"]


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_clean_run(official, tmp_path):
    root, tasks = official
    script = str(HERE / "fake_evaluator.py")
    env = child_env()
    clean = tmp_path / "clean"
    fake_evaluator.main([str(root), str(clean), "0"])  # the script's run, in this process: only the killed one needs its own
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, script, str(root), str(killed), "0.03"], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        path = killed / "records.jsonl"
        if path.exists() and path.read_text().count("\n") >= 20:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    partial = len(read_all_records(killed))
    assert 20 <= partial < len(tasks)
    fake_evaluator.main([str(root), str(killed), "0"])  # resumed in this process
    records = read_all_records(killed)
    assert len(records) == len(tasks) == 116  # no duplicates
    assert canonical(records) == canonical(read_all_records(clean))


def child_env() -> dict:
    """Environment of a child process that imports the checkout under test (then the test helpers)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}


def test_children_import_the_checkout_under_test():
    out = subprocess.run([sys.executable, "-c", "import cmbench, fake_evaluator; print(cmbench.__file__)"],
                         env=child_env(), capture_output=True, text=True, check=True, cwd="/")
    assert Path(out.stdout.strip()).resolve() == (HERE.parent / "cmbench" / "__init__.py").resolve()


def test_a_torn_tail_left_by_a_crash_never_wedges_the_run(official, tmp_path):
    """Disk full mid-record: the last line of a shard file is torn. Every later reader and the rerun
    of every shard go on, and the resumed run equals a clean one."""
    _, tasks = official
    subset = tasks[:12]
    clean = tmp_path / "clean"
    run_tasks(subset, FakeEvaluator(), clean, global_seed=7, base_record={"label": "fake"}, show_progress=False)
    crashed = tmp_path / "crashed"
    for i in range(2):
        run_tasks(subset, FakeEvaluator(), crashed, global_seed=7, base_record={"label": "fake"}, shard=(2, i),
                  show_progress=False)
    shard0 = crashed / "records.shard-0-of-2.jsonl"
    lines = shard0.read_text().splitlines(keepends=True)
    shard0.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # the crash tore the last record
    assert len(read_all_records(crashed)) == 11  # readers skip the torn line instead of failing
    again = run_tasks(subset, FakeEvaluator(), crashed, global_seed=7, base_record={"label": "fake"}, shard=(2, 1),
                      show_progress=False)  # the other shard reads the torn file and is not wedged
    assert (again.done, again.failed) == (0, 0)
    resumed = run_tasks(subset, FakeEvaluator(), crashed, global_seed=7, base_record={"label": "fake"},
                        shard=(2, 0), show_progress=False)
    assert resumed.done == 1
    assert canonical(read_all_records(crashed)) == canonical(read_all_records(clean))


def test_a_newer_retry_wins_over_an_older_failure_in_another_file(official, tmp_path):
    """A failure in records.shard-*.jsonl must not hide a later success in records.jsonl."""
    from cmbench.report import read_records

    _, tasks = official
    subset = tasks[:6]
    for i in range(2):
        run_tasks(subset, FakeEvaluator(fail_on="syn_001_reappear_01"), tmp_path, global_seed=7,
                  base_record={"label": "fake"}, shard=(2, i), show_progress=False)
    retry = run_tasks(subset, FakeEvaluator(), tmp_path, global_seed=7, base_record={"label": "fake"},
                      show_progress=False)
    assert (retry.done, retry.cached, retry.failed) == (1, 5, 0)  # the failed task ran again, in records.jsonl
    frame = read_records(tmp_path).frame.set_index("task_id")
    assert frame.loc["syn_001_reappear_01", "status"] == "ok"
    assert (frame["status"] == "ok").all()
    third = run_tasks(subset, FakeEvaluator(), tmp_path, global_seed=7, base_record={"label": "fake"},
                      show_progress=False)
    assert third.done == 0


@pytest.mark.slow
def test_two_processes_on_one_run_directory_do_not_both_run(official, tmp_path):
    root, tasks = official
    script = str(HERE / "fake_evaluator.py")
    hold = tmp_path.parent / f"{tmp_path.name}.hold"  # the first run waits after its first task while it exists
    hold.touch()
    first = subprocess.Popen([sys.executable, script, str(root), str(tmp_path), "0"],
                             env={**child_env(), "FAKE_EVALUATOR_HOLD": str(hold)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "records.jsonl").exists():
        time.sleep(0.01)
    second = subprocess.run([sys.executable, script, str(root), str(tmp_path), "0"], env=child_env(),
                            capture_output=True, text=True, timeout=120)
    first_still_running = first.poll() is None
    hold.unlink()
    assert second.returncode != 0, "the second process ran too"
    assert f"is in use: process {first.pid} is writing records.jsonl" in second.stderr
    assert first_still_running
    assert first.wait(timeout=120) == 0
    records = read_all_records(tmp_path)
    assert len(records) == len({r["task_id"] for r in records}) == len(tasks)  # nothing twice
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl"]  # no lock left behind


class ConfigBreaksEvaluator(FakeEvaluator):
    """A context whose preparation rejects the configuration (e.g. a knob beyond the schedule)."""

    def prepare(self, tasks):
        raise ConfigError("decoprune: probe_step=9 must name a step before the last of the 4 timesteps")


def test_a_config_error_stops_the_run_instead_of_failing_every_task(official, tmp_path):
    _, tasks = official
    with pytest.raises(ConfigError, match="probe_step=9"):
        run_tasks(tasks, ConfigBreaksEvaluator(), tmp_path, global_seed=7, base_record={"label": "fake"},
                  show_progress=False)
    assert read_all_records(tmp_path) == []


def test_selection_rejects_an_empty_task_list_and_non_positive_limits(official):
    _, tasks = official
    with pytest.raises(ConfigError, match=r"task_ids=\[\] selects no task"):
        select_tasks(tasks, task_ids=[])
    for bad in (0, -3):
        with pytest.raises(ConfigError, match="limit must be a positive number of tasks"):
            select_tasks(tasks, limit=bad)


def test_records_from_other_code_are_recomputed_or_kept_and_named(official, tmp_path):
    _, tasks = official
    subset = tasks[:6]
    first = run_tasks(subset, FakeEvaluator(), tmp_path, global_seed=7, show_progress=False,
                      base_record={"label": "fake", "code_hash": "old", "code": {"method": "a"}})
    assert first.done == 6
    same = run_tasks(subset, FakeEvaluator(), tmp_path, global_seed=7, show_progress=False,
                     base_record={"label": "fake", "code_hash": "old", "code": {"method": "a"}})
    assert (same.done, same.cached, same.recomputed, same.other_code) == (0, 6, [], [])
    kept = run_tasks(subset, FakeEvaluator(), tmp_path, global_seed=7, show_progress=False, keep_other_code=True,
                     base_record={"label": "fake", "code_hash": "new", "code": {"method": "b"}})
    ids = [t.task_id for t in subset]
    assert (kept.done, kept.cached, kept.recomputed) == (0, 6, [])
    assert sorted(kept.other_code) == sorted(ids) and kept.previous_code[ids[0]] == {"method": "a"}
    summary = summarise(read_task_records(tmp_path), ids, code_hash="new")
    assert summary["tasks_other_code"] == 6 and summary["other_code_task_ids"] == sorted(ids)
    edited = run_tasks(subset, FakeEvaluator(), tmp_path, global_seed=7, show_progress=False,
                       base_record={"label": "fake", "code_hash": "new", "code": {"method": "b"}})
    assert (edited.done, edited.cached) == (6, 0) and sorted(edited.recomputed) == sorted(ids)
    assert summarise(read_task_records(tmp_path), ids, code_hash="new")["tasks_other_code"] == 0
    assert {r.code_hash for r in read_task_records(tmp_path)[-6:]} == {"new"}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_lines_every_n_tasks_or_seconds_with_the_mean_of_cached_tasks_too():
    import io

    from cmbench.runs.progress import Progress
    from cmbench.runs.records import TaskRecord

    cached = [TaskRecord(task_id=f"c{i}", status="ok", score=s) for i, s in enumerate([0.9, 0.7])]
    stream, clock = io.StringIO(), Clock()
    progress = Progress("run", 7, cached, bar=False, every_tasks=2, every_seconds=60, stream=stream, clock=clock)
    for i, score in enumerate([0.2, 0.4, None, 0.6, 0.1]):
        clock.now += 5.0
        progress.update(TaskRecord(task_id=f"t{i}", status="ok" if score is not None else "failed", score=score))
        if i == 3:
            clock.now += 100.0  # a slow task: a line after the next one, though it is not the 2nd
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "run: 2/7 tasks (2 cached, 0 failed), mean score 0.8000; 5 to run, 2 cached"
    # after 2 tasks: mean over the cached 0.9, 0.7 and the new 0.2, 0.4 = 0.55 (not 0.3)
    assert lines[1].startswith("run: 4/7 tasks (2 cached, 0 failed), mean score 0.5500, 5.0 s/task, 10s elapsed")
    assert lines[2].startswith("run: 6/7 tasks (2 cached, 1 failed), mean score 0.5600")
    assert lines[3].startswith("run: 7/7 tasks (2 cached, 1 failed), mean score 0.4833") and "~0s left" in lines[3]
    assert lines[3].endswith("; done")  # however long the last task took: the line a page can show as printed
    assert len(lines) == 4  # the last task's line is the last line (no repeat when the run closes)


def test_run_tasks_prints_progress_lines_without_a_bar(official, tmp_path, capsys):
    _, tasks = official
    run_tasks(tasks[:5], FakeEvaluator(), tmp_path, global_seed=7, base_record={"label": "fake"},
              show_progress=False, progress_every=2)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[1].split(" tasks")[0] for line in lines] == ["0/5", "2/5", "4/5", "5/5"]


def test_a_rerun_after_an_edit_says_why_it_recomputes_before_it_starts(official, tmp_path, capsys):
    _, tasks = official
    subset = tasks[:2]
    run_tasks(subset, FakeEvaluator(), tmp_path, global_seed=7, show_progress=False,
              base_record={"label": "fake", "code_hash": "old", "code": {"method": "a", "cmbench": "x"}})
    capsys.readouterr()

    class Announcing(FakeEvaluator):
        def evaluate(self, task, prepared, seed):
            print(f"evaluating {task.task_id}", file=sys.stderr)
            return super().evaluate(task, prepared, seed)

    run_tasks(subset, Announcing(), tmp_path, global_seed=7, show_progress=False,
              base_record={"label": "fake", "code_hash": "new", "code": {"method": "b", "cmbench": "x"}})
    err = capsys.readouterr().err
    said = f"{tmp_path.name}: 2 task(s) will be recomputed: their records came from other code (method source)"
    assert said in err and err.index(said) < err.index("evaluating")
