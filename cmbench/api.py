"""The Python entry point: ``cmbench.evaluate(...)``, the same run as ``python -m cmbench run``.

    import cmbench

    result = cmbench.evaluate(method="decoprune", limit=8)
    result.records[["task_id", "score", "pr"]]           # one row per task (pandas)
    result.run_dir                                       # runs/miniworld/decoprune__tiny__light__<hash>

    result = cmbench.evaluate(method={"name": "decoprune", "gamma": 0.2}, limit=8)
    result = cmbench.evaluate(method=MyMethod(threshold=0.3), limit=8)   # a Method instance

It composes the same Hydra config as the command line (``configs/config.yaml`` plus the config folders
in ``CMBENCH_CONFIG_PATH``), so the run directory, resume, record identity and thread setting are the
CLI's: a run started from Python resumes from the shell and the other way round. Paths (``out_dir``,
the dataset root) are relative to the working directory, as on the command line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

from cmbench.config_paths import CONFIG_DIR, complete_method_name, knob_overrides, search_path_overrides
from cmbench.errors import ConfigError
from cmbench.methods.base import Method
from cmbench.methods.registry import METHODS, config_class


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` returns.

    Attributes
    ----------
    records : pandas.DataFrame
        One row per task of the selection (the run's task records: score, PR, timings, ...).
    run_dir : Path
        The run directory (records, videos, ``summary.json``), shared with ``python -m cmbench run``.
    summary : dict
        The content of ``summary.json``.
    """

    records: pd.DataFrame
    run_dir: Path
    summary: dict[str, Any]


def method_config(method: str | Mapping[str, Any] | Method) -> tuple[str | None, dict[str, Any] | None]:
    """``(config group option, explicit config)`` for a method given as a name, a config or an instance.

    A registered class becomes its name plus its knobs; any other :class:`Method` subclass is named by
    import path (``_target_``), so instances of classes defined in a notebook work in this process.
    """
    if isinstance(method, str):
        return method, None
    if isinstance(method, Method):
        cls = type(method)
        knobs = {f.name: getattr(method, f.name) for f in fields(method) if f.init}
        if cls.name and cls.name in METHODS and METHODS.get(cls.name) is cls:
            return None, {"name": cls.name, **knobs}
        return None, {"_target_": f"{cls.__module__}.{cls.__qualname__}", "name": cls.name or cls.__name__.lower(),
                      **knobs}
    if isinstance(method, Mapping):
        explicit = dict(method)
        if not explicit.get("name") and explicit.get("_target_"):  # named like an instance of its class
            cls = config_class(explicit)
            explicit["name"] = cls.name or cls.__name__.lower()
        return None, explicit
    raise ConfigError(f"method must be a name, a config mapping or a Method instance, got {type(method).__name__}")


def compose_config(method: str | Mapping[str, Any] | Method = "decoprune", overrides: Sequence[str] = ()) -> DictConfig:
    """The root config the command line would build for ``method`` and ``overrides``."""
    choice, explicit = method_config(method)
    base_choice = choice or (explicit.get("name") if explicit and explicit.get("name") in METHODS else None)
    search = search_path_overrides()
    group = [f"method={base_choice}"] if base_choice else []
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[*search, *group, *knob_overrides(list(overrides))])
    complete_method_name(cfg, base_choice)
    if explicit is not None:
        with open_dict(cfg):
            base = OmegaConf.to_container(cfg.method, resolve=True) if base_choice else {}
            assert isinstance(base, dict)
            cfg.method = OmegaConf.create({**base, **explicit})
    return cfg


def evaluate(
    method: str | Mapping[str, Any] | Method = "decoprune",
    data: str = "miniworld",
    backbone: str = "tiny",
    scorer: str = "light",
    *,
    limit: int | None = None,
    task_ids: Sequence[str] | None = None,
    seed: int | None = None,
    out_dir: str | Path = "runs",
    label: str | None = None,
    threads: int = 1,
    progress: bool = False,
    overrides: Sequence[str] = (),
) -> Evaluation:
    """Run a method over CMBench tasks (generation, scoring, records) and return its records.

    Parameters
    ----------
    method : str, mapping or Method
        A registered name or config-group option (``"decoprune"``), a config (``{"name": "decoprune",
        "gamma": 0.2}`` or ``{"_target_": "mypkg.MyMethod", ...}``), or a built method instance.
    data, backbone, scorer : str
        Config group options, as ``data=... backbone=... scorer=...`` on the command line.
    limit, task_ids : optional
        A seeded stratified sample of ``limit`` tasks, or exactly these tasks (default: all).
    seed : int, optional
        The global seed (a task's seed derives from it and its id); default: the config's, as on the
        command line.
    out_dir : str or Path
        Where run directories go (``<out_dir>/<data>/<label>__<backbone>__<scorer>__<hash>``).
    label : str, optional
        The run's name on leaderboards (default: the method's name and the knobs that differ from its
        class defaults, e.g. ``decoprune@gamma=0.2``); not part of the run's identity.
    threads : int
        Torch CPU threads (the command line's default: 1, the fastest for the tiny model's small calls).
    progress : bool
        Show the progress bar.
    overrides : sequence of str
        Any further Hydra overrides (``"generation.rope_reindex=false"``, ``"method.gamma=0.2"``).

    Returns
    -------
    Evaluation
        The selected tasks' records (a DataFrame), the run directory and its summary.
    """
    from cmbench.calibration.target_pr import resolve_target_pr
    from cmbench.report import read_records
    from cmbench.runs.experiment import run_experiment
    from cmbench.spec import resolve_run

    args = [f"data={data}", f"backbone={backbone}", f"scorer={scorer}", f"out_dir={out_dir}",
            f"threads={int(threads)}", f"progress={str(bool(progress)).lower()}"]
    if seed is not None:
        args.append(f"seed={int(seed)}")
    if limit is not None:
        args.append(f"limit={int(limit)}")
    if task_ids:
        args.append(f"task_ids=[{','.join(task_ids)}]")
    if label is not None:
        args.append(f"label={label}")
    target = resolve_target_pr(compose_config(method, [*args, *overrides]))  # method.target_pr: its calibrated knob
    done = run_experiment(resolve_run(target.cfg, target.record_fields()))
    frame = read_records(done.run_dir).frame
    records = frame[frame["task_id"].isin(set(done.task_ids))].reset_index(drop=True)
    return Evaluation(records=records, run_dir=done.run_dir, summary=done.summary)
