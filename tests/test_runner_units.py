"""The task loop piece by piece, with hand-built tasks and a scripted evaluator (no model, no manifest on disk):
task selection (named ids, the stratified sample's quotas worked out by hand), sharding and torchrun's shards,
which tasks count as finished, and a run's bookkeeping: one record per task with its seed and fields, a failing
task or context that does not lose the others, a configuration error that stops the run, the lock, resume and
recomputation after a code change, the progress lines and the counts :class:`RunResult` reports."""

from __future__ import annotations

import functools
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from cmbench.data.task import Task
from cmbench.errors import ConfigError
from cmbench.hashing import task_seed
from cmbench.lock import RunLock, RunLockedError
from cmbench.runs import runner
from cmbench.runs.progress import Progress
from cmbench.runs.records import RecordsWriteError, RecordWriter, read_task_records, records_path
from cmbench.runs.runner import finished_task_ids, run_tasks, select_tasks, shard_tasks
from cmbench.spec import check_shard, shard_from_env
from fake_evaluator import FakeEvaluator


def _task(task_id: str, context: str = "c0", source: str = "synthetic", task_type: str = "reappear") -> Task:
    """A task of context ``videos/<context>`` (its video ``videos/<context>.mp4``); other fields are filler.

    Parameters
    ----------
    task_id : str
    context : str
        The context's name; tasks with one name share a context.
    source, task_type : str
        The stratum of the task (official values).
    """
    return Task(task_id=task_id, source=source, scene="s", video=f"videos/{context}.mp4",
                context_clip_prompts=("p",) * 6, continue_prompt="go on", task_type=task_type, target_label="cup",
                target_aliases=(), references=())


def _ids(tasks) -> list[str]:
    return [t.task_id for t in tasks]


class Scripted(FakeEvaluator):
    """A :class:`FakeEvaluator` with a fixed score per task (0.5 by default), that logs what it is asked.

    Parameters
    ----------
    scores : dict, optional
        ``task_id -> score``.
    config_error_on : str, optional
        ``evaluate`` raises a :class:`ConfigError` for this task id.
    tick : callable, optional
        Called at every ``evaluate`` (advances a fake clock).
    **kwargs
        As :class:`FakeEvaluator` (``fail_on``, ``fail_prepare_on``).

    Attributes
    ----------
    calls : list of (task_id, seed)
        Every ``evaluate`` call, in order.
    """

    def __init__(self, scores=None, config_error_on=None, tick=None, **kwargs):
        super().__init__(**kwargs)
        self.scores, self.config_error_on, self.tick = scores or {}, config_error_on, tick
        self.calls: list[tuple[str, int]] = []

    def evaluate(self, task, prepared, seed):
        self.calls.append((task.task_id, seed))
        if self.tick is not None:
            self.tick()
        if task.task_id == self.config_error_on:
            raise ConfigError(f"bad knob met at {task.task_id}")
        fields = super().evaluate(task, prepared, seed)
        return {**fields, "score": self.scores.get(task.task_id, 0.5)}


def _run(tasks, evaluator, run_dir: Path, **kwargs):
    """``run_tasks`` with global seed 7, no bar and ``base_record={"label": "fake"}`` unless given."""
    kwargs.setdefault("base_record", {"label": "fake"})
    kwargs.setdefault("show_progress", False)
    return run_tasks(tasks, evaluator, run_dir, global_seed=7, **kwargs)


def _write(run_dir: Path, *records: dict, name: str = "records.jsonl") -> None:
    """Append records (``task_id``, ``status`` and any other field) to ``run_dir/name``, oldest first."""
    writer = RecordWriter(run_dir / name)
    for record in records:
        writer.write(record)


# ------------------------------------------------------------------------------------------- selection
# 10 tasks, strata (sorted) A = (real, reappear) x6, B = (synthetic, reappear) x3, C = (synthetic, revisit) x1,
# interleaved in manifest order.
_STRATA = {"A": ("real", "reappear"), "B": ("synthetic", "reappear"), "C": ("synthetic", "revisit")}
_ORDER = ["A", "B", "A", "C", "A", "B", "A", "A", "B", "A"]
TEN = [_task(f"t{i}_{s}", f"c{i}", *_STRATA[s]) for i, s in enumerate(_ORDER)]


def _strata(tasks) -> dict[str, int]:
    names = {v: k for k, v in _STRATA.items()}
    return dict(Counter(names[(t.source, t.task_type)] for t in tasks))


