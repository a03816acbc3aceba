"""The task loop: selection, seeds, sharding, resume, failure isolation, records and summary.

A run directory is named from the resolved config (a readable name plus a short hash of everything
that changes a number), never from a timestamp, so rerunning the same command finds its records and
skips what is finished. Records are appended one line per finished task, flushed and fsync'd: a run
killed at any moment (SIGKILL included) and restarted ends with the records of an uninterrupted run.

What happens to one context and its tasks is delegated to an :class:`Evaluator` (see
:mod:`cmbench.runs.evaluator`), so this module knows nothing of models or scorers.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol

import numpy as np
from tqdm import tqdm

from cmbench.data.task import Task
from cmbench.errors import ConfigError
from cmbench.hashing import task_seed
from cmbench.runs.records import RecordWriter, read_all_records, records_path


class Evaluator(Protocol):
    """Runs the tasks of one context: a shared preparation (prefill), then each task."""

    def prepare(self, tasks: list[Task]) -> Any:
        """Work shared by the tasks of one context (e.g. the prefilled KV cache)."""
        ...

    def evaluate(self, task: Task, prepared: Any, seed: int) -> dict[str, Any]:
        """Fields of one task's record (score, PR, timings, ...)."""
        ...


def select_tasks(
    tasks: list[Task], *, task_ids: Iterable[str] | None = None, limit: int | None = None, seed: int = 0
) -> list[Task]:
    """Pick the tasks to run, keeping manifest order.

    ``task_ids`` picks named tasks (unknown ids are an error naming the closest match); ``limit``
    takes a seeded random sample of ``limit`` tasks stratified by (source, task_type), each stratum
    getting its proportional share (largest remainders first).
    """
    if task_ids:
        by_id = {t.task_id: t for t in tasks}
        wanted = list(dict.fromkeys(task_ids))
        unknown = [i for i in wanted if i not in by_id]
        if unknown:
            import difflib

            hints = [f"{u!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(u, by_id, n=1)) else repr(u)
                     for u in unknown]
            raise ConfigError(f"task_ids not in the manifest: {', '.join(hints)}")
        keep = set(wanted)
        tasks = [t for t in tasks if t.task_id in keep]
    if limit is None or limit >= len(tasks):
        return list(tasks)
    if limit <= 0:
        raise ConfigError(f"limit must be positive, got {limit}")
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
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"shard.index must be in [0, shard.count), got index={index} count={count}")
    contexts = list(dict.fromkeys(t.context_id for t in tasks))
    mine = set(contexts[index::count])
    return [t for t in tasks if t.context_id in mine]


def shard_from_env(count: int, index: int) -> tuple[int, int]:
    """torchrun's WORLD_SIZE / RANK when set and no shard was configured."""
    if count == 1 and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", "0"))
    return count, index


def finished_task_ids(run_dir: Path) -> set[str]:
    """Tasks with a successful record (failed tasks are retried on rerun)."""
    return {r["task_id"] for r in read_all_records(run_dir) if r.get("status") == "ok"}


@dataclass
class RunResult:
    run_dir: Path
    done: int  # finished in this invocation
    cached: int  # already finished before
    failed: int


def run_tasks(
    tasks: list[Task],
    evaluator: Evaluator,
    run_dir: Path,
    *,
    global_seed: int,
    base_record: dict[str, Any],
    shard: tuple[int, int] = (1, 0),
    show_progress: bool = True,
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
        Fields every record carries (method and knobs, backbone, scorer hash, versions, ...).
    shard : (count, index)
    show_progress : bool
        A tqdm bar (on stderr) with done / cached / remaining and the running mean score.
    """
    count, index = shard
    mine = shard_tasks(tasks, count, index)
    done_before = finished_task_ids(run_dir)
    todo = [t for t in mine if t.task_id not in done_before]
    writer = RecordWriter(records_path(run_dir, count, index))
    by_context: dict[str, list[Task]] = defaultdict(list)
    for t in todo:
        by_context[t.context_id].append(t)
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), disable=not show_progress, unit="task",
               desc=run_dir.name, dynamic_ncols=True)
    scores: list[float] = []
    done = failed = 0
    for context_tasks in by_context.values():
        try:
            prepared = evaluator.prepare(context_tasks)
            prep_error = None
        except Exception as err:  # one bad context must not stop the run
            prepared, prep_error = None, err
        for task in context_tasks:
            seed = task_seed(global_seed, task.task_id)
            record = {**base_record, **_task_fields(task), "seed": seed}
            try:
                if prep_error is not None:
                    raise prep_error
                record.update(evaluator.evaluate(task, prepared, seed))
                record["status"], record["error"] = "ok", None
            except Exception as err:
                record.update(status="failed", error=f"{type(err).__name__}: {err}",
                              traceback=traceback.format_exc(limit=8))
                failed += 1
            writer.write(record)
            done += 1
            if record["status"] == "ok" and record.get("score") is not None:
                scores.append(float(record["score"]))
            bar.update(1)
            bar.set_postfix(cached=len(mine) - len(todo), failed=failed,
                            mean=f"{np.mean(scores):.4f}" if scores else "-")
    bar.close()
    return RunResult(run_dir, done=done, cached=len(mine) - len(todo), failed=failed)


def _task_fields(task: Task) -> dict[str, Any]:
    return {"task_id": task.task_id, "context_id": task.context_id, "source": task.source, "task_type": task.task_type}


def summarise(run_dir: Path, expected_task_ids: Iterable[str]) -> dict[str, Any]:
    """``summary.json`` content from all records of a run (the last record of a task wins)."""
    latest: dict[str, dict[str, Any]] = {}
    for r in read_all_records(run_dir):
        latest[r["task_id"]] = r
    expected = list(expected_task_ids)
    rows = [latest[t] for t in expected if t in latest]
    ok = [r for r in rows if r.get("status") == "ok"]
    mean = lambda key: float(np.mean([r[key] for r in ok])) if ok else None  # noqa: E731
    return {
        "tasks_expected": len(expected),
        "tasks_recorded": len(rows),
        "tasks_ok": len(ok),
        "tasks_failed": len(rows) - len(ok),
        "failed_task_ids": sorted(r["task_id"] for r in rows if r.get("status") != "ok"),
        "missing_task_ids": sorted(set(expected) - set(latest)),
        "score": mean("score"),
        "pr": mean("pr"),
        "by_source": dict(Counter(r["source"] for r in ok)),
        "by_type": dict(Counter(r["task_type"] for r in ok)),
    }
