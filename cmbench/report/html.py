"""A self-contained HTML report over run directories: one folder, ``index.html`` plus ``img/``.

The page holds the leaderboard and every other table :mod:`cmbench.report.leaderboard` computes
(rendered column by column from its DataFrames, so a new column shows up without a template edit),
the Pareto and per-frame recall plots, a task gallery and each run's config and provenance. It
references nothing outside its folder: no CDN, no fonts, no network; open it from disk.

The gallery shows, per task, the reference frame(s) with the annotated target box and label and,
per method, the continuation as an animated image, its best frame with the detected box
(:mod:`cmbench.report.gallery` says how both are derived from a record) and its score. Filters
choose a source, a task type and a method; a method's view starts with the tasks where it loses
most against FullKV (largest paired score drop).

Reference frames come from each run's dataset (``data.root`` / ``data.manifest`` of its
``config.yaml``, or ``data_root`` when the data moved); continuations from ``videos/<task_id>.mp4``
of each run directory.
"""

from __future__ import annotations

import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from omegaconf import OmegaConf

from cmbench.config_paths import to_dict
from cmbench.data import Task, load_manifest, read_video
from cmbench.data.adapter import DatasetAdapter, build_adapter
from cmbench.report import gallery
from cmbench.report.frame_curves import frame_curves, frame_curves_plot
from cmbench.report.leaderboard import (
    MATCHED_NOTE,
    REFERENCE_METHOD,
    ReportError,
    RunRecords,
    board_metric,
    breakdown,
    comparison_pairs,
    comparisons,
    leaderboard,
    load_runs,
    paired_deltas,
    pareto_plot,
)
from cmbench.data.references import reference_frames
from cmbench.runs.records import QUALITY_LABELS

INDEX = "index.html"
IMAGES = "img"
LOSSES_SHOWN = 8  # tasks listed in "where X loses most against FullKV"

# headers of the columns the leaderboard functions produce today; any other column gets its own name
LABELS = {
    "method": "Method", "metric": "Metric", "score": "Score", "score_ci95": "± 95% CI", "pr": "PR", "context_pr": "Context PR",
    "speedup_vs_fullkv": "FPS speed-up vs FullKV", "continuation_fps": "FPS", "peak_kv_bytes": "Peak KV (MB)",
    "cost_speedup_vs_fullkv": "Speed-up vs FullKV (attention)", "attention_keys_per_token": "Keys read / token",
    "fps_measured_together": "FPS measured together", "seeds": "Seeds", "score_seed_std": "Seed sd",
    "other_code_tasks": "From other code", "p_value": "p", "seed": "Seed",
    "n_tasks": "Tasks", "failures": "Failed", "source": "Source", "task_type": "Task type",
    "delta_vs_fullkv": "Δ score vs FullKV", "delta_ci95": "± 95% CI", "wins": "Wins", "ties": "Ties",
    "losses": "Losses", "n_pairs": "Pairs", "versus": "Versus", "versus_pr": "Versus PR", "delta": "Δ score",
    "test": "Test",
    **QUALITY_LABELS,
}


@dataclass(frozen=True)
class Cell:
    """One table cell: what is shown and what it sorts by (numbers numerically; NaN sorts last)."""

    text: str
    sort: str
    numeric: bool


@dataclass(frozen=True)
class Table:
    """A DataFrame made ready to show: column keys and headers, formatted rows."""

    id: str
    title: str
    note: str
    columns: list[tuple[str, str]]  # (DataFrame column, header)
    rows: list[list[Cell]]


@dataclass
class ReportOutput:
    """What :func:`build_report` wrote."""

    index: Path
    files: int
    bytes: int
    seconds: float
    methods: list[str] = field(default_factory=list)
    tasks: int = 0


