"""One experiment: a resolved run spec run over its tasks, from the spec to records to ``summary.json``.

The run path goes one way: config -> :func:`cmbench.spec.resolve_run` (every knob checked, the method
built, identity and run directory) -> :func:`run_experiment` (data, task selection, shard) ->
:func:`cmbench.runs.runner.run_tasks` -> :class:`cmbench.runs.evaluator.ModelEvaluator` -> records.
``python -m cmbench run`` and ``cmbench.evaluate`` are thin entrances around these two calls.

Identity (docs/runs.md): the run directory is named by the run's result config (every key that changes
a number except the display ``label``), and every record carries the code identity that computed it
(:mod:`cmbench.identity.code`); ``run.json`` says the run's current label and code identity, written
when each invocation starts.

Everything that can refuse a run is checked before the run directory exists (every knob, by
:func:`cmbench.spec.resolve_run`; the data and the task selection here); a run refused after that (another process holds
the shard, a configuration error at the first context) removes the folders it created, so a refused
run leaves nothing behind.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from cmbench.data import load_manifest
from cmbench.data.adapter import build_adapter
from cmbench.data.official import PIN_FILE, dataset_commit, read_pin
from cmbench.data.video_hashes import check_against_pin, context_hashes
from cmbench.lock import RunFolderError
from cmbench.method_family import run_family
from cmbench.provenance import git_commit, machine, versions
from cmbench.runs import atomic
from cmbench.identity.code import CodeIdentity
from cmbench.runs.output_folder import Legacy, claim
from cmbench.runs.records import RUN_FILE, read_task_records, records_files, records_path
from cmbench.runs.runner import RunResult, run_tasks, select_tasks, shard_tasks
from cmbench.runs.summary import summarise
from cmbench.runs.tracking import Tracker, tracker_settings
from cmbench.spec import RunSpec

RUN_FILES = ("config.yaml", RUN_FILE, "summary.json", "videos", "records*.jsonl")
"""What a run writes into its run directory (the records file of each shard matches the last)."""
EARLIER_RUNS = Legacy(required=((RUN_FILE,),), names=RUN_FILES)
"""A run directory written before output folders were marked: its run.json, and only a run's files."""


@contextmanager
def run_folder(run_dir: Path, shard: tuple[int, int] = (1, 0)) -> Iterator[None]:
    """Create ``run_dir`` for the block (claimed first: empty, or a run directory CMBench wrote,
    :mod:`cmbench.runs.output_folder`); if the block fails before any record was written, remove the
    folders this call created (a refused run leaves nothing behind).

    Raises
    ------
    RunFolderError
        The folder cannot be created (read-only file system, disk full, a file in the way).
    OutputFolderError
        ``run_dir`` is someone else's folder, or another kind of CMBench folder.
    """
    top = next((p for p in reversed([run_dir, *run_dir.parents]) if not p.exists()), None)
    names = [*RUN_FILES[:-1], records_path(run_dir, *shard).name]
    folder = claim(run_dir, "run", "the run directory", names=names, legacy=EARLIER_RUNS)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunFolderError(f"cannot create the run directory {run_dir}: {err.strerror or err}") from err
    folder.add(*names)
    try:
        yield
    except BaseException:
        if top is not None and not records_files(run_dir):
            shutil.rmtree(top, ignore_errors=True)
        raise


@dataclass(frozen=True)
class ExperimentResult:
    """What :func:`run_experiment` did.

    Attributes
    ----------
    run_dir : Path
    label : str
    summary : dict
        The content of ``summary.json``.
    result : RunResult
        Tasks run now, cached and failed in this invocation.
    task_ids : tuple of str
        The selected tasks (all shards), in manifest order.
    code : CodeIdentity
        The code identity of this invocation.
    writer : bool
        This process wrote the records (False: a follower of a split model, :mod:`cmbench.runs.ranks`).
    """

    run_dir: Path
    label: str
    summary: dict[str, Any]
    result: RunResult
    task_ids: tuple[str, ...]
    code: CodeIdentity
    writer: bool = True