def test_named_tasks_come_in_manifest_order_once_each():
    assert _ids(select_tasks(TEN, task_ids=["t5_B", "t0_A", "t5_B", "t3_C"])) == ["t0_A", "t3_C", "t5_B"]


def test_unknown_task_ids_are_all_named_with_the_closest_match_when_there_is_one():
    with pytest.raises(ConfigError) as err:
        select_tasks(TEN, task_ids=["t0_A", "t5_b", "zzz", "zzz"])
    assert str(err.value) == "task_ids not in the manifest: 't5_b' (did you mean 't5_B'?), 'zzz'"


@pytest.mark.parametrize("empty", [[], ()])
def test_an_empty_list_of_task_ids_is_refused_not_read_as_all(empty):
    with pytest.raises(ConfigError) as err:
        select_tasks(TEN, task_ids=empty)
    assert str(err.value) == "task_ids=[] selects no task; name some tasks, or leave task_ids unset to run all"


@pytest.mark.parametrize("bad", [0, -1])
def test_a_limit_below_one_is_refused(bad):
    with pytest.raises(ConfigError) as err:
        select_tasks(TEN, limit=bad)
    assert str(err.value) == f"limit must be a positive number of tasks, got {bad}"


@pytest.mark.parametrize("limit", [None, 10, 11])
def test_no_limit_or_one_of_at_least_every_task_keeps_them_all(limit):
    assert select_tasks(TEN, limit=limit) == TEN


def test_a_limit_applies_after_the_named_tasks():
    picked = select_tasks(TEN, task_ids=["t0_A", "t1_B", "t2_A"], limit=1)
    assert len(picked) == 1 and picked[0].task_id in {"t0_A", "t1_B", "t2_A"}
    assert select_tasks(TEN, task_ids=["t0_A", "t1_B"], limit=2) == TEN[:2]


def test_the_largest_remainder_gets_the_extra_task_not_the_largest_stratum():
    # limit 7 of 10: quotas A 7*6/10 = 4.2, B 7*3/10 = 2.1, C 7*1/10 = 0.7 -> whole parts 4, 2, 0 (6 tasks);
    # the 7th goes to the largest remainder: C (0.7 > 0.2 > 0.1)
    for seed in range(4):
        assert _strata(select_tasks(TEN, limit=7, seed=seed)) == {"A": 4, "B": 2, "C": 1}


def test_equal_remainders_go_to_the_first_stratum_in_sorted_order():
    # limit 5 of 10 (A 6, B 3, C 1): quotas 3.0, 1.5, 0.5 -> 3, 1, 0 (4 tasks); B and C tie at 0.5: B, the
    # first of (synthetic, reappear) < (synthetic, revisit), gets the 5th
    assert _strata(select_tasks(TEN, limit=5)) == {"A": 3, "B": 2}


def test_a_sample_is_seeded_distinct_and_in_manifest_order():
    default = select_tasks(TEN, limit=6)
    assert default == select_tasks(TEN, limit=6, seed=0)
    assert select_tasks(TEN, limit=6, seed=1) != default
    for seed in range(25):
        picked = select_tasks(TEN, limit=6, seed=seed)
        assert len(set(_ids(picked))) == 6, f"seed {seed}: a task drawn twice"
        assert picked == [t for t in TEN if t in picked], f"seed {seed}: manifest order lost"


# -------------------------------------------------------------------------------------------- sharding
# contexts in order of first appearance: c0, c1, c2, c3, c4
SHARDED = [_task("a", "c0"), _task("b", "c1"), _task("c", "c0"), _task("d", "c2"), _task("e", "c3"),
           _task("f", "c4"), _task("g", "c1")]


@pytest.mark.parametrize("count,index,want", [
    (1, 0, ["a", "b", "c", "d", "e", "f", "g"]),
    (2, 0, ["a", "c", "d", "f"]),  # contexts c0, c2, c4
    (2, 1, ["b", "e", "g"]),  # contexts c1, c3
    (3, 2, ["d"]),  # context c2
])
def test_shards_deal_whole_contexts_round_robin_keeping_manifest_order(count, index, want):
    assert _ids(shard_tasks(SHARDED, count, index)) == want


@pytest.mark.parametrize("count,index", [(1, 0), (3, 0), (3, 2)])
def test_a_shard_inside_its_count_is_accepted(count, index):
    check_shard(count, index)