def format_value(column: str, value: Any) -> Cell:
    """Format one value by what its column name says it is (fractions, bytes, ratios, counts)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return Cell("—", "", True)
    if isinstance(value, (bool, np.bool_)):
        return Cell("yes" if value else "no", str(int(value)), True)
    if isinstance(value, (int, np.integer)):
        return Cell(str(int(value)), str(int(value)), True)
    if not isinstance(value, (float, np.floating)):
        return Cell(str(value), str(value).lower(), False)
    v = float(value)
    name = column.lower()
    if name.endswith("_ci95"):
        text = f"± {v:.4f}"
    elif name == "pr" or name.endswith("_pr") or name.startswith("pr_"):
        text = f"{100 * v:.2f}%"
    elif "bytes" in name:
        text = f"{v / 1e6:.2f}"
    elif "speedup" in name:
        text = f"{v:.2f}x"
    elif "fps" in name or "seconds" in name:
        text = f"{v:.1f}"
    elif "per_token" in name or "flops" in name:
        text = f"{v:,.0f}"
    else:
        text = f"{v:.4f}"
    return Cell(text, repr(v), True)


def table(id_: str, title: str, frame: pd.DataFrame, note: str = "") -> Table:
    """Every column of ``frame``, in its order, as a sortable table (``score`` headed by its metric)."""
    labels = dict(LABELS)
    if "metric" in frame and len(frame):
        labels["score"] = board_metric(frame)
    columns = [(str(c), labels.get(str(c), str(c).replace("_", " "))) for c in frame.columns]
    rows = [[format_value(str(c), value) for c, value in zip(frame.columns, row)]
            for row in frame.itertuples(index=False, name=None)]
    return Table(id_, title, note, columns, rows)


def comparison_table(runs: list[RunRecords], board: pd.DataFrame, focus: Sequence[str] | None = None,
                     compare: Sequence[Any] | None = None) -> pd.DataFrame:
    """The leaderboard's paired comparisons (the rows of its ``comparisons.csv``) with each side's PR.

    Parameters
    ----------
    runs : the board's entries
    board : :func:`leaderboard` of ``runs`` (where the PRs come from)
    focus, compare : optional
        The pairs, as for the leaderboard (:func:`comparison_pairs`).

    Returns
    -------
    DataFrame: :func:`comparisons`' columns, with ``pr`` after ``method`` and ``versus_pr`` after ``versus``.
    """
    compared = comparisons(runs, comparison_pairs(runs, focus, compare))
    pr = dict(zip(board["method"], board["pr"]))
    compared.insert(1, "pr", compared["method"].map(pr).astype(float))
    compared.insert(3, "versus_pr", compared["versus"].map(pr).astype(float))
    return compared


@dataclass(frozen=True)
class Dataset:
    """The tasks a folder's records belong to and the adapter that reads their frames."""

    manifest: Path
    adapter: DatasetAdapter
    tasks: dict[str, Task]


def _dataset_of(run: RunRecords, data_root: Path | None) -> tuple[Path, dict[str, Any]]:
    """The manifest a folder was made from (:attr:`RunRecords.manifest`, or the one in ``data_root``)
    and the data config of its ``config.yaml`` with ``root`` and ``manifest`` pointing there."""
    config_file = run.path / "config.yaml"
    data = to_dict(OmegaConf.load(config_file)).get("data") if config_file.is_file() else None
    data = data if isinstance(data, dict) else {}
    manifest = run.manifest
    if data_root is not None:
        manifest = data_root / (manifest.name if manifest is not None else "metadata.jsonl")
    if manifest is None:
        raise ReportError(f"{run.path}: names no dataset (no data.root in its config.yaml); "
                          "pass the dataset's location as report.data_root=DIR")
    if not manifest.is_file():
        raise ReportError(f"{run.path}: its tasks' manifest {manifest} is not there; "
                          "pass the dataset's current location as report.data_root=DIR")
    return manifest, {**data, "root": str(manifest.parent), "manifest": manifest.name}


def load_tasks(runs: list[RunRecords], data_root: str | Path | None = None) -> dict[str, tuple[Task, DatasetAdapter]]:
    """Every task the runs have records for, by task id, with the adapter of its dataset."""
    datasets: dict[Path, Dataset] = {}
    found: dict[str, tuple[Task, DatasetAdapter]] = {}
    for run in runs:
        manifest, data = _dataset_of(run, None if data_root is None else Path(data_root))
        if manifest not in datasets:
            tasks = load_manifest(manifest.parent, manifest.name, check_videos=False)
            datasets[manifest] = Dataset(manifest, build_adapter(data), {t.task_id: t for t in tasks})
        dataset = datasets[manifest]
        missing = sorted(set(run.frame["task_id"]) - set(dataset.tasks))
        if missing:
            raise ReportError(f"{run.path}: records of tasks not in {manifest}: {missing[:5]}")
        for task_id in run.frame["task_id"]:
            found.setdefault(task_id, (dataset.tasks[task_id], dataset.adapter))
    return found


