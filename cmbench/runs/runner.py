"""The task loop: selection, seeds, sharding, resume, failure isolation, records and summary.

A run directory is named from the resolved config (a readable name plus a short hash of everything
that changes a number), never from a timestamp, so rerunning the same command finds its records and
skips what is finished. Records are appended one line per finished task, flushed and fsync'd: a run
killed at any moment (SIGKILL included) and restarted ends with the records of an uninterrupted run.
Each shard's records file is written under an exclusive lock (:class:`cmbench.lock.RunLock`), so
two processes never run the same shard of one run directory at once.

Every record carries the ``code_hash`` of the code that computed it (:mod:`cmbench.identity.code`): a
finished task counts as done only when its record's ``code_hash`` is the current one, so after an
edit of the method, of CMBench or of the weights every task is computed again, unless the caller
keeps records from other code (``keep_other_code``), which :class:`RunResult` then lists.

A task that raises is recorded as failed and the run goes on, except for a :class:`ConfigError`
(the configuration is wrong: every task would fail the same way) and a records file that cannot be
written (disk full): those stop the run at once, keeping every record already written.

What happens to one context and its tasks is delegated to an :class:`Evaluator` (see
:mod:`cmbench.runs.evaluator`), so this module knows nothing of models or scorers.
"""

from __future__ import annotations

import sys
import traceback
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from cmbench.data.task import Task
from cmbench.data.video_hashes import check_against_records
from cmbench.errors import ConfigError
from cmbench.hashing import task_seed
from cmbench.lock import RunLock
from cmbench.identity.code import changed_parts, describe_changes
from cmbench.runs.progress import Progress
from cmbench.spec import check_shard
from cmbench.runs.records import RecordWriter, TaskRecord, latest_records, read_task_records, records_path

class Evaluator(Protocol):
    """Runs the tasks of one context: a shared preparation (prefill), then each task."""

    def prepare(self, tasks: list[Task]) -> Any:
        """Work shared by the tasks of one context (e.g. the prefilled KV cache)."""
        ...

    def evaluate(self, task: Task, prepared: Any, seed: int) -> dict[str, Any]:
        """Fields of one task's :class:`~cmbench.runs.records.TaskRecord` (score, PR, timings, ...)."""
        ...


def select_tasks(
    tasks: list[Task], *, task_ids: Iterable[str] | None = None, limit: int | None = None, seed: int = 0
) -> list[Task]:
    """Pick the tasks to run, keeping manifest order.

    ``task_ids`` picks named tasks (unknown ids are an error naming the closest match; an empty list
    is an error, not "all tasks"); ``limit`` takes a seeded random sample of ``limit`` tasks
    stratified by (source, task_type), each stratum getting its proportional share (largest
    remainders first).
    """
    if task_ids is not None:
        wanted = list(dict.fromkeys(task_ids))
        if not wanted:
            raise ConfigError("task_ids=[] selects no task; name some tasks, or leave task_ids unset to run all")
        by_id = {t.task_id: t for t in tasks}
        unknown = [i for i in wanted if i not in by_id]
        if unknown:
            import difflib

            hints = [f"{u!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(u, by_id, n=1)) else repr(u)
                     for u in unknown]
            raise ConfigError(f"task_ids not in the manifest: {', '.join(hints)}")
        keep = set(wanted)
        tasks = [t for t in tasks if t.task_id in keep]
    if limit is not None and limit <= 0:
        raise ConfigError(f"limit must be a positive number of tasks, got {limit}")
    if limit is None or limit >= len(tasks):
        return list(tasks)
    strata: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        strata[(t.source, t.task_type)].append(i)
    keys = sorted(strata)
    quotas = {k: limit * len(strata[k]) / len(tasks) for k in keys}
    counts = {k: int(quotas[k]) for k in keys}
    for k in sorted(keys, key=lambda k: (-(quotas[k] - counts[k]), k))[: limit - sum(counts.values())]:
        counts[k] += 1
    rng = np.random.default_rng(seed)
    chosen = [i for k in keys for i in rng.choice(strata[k], size=counts[k], replace=False).tolist()]
    return [tasks[i] for i in sorted(chosen)]


