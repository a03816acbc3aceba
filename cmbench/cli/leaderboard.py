"""``python -m cmbench leaderboard``: leaderboard CSVs, markdown and the Pareto plot over run directories.

``runs=[dir, ...]`` names them (``run`` directories and ``score`` output folders alike); by default
every run directory under ``<out_dir>/<data>/``. The runs of one setup that differ only in ``seed``
are one row. ``leaderboard.out`` is the output folder (default ``<out_dir>/<data>/leaderboard``);
``leaderboard.compare=[a,b]`` adds paired comparisons to the default (each entry against FullKV) and
``leaderboard.focus=[label,...]`` compares those entries with every other instead of the default.
With a ``curves.csv`` in the output folder (``python -m cmbench curves`` writes it there) or
``leaderboard.curves=PATH``, the headline table gains "Score @ 85% PR" (docs/matched_pr.md). ``leaderboard.reference_aggregation=max``
(or ``mean``) shows every score as that aggregation of the task's references (records carry both).
``leaderboard.refresh_curves=true`` refills only that column of the board already in ``leaderboard.out``
from its curves (a curves rerun after the board was made), without the runs
(:func:`cmbench.report.leaderboard.refresh_matched_column`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from cmbench.errors import ConfigError
from cmbench.spec import RunSpec


def comparison_labels(cfg: DictConfig, key: str) -> Any:
    """A list knob of ``leaderboard`` as plain Python (None when unset)."""
    value = OmegaConf.select(cfg, f"leaderboard.{key}")
    if value is None:
        return None
    if isinstance(value, ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, str):
        return [value]
    raise ConfigError(f"leaderboard.{key}={value!r}: expected a list of method labels")


def find_run_dirs(cfg: DictConfig) -> list[Path]:
    """``cfg.runs`` when given, else every run directory (one with records) under ``<out_dir>/<data>/``."""
    from cmbench.spec import data_dir

    base = data_dir(cfg)
    return [Path(str(r)) for r in cfg.runs or []] or sorted(
        p for p in base.glob("*") if p.is_dir() and any(p.glob("records*.jsonl"))
    )


def selected_task_ids(specs: list[RunSpec]) -> list[str]:
    """The tasks the runs of ``specs`` selected (``task_ids`` / ``subset`` / ``limit``), in manifest order."""
    from cmbench.data import load_manifest
    from cmbench.runs.runner import select_tasks

    chosen: dict[str, None] = {}
    for spec in specs:
        tasks = load_manifest(str(spec.data.root), spec.data.manifest)
        sel = spec.selection
        chosen.update(dict.fromkeys(t.task_id for t in select_tasks(
            tasks, task_ids=sel.task_ids, limit=sel.limit, seed=sel.sample_seed)))
    return list(chosen)


def write_leaderboard(cfg: DictConfig, runs: list[Path] | None = None, task_ids: list[str] | None = None) -> int:
    """Write every report over ``runs`` (default: ``cfg.runs``, else every run under ``out_dir/<data>``);
    with ``task_ids``, over the records of those tasks only (a sweep's board: :func:`selected_task_ids`)."""
    from cmbench.report import write_reports
    from cmbench.spec import data_dir

    runs = runs or find_run_dirs(cfg)
    out = Path(str(cfg.leaderboard.out or data_dir(cfg) / "leaderboard"))
    paths = write_reports(runs, out, allow_mixed=bool(cfg.leaderboard.allow_mixed), focus=comparison_labels(cfg, "focus"),
                          compare=comparison_labels(cfg, "compare"), curves=cfg.leaderboard.get("curves"),
                          reference_aggregation=cfg.leaderboard.get("reference_aggregation"), task_ids=task_ids)
    print(paths["leaderboard.md"].read_text(), end="")
    print(f"wrote {', '.join(sorted(p.name for p in paths.values()))} to {out}")
    return 0


def refresh_leaderboard(cfg: DictConfig) -> int:
    """Refill "Score @ 85% PR" of the board in ``leaderboard.out`` from its curves; print the board."""
    from cmbench.report.leaderboard import refresh_matched_column
    from cmbench.spec import data_dir

    out = Path(str(cfg.leaderboard.out or data_dir(cfg) / "leaderboard"))
    paths = refresh_matched_column(out, cfg.leaderboard.get("curves"))
    print(paths["leaderboard.md"].read_text(), end="")
    print(f"refilled Score @ 85% PR from the curves; wrote {', '.join(sorted(paths))} to {out} (runs not read)")
    return 0


def execute(cfg: DictConfig) -> int:
    if cfg.leaderboard.get("refresh_curves"):
        return refresh_leaderboard(cfg)
    return write_leaderboard(cfg)
