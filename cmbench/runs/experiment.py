"""One experiment: a resolved config run over its tasks, from config to records to ``summary.json``.

The run path goes one way: config -> :func:`run_experiment` (run directory, task selection, shard) ->
:func:`cmbench.runs.runner.run_tasks` -> :class:`cmbench.runs.evaluator.ModelEvaluator` -> records.
``python -m cmbench run`` is a thin command line around :func:`run_experiment`.

Identity (docs/runs.md): the run directory is named by the run's result config (every key that changes
a number except the display ``label``), and every record carries the code identity that computed it
(:mod:`cmbench.runs.identity`); ``run.json`` says the run's current label and code identity, written
when each invocation starts.

Everything that can refuse a run is checked before the run directory exists (the selection knobs,
the data, the task selection, the method's knobs); a run refused after that (another process holds
the shard, a configuration error at the first context) removes the folders it created, so a refused
run leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from cmbench.config_paths import to_dict
from cmbench.config_schema import BACKBONE_KEYS, ROOT_KEYS, SCORER_KEYS, keys_with_role
from cmbench.data import load_manifest
from cmbench.data.adapter import build_adapter
from cmbench.data.subsets import load_subset
from cmbench.errors import ConfigError
from cmbench.hashing import config_hash
from cmbench.methods.registry import build_method, canonical_method_config, full_method_config
from cmbench.provenance import git_commit, machine, versions
from cmbench.runs.identity import CodeIdentity, code_identity, portable
from cmbench.runs.labels import resolve_method_class, run_label
from cmbench.runs.lock import RunFolderError
from cmbench.runs.paths import path_component
from cmbench.runs.records import RUN_FILE, read_task_records, records_files
from cmbench.runs.runner import RunResult, check_shard, run_tasks, select_tasks, shard_from_env
from cmbench.runs.summary import summarise

# keys that choose which tasks run or how they are displayed, not what a task's record contains
SELECTION_KEYS = keys_with_role(ROOT_KEYS, "selection")


def result_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config minus task selection, display and where components run: what changes a record
    (the method as its name and the knobs that differ from its class, :func:`canonical_method_config`).

    Root keys of role ``selection`` go, and so do the ``runtime`` keys of the backbone and the scorer
    (memory offloads, scorer device, batch size, cache folder; the scorer's effective precision is in
    its own hash, which every record carries).
    """
    out = {k: v for k, v in to_dict(cfg).items() if k not in SELECTION_KEYS and k != "hydra"}
    for group, schema in (("backbone", BACKBONE_KEYS), ("scorer", SCORER_KEYS)):
        if isinstance(out.get(group), dict):
            runtime = set(keys_with_role(schema, "runtime"))
            out[group] = {k: v for k, v in out[group].items() if k not in runtime}
    if isinstance(out.get("method"), dict):  # a method setting hashes the same however it was spelled
        out["method"] = canonical_method_config(out["method"])
    return out


def run_config_hash(cfg: DictConfig) -> str:
    """The run's identity: the hash of its result config, paths inside CMBench written relative to
    the package (so it does not depend on where CMBench is installed)."""
    return config_hash(portable(result_config(cfg)))


def setup_hash(cfg: DictConfig) -> str:
    """:func:`run_config_hash` without the global ``seed``: equal for the seeds of one setup."""
    return config_hash({k: v for k, v in portable(result_config(cfg)).items() if k != "seed"})


def data_dir(cfg: DictConfig) -> Path:
    """``<out_dir>/<data>``: where the runs (and the default leaderboard) of one dataset live."""
    return Path(str(cfg.out_dir)) / path_component(cfg.data.name, "data.name")


def run_dir_for(cfg: DictConfig) -> Path:
    """``<out_dir>/<data>/<method>__<backbone>__<scorer>__<hash>``: readable, stable, no timestamp, and
    without the label (relabelling a run reruns nothing)."""
    name = "__".join([path_component(cfg.method.name, "method.name"), path_component(cfg.backbone.name, "backbone.name"),
                      path_component(cfg.scorer.name, "scorer.name"), run_config_hash(cfg)])
    return data_dir(cfg) / name