@pytest.mark.parametrize("count,index", [(0, 0), (2, 2), (2, -1), (-1, -1)])
def test_a_shard_outside_its_count_is_refused_naming_both(count, index):
    with pytest.raises(ConfigError) as err:
        shard_tasks(SHARDED, count, index)
    assert str(err.value) == f"shard.index must be in [0, shard.count), got index={index} count={count}"


@pytest.fixture
def torchrun(monkeypatch):
    """Set (or, with None, unset) torchrun's ``WORLD_SIZE`` and ``RANK``; both start unset."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)

    def set_env(world: int | None, rank: int | None = None) -> None:
        for name, value in (("WORLD_SIZE", world), ("RANK", rank)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(value))

    return set_env


def _exact(shard: tuple) -> tuple:
    """A shard with its types, so ``4.0`` does not pass for ``4``."""
    return tuple((type(v).__name__, v) for v in shard)


def test_without_torchrun_the_configured_shard_stands(torchrun):
    assert shard_from_env(3, 2, 4) == (3, 2)


def test_torchrun_groups_become_the_shards_when_none_is_configured(torchrun):
    torchrun(8, 5)
    assert _exact(shard_from_env(1, 0)) == _exact((8, 5))  # one rank per model by default
    assert _exact(shard_from_env(1, 0, 2)) == _exact((4, 2))  # 8 // 2 groups, rank 5 in group 5 // 2
    assert _exact(shard_from_env(1, 0, 4)) == _exact((2, 1))
    torchrun(6)  # no RANK: rank 0
    assert _exact(shard_from_env(1, 0, 3)) == _exact((2, 0))


def test_a_configured_shard_stands_when_torchrun_runs_one_group(torchrun):
    torchrun(2, 1)
    assert shard_from_env(3, 1, 2) == (3, 1)


def test_a_configured_shard_and_several_torchrun_groups_are_refused(torchrun):
    torchrun(4, 0)
    with pytest.raises(ConfigError) as err:
        shard_from_env(3, 1, 2)
    assert str(err.value) == ("shard.count=3 and torchrun's 2 groups of parallel.sequence=2 ranks both shard the "
                              "tasks: set one of them")


def test_a_group_size_that_does_not_divide_torchruns_processes_is_refused(torchrun):
    torchrun(6, 0)
    with pytest.raises(ConfigError) as err:
        shard_from_env(1, 0, 4)
    assert str(err.value) == ("parallel.sequence=4 does not divide torchrun's 6 processes (WORLD_SIZE): each model "
                              "needs a whole group of 4 ranks")


# ---------------------------------------------------------------------------------------- finished tasks
def test_finished_tasks_are_those_whose_latest_record_succeeded_with_this_code(tmp_path):
    _write(tmp_path,
           {"task_id": "ok", "status": "ok", "code_hash": "h"},
           {"task_id": "failed", "status": "failed", "code_hash": "h"},
           {"task_id": "then_failed", "status": "ok", "code_hash": "h"},
           {"task_id": "then_failed", "status": "failed", "code_hash": "h"},
           {"task_id": "retried", "status": "failed", "code_hash": "h"},
           {"task_id": "other", "status": "ok", "code_hash": "old"},
           {"task_id": "no_hash", "status": "ok"})
    _write(tmp_path, {"task_id": "retried", "status": "ok", "code_hash": "h"}, name="records.shard-1-of-2.jsonl")
    assert finished_task_ids(tmp_path, "h") == {"ok", "retried"}
    assert finished_task_ids(tmp_path, "h", keep_other_code=True) == {"ok", "retried", "other", "no_hash"}
    assert finished_task_ids(tmp_path) == {"no_hash"}  # no code hash asked: records without one


# ------------------------------------------------------------------------------------------------- runs
def test_each_record_carries_the_base_fields_the_task_its_seed_and_the_evaluation(tmp_path):
    ev = Scripted(scores={"b": 0.25})
    tasks = [_task("a", "c0", "real", "revisit"), _task("b", "c1")]
    result = _run(tasks, ev, tmp_path, base_record={"label": "L", "code_hash": "h", "pr": 0.9})
    assert ev.calls == [("a", task_seed(7, "a")), ("b", task_seed(7, "b"))]
    (a, b) = read_task_records(tmp_path)
    assert (a.task_id, a.context_id, a.source, a.task_type) == ("a", "videos/c0", "real", "revisit")
    assert (b.task_id, b.context_id, b.source, b.task_type) == ("b", "videos/c1", "synthetic", "reappear")
    assert (a.seed, b.seed) == (task_seed(7, "a"), task_seed(7, "b"))
    assert (a.status, a.label, a.code_hash, a.score, b.score) == ("ok", "L", "h", 0.5, 0.25)
    assert (a.pr, a.error, a.traceback) == (0.5, None, None)  # the evaluation's fields win over the base record's
    assert (result.run_dir, result.done, result.cached, result.failed) == (tmp_path, 2, 0, 0)
    assert (result.recomputed, result.other_code, result.previous_code) == ([], [], {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl"]  # one file, no lock left


def test_a_failing_task_or_context_is_recorded_and_the_others_still_run(tmp_path):
    tasks = [_task("a1", "ca"), _task("b1", "cb"), _task("a2", "ca"), _task("c1", "cc"), _task("b2", "cb"),
             _task("d1", "cd")]
    ev = Scripted(fail_on="a2", fail_prepare_on="cb")
    result = _run(tasks, ev, tmp_path)
    assert ev.prepared == ["videos/ca", "videos/cc", "videos/cd"]  # once per context, in order of first appearance
    assert [c[0] for c in ev.calls] == ["a1", "a2", "c1", "d1"]  # a context's tasks together
    records = {r.task_id: r for r in read_task_records(tmp_path)}
    assert [r.task_id for r in read_task_records(tmp_path)] == ["a1", "a2", "b1", "b2", "c1", "d1"]
    assert {i: r.status for i, r in records.items()} == {"a1": "ok", "a2": "failed", "b1": "failed", "b2": "failed",
                                                         "c1": "ok", "d1": "ok"}
    assert records["a2"].error == "ValueError: boom on a2"
    assert records["b1"].error == records["b2"].error == "RuntimeError: cannot prefill videos/cb"
    assert records["b2"].seed == task_seed(7, "b2") and records["b2"].context_id == "videos/cb"
    assert "raise ValueError" in records["a2"].traceback and records["a1"].traceback is None
    assert (result.done, result.cached, result.failed) == (6, 0, 3)
    again = Scripted()
    rerun = _run(tasks, again, tmp_path)  # only the failed tasks run again, by context in manifest order
    assert [c[0] for c in again.calls] == ["b1", "b2", "a2"]
    assert (rerun.done, rerun.cached, rerun.failed) == (3, 3, 0)


def test_a_failures_traceback_keeps_its_first_eight_entries(tmp_path):
    class Deep(Scripted):
        """Raises 21 calls deep (two functions in turn: no repeated line folded away)."""

        def evaluate(self, task, prepared, seed, depth=20):
            return self.other(task, prepared, seed, depth - 1) if depth else self.fail()

        def other(self, task, prepared, seed, depth):
            return self.evaluate(task, prepared, seed, depth - 1) if depth else self.fail()

        def fail(self):
            raise KeyError("deep")

    _run([_task("a")], Deep(), tmp_path)
    (record,) = read_task_records(tmp_path)
    assert record.error == "KeyError: 'deep'"
    assert record.traceback.startswith("Traceback (most recent call last):\n")
    assert record.traceback.count('  File "') == 8
    assert "in fail" not in record.traceback  # the outermost entries are kept, the innermost cut


@pytest.mark.parametrize("where", ["evaluate", "prepare"])
def test_a_config_error_stops_the_run_keeping_the_records_already_written(tmp_path, where):
    tasks = [_task("a", "c0"), _task("b", "c1"), _task("c", "c2")]

    class Breaks(Scripted):
        def prepare(self, tasks):
            if where == "prepare" and tasks[0].task_id == "b":
                raise ConfigError("bad knob met preparing videos/c1")
            return super().prepare(tasks)

    ev = Breaks(config_error_on="b" if where == "evaluate" else None)
    with pytest.raises(ConfigError, match="bad knob met"):
        _run(tasks, ev, tmp_path)
    assert [(r.task_id, r.status) for r in read_task_records(tmp_path)] == [("a", "ok")]
    assert ev.prepared[-1] != "videos/c2"  # nothing after it ran
    _run(tasks, Scripted(), tmp_path)  # and the lock went with the run
    assert [r.task_id for r in read_task_records(tmp_path)] == ["a", "b", "c"]


def test_a_records_file_that_cannot_be_written_stops_the_run(tmp_path, monkeypatch):
    class DiskFull(RecordWriter):
        """Writes one record, then the disk is full."""

        def write(self, record):
            if self.path.exists():
                raise RecordsWriteError(f"cannot write {self.path}: No space left on device")
            return super().write(record)

    monkeypatch.setattr(runner, "RecordWriter", DiskFull)
    ev = Scripted()
    with pytest.raises(RecordsWriteError, match="No space left"):
        _run([_task("a", "c0"), _task("b", "c0"), _task("c", "c1")], ev, tmp_path)
    assert [c[0] for c in ev.calls] == ["a", "b"]
    assert [r.task_id for r in read_task_records(tmp_path)] == ["a"]


def test_a_shard_runs_its_own_contexts_into_its_own_file(tmp_path):
    ev = Scripted()
    result = _run(SHARDED, ev, tmp_path, shard=(2, 1))
    assert [c[0] for c in ev.calls] == ["b", "g", "e"]  # context c1's tasks together, then c3's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.shard-1-of-2.jsonl"]
    assert result.done == 3
    with pytest.raises(ConfigError, match="got index=2 count=2"):
        _run(SHARDED, ev, tmp_path, shard=(2, 2))


def test_another_writer_of_the_shard_is_refused_at_once_naming_it(tmp_path):
    ev = Scripted()
    with RunLock(records_path(tmp_path)):
        with pytest.raises(RunLockedError, match=f"process {os.getpid()} is writing records.jsonl"):
            _run([_task("a")], ev, tmp_path)
    assert ev.calls == []


def test_a_run_told_to_wait_for_the_lock_keeps_what_the_holder_finished(tmp_path):
    holder = RunLock(records_path(tmp_path)).__enter__()
    waited = []

    def on_wait(who: str) -> None:
        waited.append(who)
        _write(tmp_path, {"task_id": "a", "status": "ok", "score": 0.5})  # the holder finishes a task, then ends
        holder.__exit__(None, None, None)

    ev = Scripted()
    result = _run([_task("a"), _task("b")], ev, tmp_path, on_lock_wait=on_wait)
    assert waited == [f"process {os.getpid()}"]
    assert [c[0] for c in ev.calls] == ["b"]
    assert (result.done, result.cached) == (1, 1)


def _old_code_run(tmp_path: Path, old_code=None) -> list[Task]:
    """Tasks a (context c0), b, c (context c1) whose records come from code ``old`` (``code``: ``old_code``),
    then a failure of c."""
    tasks = [_task("a", "c0"), _task("b", "c1"), _task("c", "c1")]
    _run(tasks, Scripted(), tmp_path, base_record={"label": "x", "code_hash": "old", "code": old_code})
    _write(tmp_path, {"task_id": "c", "status": "failed", "code_hash": "old"})
    return tasks


def test_records_from_other_code_are_recomputed_and_said_so_before_the_work(tmp_path, capsys):
    tasks = _old_code_run(tmp_path, {"method": "m1", "cmbench": "x", "scorer": "s1"})
    capsys.readouterr()

    class Says(Scripted):
        def evaluate(self, task, prepared, seed):
            print(f"evaluating {task.task_id}", file=sys.stderr)
            return super().evaluate(task, prepared, seed)

    ev = Says()
    new = {"cmbench": "x", "scorer": "s2", "method": "m2"}
    result = _run(tasks, ev, tmp_path, base_record={"label": "x", "code_hash": "new", "code": new})
    captured = capsys.readouterr()
    said = (f"{tmp_path.name}: 2 task(s) will be recomputed: their records came from other code "
            f"(method source, scorer)\n")
    assert captured.err.startswith(said + "evaluating a\n")
    assert said not in captured.out
    assert [c[0] for c in ev.calls] == ["a", "b", "c"]
    assert (result.done, result.cached, result.failed) == (3, 0, 0)
    assert (result.recomputed, result.other_code) == (["a", "b"], [])
    assert result.previous_code == {"a": {"method": "m1", "cmbench": "x", "scorer": "s1"},
                                    "b": {"method": "m1", "cmbench": "x", "scorer": "s1"}}
    assert {r.code_hash for r in read_task_records(tmp_path)[-3:]} == {"new"}


def test_records_from_other_code_can_be_kept_and_are_listed(tmp_path, capsys):
    tasks = _old_code_run(tmp_path, {"method": "m1"})
    capsys.readouterr()
    ev = Scripted()
    result = _run(tasks, ev, tmp_path, keep_other_code=True,
                  base_record={"label": "x", "code_hash": "new", "code": {"method": "m2"}})
    assert "recomputed" not in capsys.readouterr().err
    assert [c[0] for c in ev.calls] == ["c"]  # only the failed task
    assert (result.done, result.cached, result.failed) == (1, 2, 0)
    assert (result.recomputed, result.other_code) == ([], ["a", "b"])
    assert result.previous_code == {"a": {"method": "m1"}, "b": {"method": "m1"}}


def test_records_of_this_code_are_kept_whatever_keep_other_code_says(tmp_path):
    tasks = _old_code_run(tmp_path)
    for keep in (False, True):
        result = _run(tasks, Scripted(), tmp_path, keep_other_code=keep, base_record={"label": "x", "code_hash": "old"})
        assert (result.done, result.cached, result.recomputed, result.other_code) == (1 - keep, 2 + keep, [], [])


def test_records_from_before_code_identities_or_without_one_now_are_recomputed(tmp_path, capsys):
    tasks = _old_code_run(tmp_path)  # records without "code"
    capsys.readouterr()
    result = _run(tasks, Scripted(), tmp_path, base_record={"label": "x", "code_hash": "new", "code": {"method": "m"}})
    assert (f"{tmp_path.name}: 2 task(s) will be recomputed: their records came from other code "
            f"(unknown (a record from before code identities))") in capsys.readouterr().err
    assert result.previous_code == {"a": None, "b": None}
    # records with a code identity, and a run without one: the hash alone tells them apart (no part to name)
    tasks = _old_code_run(tmp_path / "2", {"method": "m1"})
    capsys.readouterr()
    result = _run(tasks, Scripted(), tmp_path / "2", base_record={"label": "x", "code_hash": "new"})
    assert "2 task(s) will be recomputed: their records came from other code ()" in capsys.readouterr().err
    assert result.recomputed == ["a", "b"]


# --------------------------------------------------------------------------------------------- progress
def test_the_bar_is_the_default_and_goes_to_stderr(tmp_path, capsys):
    run_tasks([_task("a"), _task("b")], Scripted(), tmp_path, global_seed=7, base_record={"label": "x"})
    captured = capsys.readouterr()
    assert captured.out == ""
    assert tmp_path.name in captured.err and "2/2" in captured.err


def test_without_a_bar_a_line_every_ten_tasks_by_default_and_a_last_one(tmp_path, capsys):
    tasks = [_task(f"t{i:02d}", f"c{i}") for i in range(12)]
    _write(tmp_path, {"task_id": "t03", "status": "ok", "score": 0.9})
    _run(tasks, Scripted(fail_on="t05"), tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" tasks")[0] for line in lines] == [f"{tmp_path.name}: {n}/12" for n in (1, 11, 12)]
    assert lines[0] == f"{tmp_path.name}: 1/12 tasks (1 cached, 0 failed), mean score 0.9000; 11 to run, 1 cached"
    # the mean over 0.9 (cached) and ten 0.5 (one of the 11 run failed): 5.9 / 11 = 0.536363...
    assert lines[2].startswith(f"{tmp_path.name}: 12/12 tasks (1 cached, 1 failed), mean score 0.5364, ")
    assert lines[2].endswith("; done")
    _run(tasks, Scripted(), tmp_path / "every3", progress_every=3)
    assert [line.split(" tasks")[0] for line in capsys.readouterr().out.splitlines()] == [
        f"every3: {n}/12" for n in (0, 3, 6, 9, 12)]


def test_without_a_bar_a_line_every_sixty_seconds_by_default(tmp_path, capsys, monkeypatch):
    now = [0.0]

    def tick() -> None:
        now[0] += 20.0

    monkeypatch.setattr(runner, "Progress", functools.partial(Progress, clock=lambda: now[0]))
    _run([_task(f"t{i}", f"c{i}") for i in range(6)], Scripted(tick=tick), tmp_path, progress_every=100)
    lines = capsys.readouterr().out.splitlines()
    # 20 s per task: 40 s after the 2nd (no line), 60 s after the 3rd (a line), 40 s after the 5th, then the last
    assert [line.split(" tasks")[0].split(": ")[1] for line in lines] == ["0/6", "3/6", "6/6"]
    assert lines[1] == (f"{tmp_path.name}: 3/6 tasks (0 cached, 0 failed), mean score 0.5000, 20.0 s/task, "
                        f"1m00s elapsed, ~1m00s left")
    _run([_task(f"t{i}", f"c{i}") for i in range(6)], Scripted(tick=tick), tmp_path / "every40s", progress_every=100,
         progress_seconds=40)
    assert [line.split(" tasks")[0] for line in capsys.readouterr().out.splitlines()] == [
        f"every40s: {n}/6" for n in (0, 2, 4, 6)]
