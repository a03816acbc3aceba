"""The ``run`` and ``leaderboard`` commands.

``python -m cmbench run method=decoprune`` resolves the config, names the run directory from it,
selects (``limit``, ``task_ids``) and shards (``shard.count`` / ``shard.index``, or torchrun's
``WORLD_SIZE`` / ``RANK``) the tasks, runs the unfinished ones through the evaluator, and writes
``config.yaml``, ``records*.jsonl``, ``videos/`` and ``summary.json``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cmbench.data import load_manifest
from cmbench.errors import ConfigError
from cmbench.provenance import git_commit, versions
from cmbench.hashing import config_hash
from cmbench.runs.runner import run_tasks, select_tasks, shard_from_env, summarise

# keys that choose which tasks run or how they are displayed, not what a task's record contains
SELECTION_KEYS = ("limit", "task_ids", "shard", "progress", "out_dir", "leaderboard", "report", "runs",
                  "save_videos", "videos", "out", "experiment", "threads")


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


# run directories written by `run` in this process, in order (a -m sweep reports over them)
RUN_DIRS: list[Path] = []


def run(cfg: DictConfig) -> int:
    """Run the configured method over the selected tasks; exit 3 when some task failed."""
    import torch

    from cmbench.runs.evaluator import ModelEvaluator

    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    ensure_data(cfg)
    run_dir = run_dir_for(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    RUN_DIRS.append(run_dir)
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
    score = "-" if summary["score"] is None else f"{summary['score']:.4f}"
    pr = "-" if summary["pr"] is None else f"{100 * summary['pr']:.2f}%"
    print(f"{base['label']}: {summary['tasks_ok']}/{summary['tasks_expected']} tasks ok "
          f"({result.done} run now, {result.cached} cached), {summary['tasks_failed']} failed; "
          f"score {score}, PR {pr}; {run_dir}")
    if summary["tasks_failed"]:
        print(f"failed: {', '.join(summary['failed_task_ids'][:10])}"
              f"{' ...' if summary['tasks_failed'] > 10 else ''} (reasons in records.jsonl)", file=sys.stderr)
        return 3
    return 0


def find_run_dirs(cfg: DictConfig) -> list[Path]:
    """``runs=[dir, ...]`` when given, else every run directory (one with records) under ``<out_dir>/<data>/``."""
    base = Path(str(cfg.out_dir)) / str(cfg.data.name)
    return [Path(str(r)) for r in cfg.runs or []] or sorted(
        p for p in base.glob("*") if p.is_dir() and any(p.glob("records*.jsonl"))
    )


def leaderboard(cfg: DictConfig, runs: list[Path] | None = None) -> int:
    """Write leaderboard CSVs, markdown and the Pareto plot over run directories.

    ``runs=[dir, ...]`` names them; by default every run directory under ``<out_dir>/<data>/``.
    ``leaderboard.out`` is the output folder (default ``<out_dir>/<data>/leaderboard``).
    """
    from cmbench.report import write_reports

    runs = runs or find_run_dirs(cfg)
    out = Path(str(cfg.leaderboard.out or Path(str(cfg.out_dir)) / str(cfg.data.name) / "leaderboard"))
    paths = write_reports(runs, out, allow_mixed=bool(cfg.leaderboard.allow_mixed))
    print(paths["leaderboard.md"].read_text(), end="")
    print(f"wrote {', '.join(sorted(p.name for p in paths.values()))} to {out}")
    return 0
