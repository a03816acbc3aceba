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
``leaderboard.merge=[a/leaderboard.json, b/leaderboard.json]`` merges received boards (one task set, scorer
and schema version) into one in ``leaderboard.out``, without runs (:mod:`cmbench.report.leaderboard_json`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from cmbench.errors import ConfigError
from cmbench.hashing import config_hash
from cmbench.spec import RunSpec, flag


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


def board_dir(cfg: DictConfig) -> Path:
    """``leaderboard.out``, default ``<out_dir>/<data>/leaderboard``: where the board over every run goes."""
    from cmbench.spec import data_dir

    return Path(str(cfg.leaderboard.out or data_dir(cfg) / "leaderboard"))


def _write(cfg: DictConfig, runs: list[Path], out: Path, task_ids: list[str] | None = None,
           curves: Path | None = None) -> dict[str, Path]:
    """Every report over ``runs`` into ``out``, with the options of ``cfg.leaderboard`` (``curves``:
    instead of ``leaderboard.curves``)."""
    from cmbench.report import write_reports

    return write_reports(runs, out, allow_mixed=flag(cfg.leaderboard.allow_mixed, "leaderboard.allow_mixed"), focus=comparison_labels(cfg, "focus"),
                         compare=comparison_labels(cfg, "compare"), curves=curves or cfg.leaderboard.get("curves"),
                         allow_suspect=flag(cfg.leaderboard.get("allow_suspect", False), "leaderboard.allow_suspect"),
                         reference_aggregation=cfg.leaderboard.get("reference_aggregation"), task_ids=task_ids,
                         shared_tasks=flag(cfg.leaderboard.get("shared_tasks", False), "leaderboard.shared_tasks"),
                         families=flag(cfg.leaderboard.get("families", False), "leaderboard.families"))


def write_leaderboard(cfg: DictConfig, runs: list[Path] | None = None, task_ids: list[str] | None = None,
                      out: Path | None = None, curves: Path | None = None) -> int:
    """Write every report over ``runs`` (default: ``cfg.runs``, else every run under ``out_dir/<data>``)
    into ``out`` (default: :func:`board_dir`) and print the board; with ``task_ids``, over the records
    of those tasks only (a sweep's board: :func:`selected_task_ids`)."""
    out = out or board_dir(cfg)
    paths = _write(cfg, runs or find_run_dirs(cfg), out, task_ids, curves)
    print(paths["leaderboard.md"].read_text(), end="")
    print(f"wrote {', '.join(sorted(p.name for p in paths.values()))} to {out}")
    return 0


def sweep_name(runs: list[Path], task_ids: list[str]) -> str:
    """The folder of a sweep's board: the methods its run directories name (the first three and how
    many more, past four) and a hash of those directories and the tasks, ``fullkv+decoprune__<hash>``;
    the same sweep again names the same folder."""
    names = sorted(Path(r).name for r in runs)
    methods = list(dict.fromkeys(name.split("__")[0] for name in names))
    shown = methods if len(methods) <= 4 else [*methods[:3], f"{len(methods) - 3}-more"]
    return f"{'+'.join(shown)}__{config_hash([names, sorted(task_ids)])}"


def write_sweep_leaderboards(cfg: DictConfig, runs: list[Path], task_ids: list[str]) -> int:
    """A sweep's boards: its own, over its ``runs`` on the tasks it ran, in
    ``<board_dir>/sweeps/<sweep_name>/`` (printed), and the board over every run (what ``leaderboard``
    writes) refreshed in :func:`board_dir`, so an earlier sweep's rows stay on it.

    A refused board over every run (runs of other task sets beside the sweep's) keeps the previous one,
    saying why on stderr; the sweep's own board is written either way.

    Returns
    -------
    int
        0 (the exit code).

    Raises
    ------
    ReportError
        The sweep's own board is refused or cannot be written.
    """
    from cmbench.report import ReportError
    from cmbench.report.board_folder import sweeps_folder
    from cmbench.report.curves import CURVES_FILE

    full = board_dir(cfg)
    curves = full / CURVES_FILE  # a sweep's board shows "Score @ 85% PR" from the curves of the full board
    write_leaderboard(cfg, runs, task_ids, out=sweeps_folder(full, sweep_name(runs, task_ids)),
                      curves=curves if curves.is_file() else None)
    every = find_run_dirs(cfg)
    try:
        _write(cfg, every, full)
    except ReportError as err:
        print(f"run: the full leaderboard in {full} is not refreshed: {err}", file=sys.stderr)
    else:
        print(f"refreshed the full leaderboard ({len(every)} runs) in {full}")
    return 0


def refresh_leaderboard(cfg: DictConfig) -> int:
    """Refill "Score @ 85% PR" of the board in ``leaderboard.out`` from its curves; print the board."""
    from cmbench.report.leaderboard import refresh_matched_column

    out = board_dir(cfg)
    paths = refresh_matched_column(out, cfg.leaderboard.get("curves"))
    print(paths["leaderboard.md"].read_text(), end="")
    print(f"refilled Score @ 85% PR from the curves; wrote {', '.join(sorted(paths))} to {out} (runs not read)")
    return 0


def merge_leaderboards(cfg: DictConfig, paths: list[str]) -> int:
    """One board from received ``leaderboard.json`` files into ``leaderboard.out``: its ``leaderboard.json``,
    ``leaderboard.csv``, per-source and per-task-type CSVs and markdown (what an earlier board there wrote
    and this one does not is removed); print it."""
    from cmbench.report.board_folder import REPORT_FILES, board_folder
    from cmbench.report.leaderboard import markdown_table
    from cmbench.report.leaderboard_json import FILE, board_tables, board_text, merge_boards
    from cmbench.runs import atomic

    out = board_dir(cfg)
    board = merge_boards(paths)
    tables = board_tables(board)
    texts = {FILE: board_text(board), "leaderboard.md": markdown_table(tables["leaderboard.csv"]),
             **{name: frame.to_csv(index=False, float_format="%.6g") for name, frame in tables.items()}}
    folder = board_folder(out)
    folder.add(*texts)
    for name, text in texts.items():
        atomic.write_text(out / name, text)
    for name in REPORT_FILES:
        if name not in texts and name in folder.files and (out / name).is_file():
            (out / name).unlink()
    print(texts["leaderboard.md"], end="")
    print(f"merged {len(paths)} boards ({len(board['rows'])} entries); wrote {', '.join(sorted(texts))} to {out}")
    return 0


def execute(cfg: DictConfig) -> int:
    merge = OmegaConf.select(cfg, "leaderboard.merge")
    if merge is not None:
        if not isinstance(merge, (ListConfig, str)):
            raise ConfigError(f"leaderboard.merge={merge!r}: expected a list of leaderboard.json files")
        return merge_leaderboards(cfg, [merge] if isinstance(merge, str) else [str(p) for p in merge])
    if cfg.leaderboard.get("refresh_curves"):
        return refresh_leaderboard(cfg)
    return write_leaderboard(cfg)