def _missing(value: Any) -> bool:
    """None, or NaN (a field some records of a run lack reads back from the DataFrame as NaN)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _score_text(value: Any) -> str:
    return "—" if _missing(value) else f"{float(value):.4f}"


def _reference_views(tasks: list[tuple[Task, DatasetAdapter]], out: Path) -> dict[str, list[dict[str, Any]]]:
    """Per task (in the order given), its reference images (annotated box drawn), reading each context once."""
    views: dict[str, list[dict[str, Any]]] = {}
    cached: tuple[str, np.ndarray, float] | None = None
    numbered = sorted(enumerate(tasks), key=lambda item: (item[1][0].context_id, item[1][0].task_id))
    for number, (task, adapter) in numbered:
        if cached is None or cached[0] != task.context_id:
            cached = (task.context_id, *adapter.reference_source(task))
        frames = reference_frames(task, cached[1], cached[2], native=True)
        views[task.task_id] = []
        for i, (frame, ref) in enumerate(zip(frames, task.references)):
            name = f"{IMAGES}/ref/t{number:04d}_{i}.png"
            gallery.reference_image(out / name, frame, ref.bbox_xyxy_normalized)
            views[task.task_id].append({"src": name, "frame": ref.frame_at(cached[2], native=True)})
    return views


def _best_frame(record: dict[str, Any]) -> tuple[int | None, list[float] | None]:
    """The record's ``best_frame`` and ``best_box``; for records written before those fields, the
    argmax of ``similarities`` and its entry of ``boxes`` (:func:`gallery.best_frame`)."""
    best: Any = record.get("best_frame")
    box = record.get("best_box")
    if not _missing(best):
        return int(best), (list(box) if isinstance(box, (list, tuple)) else None)
    similarities, boxes = record.get("similarities"), record.get("boxes")
    derived = gallery.best_frame(similarities if isinstance(similarities, list) else [])
    if derived is None or not isinstance(boxes, list) or derived >= len(boxes):
        return derived, None
    return derived, boxes[derived]


def continuation_video(folder: Path, record: dict[str, Any]) -> Path | None:
    """The continuation a record scored: its ``video`` (relative to the folder, or as given), else
    ``videos/<task_id>.mkv`` (lossless) or ``.mp4`` of the folder; None when none is there."""
    candidates = []
    named = record.get("video")
    if isinstance(named, str) and named:
        candidates += [Path(named)] if Path(named).is_absolute() else [folder / named, Path(named)]
    candidates += [folder / "videos" / f"{record['task_id']}{suffix}" for suffix in (".mkv", ".mp4")]
    return next((path for path in candidates if path.is_file()), None)


def _method_cell(run: RunRecords, index: int, record: dict[str, Any], task_number: int, out: Path) -> dict[str, Any]:
    """A method's view of one task: images (written here) and the numbers shown under them."""
    cell: dict[str, Any] = {"method": run.label, "status": record.get("status", "ok"),
                            "score": _score_text(record.get("score")), "error": "", "animation": None, "best": None,
                            "seed": None}
    if cell["status"] != "ok":
        error = record.get("error")
        lines = [] if _missing(error) else str(error).strip().splitlines()
        cell["error"] = lines[-1][:300] if lines else "failed"
        return cell
    best, box = _best_frame(record)
    rate: Any = record.get("detection_rate")
    cell.update(best_frame=best, detection_rate="—" if _missing(rate) else f"{100 * float(rate):.0f}%")
    if len(run.seeds) > 1:
        cell["seed"] = record.get("run_seed")
    video = continuation_video(Path(record["folder"]), record)
    if video is None:
        cell["error"] = "no video saved (save_videos=false?)"
        return cell
    frames, fps = read_video(video)
    if best is not None and best >= len(frames):
        raise ReportError(f"{run.path}: task {record['task_id']}: the record's best frame {best} is past the "
                          f"end of {video} ({len(frames)} frames)")
    animation = f"{IMAGES}/m{index:02d}/t{task_number:04d}.webp"
    still = f"{IMAGES}/m{index:02d}/t{task_number:04d}_best.png"
    gallery.continuation_images(out / animation, out / still, frames, fps or 16.0, best, box)
    cell.update(animation=animation, best=still, frames=len(frames))
    return cell