@dataclass(frozen=True)
class RunOptions:
    """The selection knobs of a run, checked.

    Attributes
    ----------
    seed : int
        Global seed (>= 0).
    limit : int or None
        A stratified sample of this many tasks (> 0), or all.
    sample_seed : int
        The seed of that sample (>= 0), not the run's: every ``seed`` of a sweep runs the same tasks.
    task_ids : list of str or None
        Exactly these tasks (``task_ids``, or the ids of the named ``subset``), or every task.
    threads : int or None
        torch CPU threads (>= 1), or torch's default.
    shard : (count, index)
    keep_other_code : bool
        Keep task records computed by other code instead of computing them again.
    progress_every : int
        With ``progress=false``, a line every this many tasks (>= 1) ...
    progress_seconds : float
        ... or this many seconds (> 0).
    """

    seed: int
    limit: int | None
    sample_seed: int
    task_ids: list[str] | None
    threads: int | None
    shard: tuple[int, int]
    keep_other_code: bool = False
    progress_every: int = 10
    progress_seconds: float = 60.0


def _whole(cfg: DictConfig, key: str, minimum: int, what: str, optional: bool = False) -> int | None:
    value = OmegaConf.select(cfg, key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r}: expected {what}")
    return value


def run_options(cfg: DictConfig) -> RunOptions:
    """Read and check ``seed``, ``limit``, ``sample_seed``, ``task_ids`` / ``subset``, ``threads`` and ``shard`` (or torchrun's
    ``WORLD_SIZE`` / ``RANK``).

    Raises
    ------
    ConfigError
        One line naming the knob, its value and what is expected.
    """
    ids = cfg.get("task_ids")
    if isinstance(ids, str):
        ids = [ids]
    elif ids is not None and not isinstance(ids, ListConfig):
        raise ConfigError(f"task_ids={ids!r}: expected a list of task ids, e.g. task_ids=[syn_001_reappear_01]")
    subset_name = cfg.get("subset")
    if subset_name is not None:
        if ids is not None:
            raise ConfigError(f"subset={subset_name} and task_ids both select tasks: set one of them")
        subset = load_subset(str(subset_name))
        if subset.dataset != str(cfg.data.name):
            raise ConfigError(f"subset={subset_name} lists {subset.dataset} tasks ({subset.path}), not {cfg.data.name}'s")
        ids = list(subset.task_ids)
    try:
        shard = shard_from_env(int(cfg.shard.count), int(cfg.shard.index))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"shard.count / shard.index (or WORLD_SIZE / RANK): expected whole numbers ({err})") from err
    check_shard(*shard)
    keep = cfg.get("keep_other_code", False)
    if not isinstance(keep, bool):
        raise ConfigError(f"keep_other_code={keep!r}: expected true or false")
    seconds = cfg.get("progress_seconds", 60.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ConfigError(f"progress_seconds={seconds!r}: expected a number of seconds > 0")
    return RunOptions(
        seed=_whole(cfg, "seed", 0, "a whole number >= 0") or 0,
        limit=_whole(cfg, "limit", 1, "a positive whole number of tasks (or null for all)", optional=True),
        sample_seed=_whole(cfg, "sample_seed", 0, "a whole number >= 0") or 0,
        task_ids=None if ids is None else [str(i) for i in ids],
        threads=_whole(cfg, "threads", 1, "a whole number of torch threads >= 1 (or null)", optional=True),
        shard=shard,
        keep_other_code=keep,
        progress_every=_whole(cfg, "progress_every", 1, "a whole number of tasks >= 1") or 10,
        progress_seconds=float(seconds),
    )


@contextmanager
def run_folder(run_dir: Path) -> Iterator[None]:
    """Create ``run_dir`` for the block; if the block fails before any record was written, remove
    the folders this call created (a refused run leaves nothing behind).

    Raises
    ------
    RunFolderError
        The folder cannot be created (read-only file system, disk full, a file in the way).
    """
    top = next((p for p in reversed([run_dir, *run_dir.parents]) if not p.exists()), None)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunFolderError(f"cannot create the run directory {run_dir}: {err.strerror or err}") from err
    try:
        yield
    except BaseException:
        if top is not None and not records_files(run_dir):
            shutil.rmtree(top, ignore_errors=True)
        raise


def _write_text(path: Path, text: str) -> None:
    """Write a file whole (a temporary file renamed into place: readers never see half of it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise RunFolderError(f"cannot write {path}: {err.strerror or err}") from err


def run_identity(cfg: DictConfig, scorer_hash: str | None) -> CodeIdentity:
    """The code identity of a run of ``cfg`` (:func:`cmbench.runs.identity.code_identity`); call after
    the data is present (the manifest is part of it)."""
    manifest = Path(str(cfg.data.root)) / str(cfg.data.manifest)
    return code_identity(resolve_method_class(to_dict(cfg.method)), to_dict(cfg.backbone), manifest, scorer_hash)


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
    """

    run_dir: Path
    label: str
    summary: dict[str, Any]
    result: RunResult
    task_ids: tuple[str, ...]
    code: CodeIdentity


def run_experiment(cfg: DictConfig) -> ExperimentResult:
    """Run the configured method over the selected tasks and write the run directory.

    Raises
    ------
    CMBenchError
        Bad knobs, data, selection or method (before any folder is created), another process on
        the same shard, an unwritable or full disk: each a one-line message.
    """
    import torch

    from cmbench.calibration.target_pr import resolve_target_pr
    from cmbench.generation import check_settings
    from cmbench.runs.evaluator import ModelEvaluator, generation_settings

    target = resolve_target_pr(cfg)  # method.target_pr -> the method's calibrated knob, before anything reads it
    cfg = target.cfg
    options = run_options(cfg)
    check_settings(build_method(to_dict(cfg.method)), generation_settings(cfg))  # before any data or model
    if options.threads:
        torch.set_num_threads(options.threads)
    label = run_label(cfg)
    run_dir = run_dir_for(cfg)
    build_adapter(cfg.data).ensure()
    tasks = load_manifest(str(cfg.data.root), str(cfg.data.manifest))
    selected = select_tasks(tasks, task_ids=options.task_ids, limit=options.limit, seed=options.sample_seed)
    evaluator = ModelEvaluator(cfg, run_dir)
    code = run_identity(cfg, f"{evaluator.scorer_hash}/{evaluator.scorer.models_hash}")
    identity = {
        "label": label,
        "config_hash": run_config_hash(cfg),
        "setup_hash": setup_hash(cfg),
        "run_seed": options.seed,
        "code": code.parts,
        "code_hash": code.hash,
    }
    base = {
        **identity,
        "method": str(cfg.method.name),
        "method_config": full_method_config(to_dict(cfg.method)),
        **target.record_fields(),
        "backbone": str(cfg.backbone.name),
        "scorer": str(cfg.scorer.name),
        "scorer_hash": evaluator.scorer_hash,
        "metric": evaluator.metric,
        "data": str(cfg.data.name),
        "versions": versions(),
        "git_commit": git_commit(),
        "machine": machine(str(cfg.backbone.get("device", "cpu"))),
    }
    with run_folder(run_dir):
        _write_text(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(result_config(cfg))))
        _write_text(run_dir / RUN_FILE, json.dumps(identity, indent=2) + "\n")
        result = run_tasks(selected, evaluator, run_dir, global_seed=options.seed, base_record=base,
                           shard=options.shard, show_progress=bool(cfg.progress),
                           keep_other_code=options.keep_other_code, progress_every=options.progress_every,
                           progress_seconds=options.progress_seconds)
    summary = summarise(read_task_records(run_dir), [t.task_id for t in selected], code_hash=code.hash)
    summary.update(run_dir=str(run_dir), label=label, shard={"count": options.shard[0], "index": options.shard[1]})
    _write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return ExperimentResult(run_dir, label, summary, result, tuple(t.task_id for t in selected), code)