def shard_tasks(tasks: list[Task], count: int, index: int) -> list[Task]:
    """Tasks of shard ``index`` of ``count``: whole contexts, dealt round-robin in manifest order, so
    the tasks of one context share a prefill within one shard."""
    check_shard(count, index)
    contexts = list(dict.fromkeys(t.context_id for t in tasks))
    mine = set(contexts[index::count])
    return [t for t in tasks if t.context_id in mine]


def finished_task_ids(run_dir: Path, code_hash: str | None = None, keep_other_code: bool = False) -> set[str]:
    """Tasks whose latest record is a success (failed tasks are retried on rerun) computed by the code
    ``code_hash`` (any code with ``keep_other_code``)."""
    return {t for t, r in latest_records(read_task_records(run_dir)).items()
            if r.status == "ok" and (keep_other_code or r.code_hash == code_hash)}


@dataclass
class RunResult:
    """What one invocation of :func:`run_tasks` did.

    Attributes
    ----------
    run_dir : Path
    done : int
        Tasks run in this invocation.
    cached : int
        Tasks finished before and kept.
    failed : int
        Of ``done``, those that failed.
    recomputed : list of str
        Of ``done``, tasks that had a successful record from other code (recomputed).
    other_code : list of str
        Of ``cached``, tasks whose kept record came from other code (``keep_other_code``).
    previous_code : dict
        For the tasks of ``recomputed`` and ``other_code``: the ``code`` parts of their earlier record
        (None for records from before code identities).
    """

    run_dir: Path
    done: int
    cached: int
    failed: int
    recomputed: list[str] = field(default_factory=list)
    other_code: list[str] = field(default_factory=list)
    previous_code: dict[str, dict[str, Any] | None] = field(default_factory=dict)