def run_experiment(spec: RunSpec, on_lock_wait: Callable[[str], None] | None = None) -> ExperimentResult:
    """Run a resolved run spec over its selected tasks and write the run directory.

    ``on_lock_wait(holder)`` (``process 4000 on node7``): when given, a run another process is writing is
    waited for (after this call) instead of refused; its finished tasks are then kept
    (:func:`cmbench.runs.runner.run_tasks`).

    Raises
    ------
    CMBenchError
        Bad data or selection, another process on the same shard, an unwritable or full disk: each a
        one-line message (the config's knobs were checked by :func:`cmbench.spec.resolve_run`).
    """
    import torch

    from cmbench.runs.evaluator import ModelEvaluator, VideoOutput
    from cmbench.runs.ranks import follow, join, launch_of, leading, pin_device

    chosen, outputs, identity = spec.selection, spec.outputs, spec.identity
    tracking = tracker_settings(outputs.tracker)  # a bad logging key is refused before anything loads
    if outputs.threads:
        torch.set_num_threads(outputs.threads)
    run_dir = outputs.run_dir
    launch = launch_of(spec.parallel)  # torchrun's ranks when the model is split over parallel.sequence of them
    build_adapter(spec.data.config).ensure()
    tasks = load_manifest(str(spec.data.root), spec.data.manifest)
    selected = select_tasks(tasks, task_ids=chosen.task_ids, limit=chosen.limit, seed=chosen.sample_seed)
    videos = VideoOutput(run_dir, spec.data.fps, outputs.lossless_max_pixels) if outputs.save_videos else None
    if launch is not None:
        pin_device(launch, spec.backbone)
    evaluator = ModelEvaluator.from_spec(spec, videos)
    group = None if launch is None else join(launch, spec.parallel, spec.backbone)
    if group is not None:
        evaluator.split(group)
    code = spec.code_identity(f"{evaluator.scorer_hash}/{evaluator.scorer.models_hash}")
    pin = read_pin(spec.data.root)
    run_file = {
        "label": identity.label,
        "config_hash": identity.config_hash,
        "setup_hash": identity.setup_hash,
        "run_seed": chosen.seed,
        "code": code.parts,
        "code_hash": code.hash,
    }
    base = {
        **run_file,
        "method": spec.method_name,
        "method_config": spec.method_config,
        "family": run_family(spec.method.family, spec.generation.settings.storage.name),
        **spec.target_fields,
        "backbone": str(spec.backbone["name"]),
        "scorer": str(spec.scorer["name"]),
        "scorer_hash": evaluator.scorer_hash,
        "metric": evaluator.metric,
        "data": spec.data.name,
        "dataset_commit": dataset_commit(spec.data.root, spec.data.manifest),
        "versions": versions(),
        "git_commit": git_commit(),
        "machine": machine(str(spec.backbone.get("device", "cpu"))),
    }
    writer = group is None or group.rank == 0
    tracker = None
    if writer:
        hashes = context_hashes(shard_tasks(selected, *chosen.shard))  # this shard's videos: another hashes its own
        if pin is not None:
            check_against_pin(selected, hashes, pin.videos, Path(str(spec.data.root)) / PIN_FILE, pin.commit)
        if tracking is not None:
            tracker = Tracker(tracking, label=identity.label, group=identity.setup_hash, config=identity.result_config)
        with leading(evaluator, group) as tasks_evaluator, run_folder(run_dir, chosen.shard):
            atomic.write_text(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(identity.result_config)))
            atomic.write_text(run_dir / RUN_FILE, json.dumps(run_file, indent=2, allow_nan=False) + "\n")
            try:
                result = run_tasks(selected, tasks_evaluator, run_dir, global_seed=chosen.seed, base_record=base,
                                   shard=chosen.shard, show_progress=outputs.progress,
                                   keep_other_code=chosen.keep_other_code, progress_every=outputs.progress_every,
                                   progress_seconds=outputs.progress_seconds, on_lock_wait=on_lock_wait,
                                   context_hashes=hashes, on_record=tracker.record if tracker else None)
            except BaseException:
                if tracker is not None:
                    tracker.finish(None)  # the W&B run marked failed; the records written stay
                raise
    else:  # a follower of a split model: the writer's model calls on this rank's heads, nothing written
        assert group is not None
        result = RunResult(run_dir, done=follow(evaluator, selected, group), cached=0, failed=0)
    summary = summarise(read_task_records(run_dir), [t.task_id for t in selected], code_hash=code.hash)
    summary.update(run_dir=str(run_dir), label=identity.label,
                   shard={"count": chosen.shard[0], "index": chosen.shard[1]})
    if writer:
        atomic.write_text(run_dir / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
    if tracker is not None:
        tracker.finish(summary)
    return ExperimentResult(run_dir, identity.label, summary, result, tuple(t.task_id for t in selected), code,
                            writer)