def _losses(runs: list[RunRecords]) -> dict[str, list[dict[str, Any]]]:
    """Per method, the tasks with the largest paired score drop against FullKV, largest first: one
    row per task, its scores and drop the means over the seeds both finished (``seeds``: how many)."""
    reference = next((r for r in runs if r.label == REFERENCE_METHOD), None)
    if reference is None:
        return {}
    ref = reference.frame[reference.frame["status"] == "ok"][["task_id", "seed", "score"]]
    out = {}
    for run in runs:
        if run is reference:
            continue
        ok = run.frame[run.frame["status"] == "ok"][["task_id", "seed", "score"]]
        pairs = ok.merge(ref, on=["task_id", "seed"], suffixes=("", "_ref"))
        pairs["drop"] = pairs["score_ref"] - pairs["score"]
        tasks = pairs.groupby("task_id", as_index=False).agg(score=("score", "mean"), score_ref=("score_ref", "mean"),
                                                             drop=("drop", "mean"), seeds=("drop", "size"))
        worst = tasks.sort_values(["drop", "task_id"], ascending=[False, True], kind="stable").head(LOSSES_SHOWN)
        out[run.label] = [{"task_id": r.task_id, "reference": _score_text(r.score_ref), "score": _score_text(r.score),
                           "drop": f"{r.drop:+.4f}", "seeds": int(r.seeds)} for r in worst.itertuples()]
    return out


def _provenance(run: RunRecords) -> dict[str, Any]:
    """What a run was made with: config, commits, versions, scorer, manifest, counts."""
    frame = run.frame

    def text(value: Any) -> str:
        return ", ".join(f"{k} {x}" for k, x in sorted(value.items())) if isinstance(value, dict) else str(value)

    def counted(column: str) -> list[tuple[str, int]]:
        values = [text(v) for v in frame[column] if not _missing(v)] if column in frame else []
        return sorted(Counter(values).items())

    facts = [(name, counted(column)) for name, column in [
        ("kind", "kind"), ("config hash", "config_hash"), ("method", "method"), ("backbone", "backbone"),
        ("scorer", "scorer"), ("scorer hash", "scorer_hash"), ("metric", "metric"), ("git commit", "git_commit"),
        ("versions", "versions"), ("record schema", "schema_version")]]
    if run.manifest is not None:
        checked = "" if run.checked else " (not there: records not checked against it)"
        facts.append(("manifest", [(f"{run.manifest}{checked}", len(frame))]))
    if run.dropped:
        facts.append(("left out", [(f"records of {len(run.dropped)} task(s) not in the manifest: "
                                    f"{', '.join(run.dropped[:10])}", len(run.dropped))]))
    config_file = run.path / "config.yaml"
    return {
        "label": run.label,
        "path": str(run.path),
        "records": len(frame),
        "failures": int((frame["status"] != "ok").sum()),
        "config": config_file.read_text() if config_file.is_file() else "(no config.yaml in the run directory)",
        "facts": [(name, values) for name, values in facts if values],
    }


