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
from cmbench.runs.records import RecordWriter, read_all_records
from cmbench.hashing import task_seed
from cmbench.runs.runner import select_tasks, shard_tasks, summarise, run_tasks
from fake_evaluator import FakeEvaluator
from official_fixture import build_official_layout

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    root = tmp_path_factory.mktemp("official")
    build_official_layout(root)
    return root, load_manifest(root, check_videos=False)


def canonical(records):
    """Records without what legitimately differs between runs, keyed and sorted by task."""
    return sorted((json.dumps({k: v for k, v in r.items() if k != "traceback"}, sort_keys=True) for r in records))


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
    summary = summarise(tmp_path, [t.task_id for t in subset])
    assert summary["tasks_failed"] == 3 and summary["tasks_ok"] == 6 and summary["missing_task_ids"] == []
    # rerun: only the failed tasks run again, and now succeed
    again = run_tasks(subset, FakeEvaluator(), tmp_path, global_seed=7, base_record={"label": "fake"},
                      show_progress=False)
    assert (again.done, again.cached, again.failed) == (3, 6, 0)
    assert summarise(tmp_path, [t.task_id for t in subset])["tasks_failed"] == 0


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
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    clean = tmp_path / "clean"
    subprocess.run([sys.executable, script, str(root), str(clean), "0"], check=True, env=env, timeout=120)
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
    subprocess.run([sys.executable, script, str(root), str(killed), "0"], check=True, env=env, timeout=120)
    records = read_all_records(killed)
    assert len(records) == len(tasks) == 116  # no duplicates
    assert canonical(records) == canonical(read_all_records(clean))