def run_tasks(
    tasks: list[Task],
    evaluator: Evaluator,
    run_dir: Path,
    *,
    global_seed: int,
    base_record: dict[str, Any],
    shard: tuple[int, int] = (1, 0),
    show_progress: bool = True,
    keep_other_code: bool = False,
    progress_every: int = 10,
    progress_seconds: float = 60.0,
    on_lock_wait: Callable[[str], None] | None = None,
    on_record: Callable[[TaskRecord], None] | None = None,
    context_hashes: Mapping[str, str] | None = None,
) -> RunResult:
    """Run the unfinished tasks, context by context, appending one record per task.

    Parameters
    ----------
    tasks : list of Task
        Already selected (and not yet sharded).
    evaluator : Evaluator
    run_dir : Path
    global_seed : int
    base_record : dict
        Fields every record carries (method and knobs, backbone, scorer hash, versions, the
        ``code_hash``, ...).
    shard : (count, index)
    show_progress : bool
        A tqdm bar (on stderr) with done / cached / failed and the running mean score; False: a line
        every ``progress_every`` tasks or ``progress_seconds`` seconds (:class:`Progress`).
    keep_other_code : bool
        Keep successful records computed by other code (another ``code_hash``) instead of computing
        those tasks again.
    on_lock_wait : callable ``(holder)``, optional
        When another process is writing this shard: called, then its lock is waited for (and the tasks
        it finished are kept); without it the run is refused at once (:class:`cmbench.lock.RunLock`).
    on_record : callable ``(record)``, optional
        Called with each record once it is written (an experiment tracker: :mod:`cmbench.runs.tracking`).
    context_hashes : mapping, optional
        ``{context_id: SHA-256}`` of the context videos (:mod:`cmbench.data.video_hashes`): recorded in each
        task's record; a context whose earlier records in ``run_dir`` carry another hash is refused.
    """
    count, index = shard
    mine = shard_tasks(tasks, count, index)
    path = records_path(run_dir, count, index)
    code_hash = base_record.get("code_hash")
    with RunLock(path, on_wait=on_lock_wait):
        records = read_task_records(run_dir)  # skips a torn last line, which the writer then cuts off
        # stamped after every record there, whatever this host's clock says (shards written on several hosts)
        writer = RecordWriter(path, after_ns=max((r.recorded_ns or 0 for r in records), default=0))
        latest = latest_records(records)
        hashes = dict(context_hashes or {})
        check_against_records(hashes, {r.context_id: r.context_hash for r in latest.values() if r.context_id}, run_dir)
        succeeded = {t.task_id: latest[t.task_id] for t in mine
                     if t.task_id in latest and latest[t.task_id].status == "ok"}
        other = [i for i, r in succeeded.items() if r.code_hash != code_hash]
        kept = {i: r for i, r in succeeded.items() if keep_other_code or r.code_hash == code_hash}
        todo = [t for t in mine if t.task_id not in kept]
        recompute = [i for i in other if i not in kept]
        if recompute:  # said before the work starts, not only in the closing lines
            parts = sorted({p for i in recompute for p in changed_parts(succeeded[i].code, base_record.get("code") or {})})
            print(f"{run_dir.name}: {len(recompute)} task(s) will be recomputed: their records came from other code "
                  f"({describe_changes(parts)})", file=sys.stderr)
        by_context: dict[str, list[Task]] = defaultdict(list)
        for t in todo:
            by_context[t.context_id].append(t)
        progress = Progress(run_dir.name, len(mine), kept.values(), bar=show_progress, every_tasks=progress_every,
                            every_seconds=progress_seconds)
        done = failed = 0
        try:
            for context_tasks in by_context.values():
                prepared, prep_error = _prepare(evaluator, context_tasks)
                for task in context_tasks:
                    record = writer.write(_evaluate(evaluator, task, prepared, prep_error, global_seed,
                                                    {**base_record, "context_hash": hashes.get(task.context_id)}))
                    done += 1
                    failed += record.status != "ok"
                    progress.update(record)
                    if on_record is not None:
                        on_record(record)
        except KeyboardInterrupt:  # Ctrl-C: every record written is whole (one write each); the rest reruns
            progress.close()
            raise Interrupted(f"interrupted; {len(kept) + done} records kept; rerun to resume") from None
        progress.close()
    return RunResult(run_dir, done=done, cached=len(kept), failed=failed,
                     recomputed=recompute, other_code=[i for i in other if i in kept],
                     previous_code={i: succeeded[i].code for i in other})


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; its message is the one line the command prints (how many records are kept).
    A KeyboardInterrupt still, so a sweep stops too."""


def _prepare(evaluator: Evaluator, tasks: list[Task]) -> tuple[Any, Exception | None]:
    """The context's shared work, or the error that makes its tasks fail (a ConfigError stops the run)."""
    try:
        return evaluator.prepare(tasks), None
    except ConfigError:
        raise
    except Exception as err:  # one bad context must not stop the run
        return None, err


def _evaluate(evaluator: Evaluator, task: Task, prepared: Any, prep_error: Exception | None, global_seed: int,
              base_record: dict[str, Any]) -> TaskRecord:
    """One task's record: its evaluation, or the error it failed with (a ConfigError stops the run)."""
    seed = task_seed(global_seed, task.task_id)
    fields = {**base_record, **_task_fields(task), "seed": seed}
    try:
        if prep_error is not None:
            raise prep_error
        return TaskRecord(**{**fields, **evaluator.evaluate(task, prepared, seed), "status": "ok"})
    except ConfigError:
        raise
    except Exception as err:
        return TaskRecord(**fields, status="failed", error=f"{type(err).__name__}: {err}",
                          traceback=traceback.format_exc(limit=8))


def _task_fields(task: Task) -> dict[str, Any]:
    return {"task_id": task.task_id, "context_id": task.context_id, "source": task.source, "task_type": task.task_type}