def _environment() -> Environment:
    return Environment(loader=PackageLoader("cmbench.report", "templates"), autoescape=select_autoescape(default=True),
                       undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def build_report(
    run_dirs: Iterable[str | Path],
    out_dir: str | Path,
    *,
    allow_mixed: bool = False,
    data_root: str | Path | None = None,
    title: str = "CMBench report",
    focus: Sequence[str] | None = None,
    compare: Sequence[Any] | None = None,
    curves: pd.DataFrame | None = None,
) -> ReportOutput:
    """Write the report of ``run_dirs`` into ``out_dir`` (its ``index.html`` and ``img/`` are replaced).

    Parameters
    ----------
    run_dirs : run directories (``records*.jsonl``, ``config.yaml``, ``videos/``), one method each
    out_dir : the report folder
    allow_mixed : report runs with different task sets, seeds or scorers together
    data_root : where the runs' dataset is now, when it moved since the runs
    title : the page title
    focus, compare : the paired comparisons shown, as for the leaderboard (default: each plug-in method
        against every other entry; :func:`cmbench.report.leaderboard.comparison_pairs`)
    curves : a ``curves.csv`` table: the leaderboard gains "Score @ 85% PR" (its note says where it comes from)

    Returns
    -------
    ReportOutput with the index path, file count, total bytes and seconds taken.
    """
    start = time.perf_counter()
    runs = load_runs(run_dirs, allow_mixed)
    tasks = load_tasks(runs, data_root)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / IMAGES, ignore_errors=True)
    (out / IMAGES).mkdir()

    board = leaderboard(runs, curves).sort_values("score", ascending=False, kind="stable").reset_index(drop=True)
    order = {label: i for i, label in enumerate(board["method"])}
    runs = sorted(runs, key=lambda r: (r.label != REFERENCE_METHOD, order.get(r.label, len(order))))
    tables = [
        table("leaderboard", "Leaderboard", board,
              "Score: mean over finished tasks, 95% CI clustered by context. Click a header to sort."
              + ("" if curves is None else " score_at_85pr: " + MATCHED_NOTE.split(": ", 1)[1])),
        table("by-source", "Per source", breakdown(runs, "source")),
        table("by-type", "Per task type", breakdown(runs, "task_type")),
        table("paired", "Paired deltas against FullKV", paired_deltas(runs),
              "Per task (matched by task and seed), method score minus FullKV score."),
        table("comparisons", "Paired comparisons", comparison_table(runs, board, focus, compare),
              "Method score minus versus score over the (task, seed) pairs both finished, with both PRs; "
              "95% CI clustered by context; p: cluster-robust paired t-test. Pairs: each plug-in method "
              "against every other, plus leaderboard.focus / leaderboard.compare."),
    ]
    plots = [
        {"src": str(pareto_plot(board, out / IMAGES / "pareto.png").relative_to(out)),
         "alt": "pruning ratio against score, one point per method"},
        {"src": str(frame_curves_plot(frame_curves(runs), out / IMAGES / "frame_curves.png").relative_to(out)),
         "alt": "mean similarity and detection rate per continuation frame, one line per method"},
    ]

    with_adapters = sorted(tasks.values(), key=lambda item: item[0].task_id)
    task_list = [task for task, _ in with_adapters]
    references = _reference_views(with_adapters, out)
    records = {run.label: run.gallery_records() for run in runs}
    cards = []
    for number, task in enumerate(task_list):
        cells = []
        for index, run in enumerate(runs):
            record = records[run.label].get(task.task_id)
            if record is None:
                cells.append({"method": run.label, "status": "missing", "score": "—", "error": "no record",
                              "animation": None, "best": None})
            else:
                cells.append(_method_cell(run, index, record, number, out))
        cards.append({"task": task, "aliases": ", ".join(task.target_aliases), "references": references[task.task_id],
                      "cells": cells})

    html = _environment().get_template("report.html").render(
        title=title, tables=tables, plots=plots, cards=cards, methods=[r.label for r in runs],
        reference_method=REFERENCE_METHOD, losses=_losses(runs), losses_shown=LOSSES_SHOWN,
        sources=sorted({t.source for t in task_list}), task_types=sorted({t.task_type for t in task_list}),
        provenance=[_provenance(r) for r in runs],
    )
    page = out / INDEX
    page.write_text(html, encoding="utf-8")
    files = [page, *(p for p in (out / IMAGES).rglob("*") if p.is_file())]
    return ReportOutput(index=page, files=len(files), bytes=sum(p.stat().st_size for p in files),
                        seconds=time.perf_counter() - start, methods=[r.label for r in runs], tasks=len(task_list))


__all__ = ["ReportOutput", "build_report", "comparison_table", "format_value", "load_runs", "load_tasks", "table"]
