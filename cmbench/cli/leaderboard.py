"""``python -m cmbench leaderboard``: leaderboard CSVs, markdown and the Pareto plot over run directories.

``runs=[dir, ...]`` names them (``run`` directories and ``score`` output folders alike); by default
every run directory under ``<out_dir>/<data>/``.
``leaderboard.out`` is the output folder (default ``<out_dir>/<data>/leaderboard``).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig


def write_leaderboard(cfg: DictConfig, runs: list[Path] | None = None) -> int:
    """Write every report over ``runs`` (default: ``cfg.runs``, else every run under ``out_dir/<data>``)."""
    from cmbench.report import write_reports
    from cmbench.runs.experiment import data_dir

    base = data_dir(cfg)
    runs = runs or [Path(str(r)) for r in cfg.runs or []] or sorted(
        p for p in base.glob("*") if p.is_dir() and any(p.glob("records*.jsonl"))
    )
    out = Path(str(cfg.leaderboard.out or base / "leaderboard"))
    paths = write_reports(runs, out, allow_mixed=bool(cfg.leaderboard.allow_mixed))
    print(paths["leaderboard.md"].read_text(), end="")
    print(f"wrote {', '.join(sorted(p.name for p in paths.values()))} to {out}")
    return 0


def execute(cfg: DictConfig) -> int:
    return write_leaderboard(cfg)
