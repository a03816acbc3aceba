"""One experiment: a resolved config run over its tasks, from config to records to ``summary.json``.

The run path goes one way: config -> :func:`run_experiment` (run directory, task selection, shard) ->
:func:`cmbench.runs.runner.run_tasks` -> :class:`cmbench.runs.evaluator.ModelEvaluator` -> records.
``python -m cmbench run`` is a thin command line around :func:`run_experiment`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cmbench.config_schema import ROOT_KEYS, keys_with_role
from cmbench.data import load_manifest
from cmbench.errors import ConfigError
from cmbench.hashing import config_hash
from cmbench.provenance import git_commit, versions
from cmbench.runs.runner import (
    RunResult,
    run_tasks,
    select_tasks,
    shard_from_env,
    summarise,
)

# keys that choose which tasks run or how they are displayed, not what a task's record contains
SELECTION_KEYS = keys_with_role(ROOT_KEYS, "selection")


def method_label(cfg: DictConfig) -> str:
    """The name a run shows in leaderboards: ``label`` if set, else the method's name."""
    return str(cfg.get("label") or cfg.method.name)


def result_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config minus task selection and display: what changes a record."""
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return {k: v for k, v in container.items() if k not in SELECTION_KEYS and k != "hydra"}


def run_dir_for(cfg: DictConfig) -> Path:
    """``<out_dir>/<data>/<label>__<backbone>__<scorer>__<hash>``: readable, stable, no timestamp."""
    slug = lambda s: re.sub(r"[^A-Za-z0-9._-]+", "-", str(s)).strip("-")  # noqa: E731
    name = "__".join([slug(method_label(cfg)), slug(cfg.backbone.name), slug(cfg.scorer.name),
                      config_hash(result_config(cfg))])
    return Path(str(cfg.out_dir)) / slug(cfg.data.name) / name


def ensure_data(cfg: DictConfig) -> None:
    """Build MiniWorld on first use (seconds); any other missing dataset is an error saying what to do."""
    manifest = Path(str(cfg.data.root)) / str(cfg.data.manifest)
    if manifest.is_file():
        return
    if str(cfg.data.name) == "miniworld":
        from cmbench.miniworld import build_suite

        build_suite(cfg.data)
        return
    raise ConfigError(f"{manifest} not found: run `python -m cmbench prepare data={cfg.data.name} "
                      f"data.root={cfg.data.root}` first, or point data.root at a copy of the dataset")


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
    """

    run_dir: Path
    label: str
    summary: dict[str, Any]
    result: RunResult


def run_experiment(cfg: DictConfig) -> ExperimentResult:
    """Run the configured method over the selected tasks and write the run directory."""
    import torch

    from cmbench.runs.evaluator import ModelEvaluator

    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    ensure_data(cfg)
    run_dir = run_dir_for(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(result_config(cfg))))
    tasks = load_manifest(str(cfg.data.root), str(cfg.data.manifest))
    task_ids = list(cfg.task_ids) if cfg.get("task_ids") else None
    limit = int(cfg.limit) if cfg.get("limit") is not None else None
    selected = select_tasks(tasks, task_ids=task_ids, limit=limit, seed=int(cfg.seed))
    shard = shard_from_env(int(cfg.shard.count), int(cfg.shard.index))
    evaluator = ModelEvaluator(cfg, run_dir)
    base = {
        "label": method_label(cfg),
        "method": str(cfg.method.name),
        "method_config": OmegaConf.to_container(cfg.method, resolve=True),
        "backbone": str(cfg.backbone.name),
        "scorer": str(cfg.scorer.name),
        "scorer_hash": evaluator.scorer_hash,
        "data": str(cfg.data.name),
        "config_hash": config_hash(result_config(cfg)),
        "versions": versions(),
        "git_commit": git_commit(),
    }
    result = run_tasks(selected, evaluator, run_dir, global_seed=int(cfg.seed), base_record=base, shard=shard,
                       show_progress=bool(cfg.progress))
    summary = summarise(run_dir, [t.task_id for t in selected])
    summary.update(run_dir=str(run_dir), label=base["label"], shard={"count": shard[0], "index": shard[1]})
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return ExperimentResult(run_dir, base["label"], summary, result)
