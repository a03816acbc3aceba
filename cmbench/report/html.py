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

Run folders are data, never code (docs/report.md, "What a report trusts"): the dataset adapter a
folder's ``config.yaml`` names is used only when it is a registered adapter or one a data config of
the user's own config search path names (:func:`check_adapter`); a video a record names is shown only
when it lies inside its folder (:func:`continuation_video`); only the frames shown are decoded, a
bounded number whatever a file's header claims. The page is built in a sibling folder and swapped in
whole, over an earlier report only (:func:`check_report_folder`).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from omegaconf import DictConfig, OmegaConf

from cmbench import bounded_read
from cmbench.config_paths import config_dirs
from cmbench.data import Task, load_manifest
from cmbench.data.adapter import ADAPTERS, DatasetAdapter, build_adapter
from cmbench.data.video import sample_frames
from cmbench.report import gallery
from cmbench.report.gate import MARGIN, backbone_gate
from cmbench.report.frame_curves import frame_curves, frame_curves_plot
from cmbench.runs.atomic import dead_builds
from cmbench.runs.output_folder import Legacy, OutputFolder, claim
from cmbench.report.reading import entry_tasks, folder_config, task_set_note
from cmbench.report.suspect import SUSPECT_COLUMN, SUSPECT_MARK, ranked, suspect_note
from cmbench.report.leaderboard import (
    FIDELITY_LABELS,
    FLAG_COLUMN,
    FLAG_MARK,
    MATCHED_NOTE,
    REFERENCE_METHOD,
    UNDEFINED_COLUMN,
    ReportError,
    RunRecords,
    board_metric,
    breakdown,
    comparison_pairs,
    comparisons,
    frame_count_note,
    leaderboard,
    load_runs,
    paired_deltas,
    pareto_plot,
    shown_fidelity,
    shows_undefined,
)
from cmbench.scoring.quality_names import QUALITY_LABELS

INDEX = "index.html"
IMAGES = "img"
GENERATOR = '<meta name="generator" content="CMBench report">'  # marks a folder as a report ``report`` may replace
BUILD_PREFIX = ".{name}.report-"  # sibling folder a report is built in, then swapped in (+ process id)
LOSSES_SHOWN = 8  # tasks listed in "where X loses most against FullKV"

# headers of the columns the leaderboard functions produce today; any other column gets its own name
LABELS = {
    "method": "Method", "metric": "Metric", "score": "Score", "score_ci95": "± 95% CI", "pr": "PR", "context_pr": "Context PR",
    "speedup_vs_fullkv": "FPS speed-up vs FullKV", "continuation_fps": "FPS", "peak_kv_bytes": "Peak KV (MB)",
    "cost_speedup_vs_fullkv": "Speed-up vs FullKV (attention)", "attention_keys_per_token": "Keys read / token",
    "fps_measured_together": "FPS measured together", "seeds": "Seeds", "score_seed_std": "Seed sd",
    "other_code_tasks": "From other code", "p_value": "p", "seed": "Seed", FLAG_COLUMN: f"Frame-count flags {FLAG_MARK}",
    "n_tasks": "Tasks", "failures": "Failed", "source": "Source", "task_type": "Task type",
    "delta_vs_fullkv": "Δ score vs FullKV", "delta_ci95": "± 95% CI", "wins": "Wins", "ties": "Ties",
    "losses": "Losses", "n_pairs": "Pairs", "p_adjusted": "Adjusted p", "verdict": "Verdict", "contexts": "Contexts", "versus": "Versus", "versus_pr": "Versus PR", "delta": "Δ score",
    "test": "Test", "kv_bytes_ratio": "KV bytes / FullKV", SUSPECT_COLUMN: f"Suspect continuations {SUSPECT_MARK}",
    "ranked": "Ranked", "quality_undefined": "Still tasks (quality undefined)", "task_count": "Distinct tasks",
    "unshared_tasks": "Tasks left out (not run by all)",
    **QUALITY_LABELS, **FIDELITY_LABELS,
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


UNDEFINED = Cell("undefined", "", True)
"""A frame-comparing quality metric of an entry whose continuations were all still, black or one frame."""


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
    elif name == "pr" or name.endswith("_pr") or name.startswith("pr_") or name.endswith("_ratio"):
        text = f"{100 * v:.2f}%"
    elif "psnr" in name:
        text = "∞" if v == math.inf else f"{v:.2f}"
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
    return Cell(text, repr(v) if math.isfinite(v) else ("Infinity" if v > 0 else "-Infinity"), True)  # JS's names


HEADLINE = ("method", "metric", "score", "score_ci95", "score_at_85pr", "pr", "kv_bytes_ratio", "cost_speedup_vs_fullkv",
            "speedup_vs_fullkv", "continuation_fps", "peak_kv_bytes", "seeds", "n_tasks", "failures", FLAG_COLUMN,
            SUSPECT_COLUMN, "ranked")
"""The leaderboard's columns in the page's first table (the markdown board's); the rest follow in a second
table, so the first fits a 1400-pixel window."""


def split_board(board: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``board`` as the page's two leaderboard tables: the :data:`HEADLINE` columns it has, and ``method`` with
    every other column (quality, fidelity, host store, context PR, ...; a column added to the board shows there)."""
    first = [c for c in board.columns if c in HEADLINE]
    return board[first], board[["method", *[c for c in board.columns if c not in first]]]


def table(id_: str, title: str, frame: pd.DataFrame, note: str = "") -> Table:
    """Every column of ``frame``, in its order, as a sortable table (``score`` headed by its metric)."""
    labels = dict(LABELS)
    if "metric" in frame and len(frame):
        labels["score"] = board_metric(frame)
    columns = [(str(c), labels.get(str(c), str(c).replace("_", " "))) for c in frame.columns]
    still = frame[UNDEFINED_COLUMN].tolist() if UNDEFINED_COLUMN in frame else [0] * len(frame)
    rows = [[UNDEFINED if shows_undefined(n, str(c), value) else format_value(str(c), value)
             for c, value in zip(frame.columns, row)]
            for n, row in zip(still, frame.itertuples(index=False, name=None))]
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
    data = folder_config(run.path).get("data")
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


def user_adapters() -> set[str]:
    """The dataset adapters the data configs of the user's config search path name (``configs/data/``
    and ``CMBENCH_CONFIG_PATH``): code the user chose to trust."""
    named = set()
    for folder in config_dirs():
        for path in sorted((folder / "data").glob("*.yaml")):
            try:
                config = OmegaConf.load(path)
            except Exception:  # a malformed yaml names nothing (``ls`` and ``run`` report it)
                continue
            adapter = config.get("adapter") if isinstance(config, DictConfig) else None
            if adapter:
                named.add(str(adapter))
    return named


def check_adapter(run: RunRecords, data: dict[str, Any]) -> None:
    """Refuse a folder whose dataset adapter is not one the user trusts; nothing it names is imported.

    A run folder's ``config.yaml`` is data: its ``data.adapter`` is used only when it is a registered
    adapter (built-in or an installed plug-in's entry point) or named by a data config of the user's
    own config search path (:func:`user_adapters`).

    Raises
    ------
    ReportError
        Any other adapter, naming it and how to trust it.
    """
    name = str(data.get("adapter") or "official")
    if name not in ADAPTERS and name not in user_adapters():
        raise ReportError(f"{run.path}: its config.yaml names the dataset adapter {name!r}, which is neither a "
                          f"registered adapter ({', '.join(ADAPTERS.names())}) nor named by a data config of yours "
                          f"(configs/data/, CMBENCH_CONFIG_PATH); a run folder is data and never names code: add a "
                          f"data config with `adapter: {name}` to your config path if you trust it")


def load_tasks(runs: list[RunRecords], data_root: str | Path | None = None) -> dict[str, tuple[Task, DatasetAdapter]]:
    """Every task the runs have records for, by task id, with the adapter of its dataset (each folder's
    checked by :func:`check_adapter`)."""
    datasets: dict[Path, Dataset] = {}
    found: dict[str, tuple[Task, DatasetAdapter]] = {}
    for run in runs:
        manifest, data = _dataset_of(run, None if data_root is None else Path(data_root))
        check_adapter(run, data)
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
    """Per task (in the order given), its reference images (annotated box drawn); only the referenced
    frames are decoded (:meth:`DatasetAdapter.references`)."""
    views: dict[str, list[dict[str, Any]]] = {}
    for number, (task, adapter) in enumerate(tasks):
        references = adapter.references(task)
        views[task.task_id] = []
        for i, (frame, key, ref) in enumerate(zip(references.frames(), references.keys, task.references)):
            name = f"{IMAGES}/ref/t{number:04d}_{i}.png"
            gallery.reference_image(out / name, frame, ref.bbox_xyxy_normalized)
            index = key.rpartition("@")[2]  # content names end in @<frame index> when they come from a video
            shown = index if index.isdigit() else (ref.frame_index if ref.frame_index is not None
                                                    else f"at {ref.timestamp_seconds:g} s")
            views[task.task_id].append({"src": name, "frame": shown})
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


class OutsideFolder(ReportError):
    """A record names a video outside its folder."""


def video_roots(folder: Path) -> list[Path]:
    """Where a folder's videos may be: inside the folder, and for a ``score`` output in its default place
    (``<videos>/scores_<scorer>``) the videos folder it sits in, when its ``config.yaml`` names that one."""
    roots = [folder.resolve()]
    videos = folder_config(folder).get("videos")
    if isinstance(videos, str) and videos and Path(videos).resolve() == folder.resolve().parent:
        roots.append(folder.resolve().parent)
    return roots


def continuation_video(folder: Path, record: dict[str, Any]) -> Path | None:
    """The continuation a record scored: its ``video`` (relative to the folder, or as given), else
    ``videos/<task_id>.mkv`` (lossless) or ``.mp4`` of the folder; None when none is there.

    Only a file inside :func:`video_roots` is taken, the path resolved (``..`` and links followed).

    Raises
    ------
    OutsideFolder
        The record names a file outside them (and none is in the folder's ``videos/``).
    """
    roots = video_roots(folder)
    candidates = []
    named = record.get("video")
    if isinstance(named, str) and named:
        candidates += [Path(named)] if Path(named).is_absolute() else [folder / named, Path(named)]
    candidates += [folder / "videos" / f"{record['task_id']}{suffix}" for suffix in (".mkv", ".mp4")]
    outside = None
    for path in candidates:
        if path.is_file():
            if any(path.resolve().is_relative_to(root) for root in roots):
                return path
            outside = outside or path
    if outside is not None:
        raise OutsideFolder(f"{folder}: task {record['task_id']}: its video {named} is outside the folder")
    return None


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
    try:
        video = continuation_video(Path(record["folder"]), record)
    except OutsideFolder:
        cell["error"] = "video outside its folder: not shown"
        return cell
    if video is None:
        cell["error"] = "no video saved (save_videos=false?)"
        return cell
    # only the frames shown are decoded into memory, shrunk to display size as they come
    sample = sample_frames(video, gallery.MAX_ANIMATION_FRAMES, keep=best, transform=gallery.shrink)
    if best is not None and sample.kept is None:
        raise ReportError(f"{run.path}: task {record['task_id']}: the record's best frame {best} is past the "
                          f"end of {video} ({sample.count} frames)")
    animation = f"{IMAGES}/m{index:02d}/t{task_number:04d}.webp"
    still = f"{IMAGES}/m{index:02d}/t{task_number:04d}_best.png"
    gallery.continuation_images(out / animation, out / still, sample.frames, (sample.fps or 16.0) / sample.spacing,
                                sample.frames[-1] if sample.kept is None else sample.kept, box)
    cell.update(animation=animation, best=still, frames=sample.count)
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
        "config": (bounded_read.read_text(config_file, "config", errors="replace") if config_file.is_file()
                   else "(no config.yaml in the run directory)"),
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
    shared_tasks: bool = False,
    data_root: str | Path | None = None,
    title: str = "CMBench report",
    focus: Sequence[str] | None = None,
    compare: Sequence[Any] | None = None,
    curves: pd.DataFrame | None = None,
    allow_suspect: bool = False,
) -> ReportOutput:
    """Write the report of ``run_dirs`` into ``out_dir`` (its ``index.html`` and ``img/`` are replaced).

    Parameters
    ----------
    run_dirs : run directories (``records*.jsonl``, ``config.yaml``, ``videos/``), one method each
    out_dir : the report folder
    allow_mixed : report runs with different task sets, seeds or scorers together
    shared_tasks : runs that ran different tasks: report the tasks all of them ran
    data_root : where the runs' dataset is now, when it moved since the runs
    title : the page title
    focus, compare : the paired comparisons shown, as for the leaderboard (default: each entry against
        FullKV; :func:`cmbench.report.comparisons.comparison_pairs`)
    curves : a ``curves.csv`` table: the leaderboard gains "Score @ 85% PR" (its note says where it comes from)
    allow_suspect : rank entries with a suspect continuation by score too (default: after the others,
        :mod:`cmbench.report.suspect`)

    Returns
    -------
    ReportOutput with the index path, file count, total bytes and seconds taken.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    check_report_folder(out)
    runs = load_runs(run_dirs, allow_mixed, shared_tasks=shared_tasks)
    tasks = load_tasks(runs, data_root)
    stale = remove_stale_builds(out)
    if stale:
        print(f"report: removed {len(stale)} folder(s) left by killed reports: {', '.join(p.name for p in stale)}",
              file=sys.stderr)
    build = out.parent / f"{BUILD_PREFIX.format(name=out.name)}{os.getpid()}"
    try:
        shutil.rmtree(build, ignore_errors=True)
        OutputFolder(build, "report", "report.out").add(INDEX, IMAGES)  # the marker of the folder that replaces out
        (build / IMAGES).mkdir(parents=True)
        page, methods = _write_page(runs, tasks, build, title=title, focus=focus, compare=compare, curves=curves,
                                    allow_suspect=allow_suspect)
        files = [page, *(p for p in (build / IMAGES).rglob("*") if p.is_file())]
        size = sum(p.stat().st_size for p in files)
        swap_in(build, out)
    except OSError as err:
        raise ReportError(f"cannot write the report into {out}: {err.strerror or err} (the previous report, "
                          f"if any, is unchanged)") from err
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return ReportOutput(index=out / INDEX, files=len(files), bytes=size, seconds=time.perf_counter() - start,
                        methods=methods, tasks=len(tasks))


def _write_page(runs: list[RunRecords], tasks: dict[str, tuple[Task, DatasetAdapter]], out: Path, *, title: str,
                focus: Sequence[str] | None, compare: Sequence[Any] | None, curves: pd.DataFrame | None,
                allow_suspect: bool = False) -> tuple[Path, list[str]]:
    """Write ``index.html`` and its images into ``out`` (an empty folder with ``img/``); the page's path
    and the methods in the order shown."""

    board = ranked(leaderboard(runs, curves), allow_suspect)
    order = {label: i for i, label in enumerate(board["method"])}
    runs = sorted(runs, key=lambda r: (r.label != REFERENCE_METHOD, order.get(r.label, len(order))))
    shown = board.drop(columns=[c for c in FIDELITY_LABELS if c in board.columns and c not in shown_fidelity(board)])
    headline, rest = split_board(shown)
    tasks_note = task_set_note(entry_tasks(runs))  # entries over different tasks: said above their means
    tables = [
        table("leaderboard", "Leaderboard", headline,
              "Score: mean over finished tasks, 95% CI clustered by context. Click a header to sort."
              + ("" if curves is None else " score_at_85pr: " + MATCHED_NOTE.split(": ", 1)[1])
              + (f" {frame_count_note(board)}" if frame_count_note(board) else "")
              + (f" {suspect_note(board)}" if suspect_note(board) else "")
              + (f" Task sets: {tasks_note}." if tasks_note else "")),
        table("leaderboard-more", "Leaderboard: the other columns", rest,
              "Each entry's other measures (quality, fidelity to FullKV, host store, context PR, FLOPs, tasks ...), "
              "in the leaderboard's row order."),
        table("by-source", "Per source", breakdown(runs, "source")),
        table("by-type", "Per task type", breakdown(runs, "task_type")),
        table("paired", "Paired deltas against FullKV", paired_deltas(runs),
              "Per task (matched by task and seed), method score minus FullKV score."),
        table("comparisons", "Paired comparisons", comparison_table(runs, board, focus, compare),
              "Method score minus versus score over the (task, seed) pairs both finished, with both PRs; "
              "95% CI clustered by context; p: cluster-robust paired t-test; adjusted p: p times the number of "
              "tests in this table (Bonferroni: the tests one table prints are one family); verdict: the method against "
              "versus read as an equivalence claim on the table's simultaneous intervals (docs/verdicts.md). Pairs: "
              "each entry against FullKV, or leaderboard.focus against every other, plus leaderboard.compare."),
    ]
    gated = backbone_gate(runs)
    if len(gated):  # first: a failed gate says the rest of the page measures nothing about memory
        tables.insert(0, table("gate", "Backbone gate: FullKV against the no-context control", gated,
                               f"FullKV minus Streaming with recent_chunks=0 (the sink only), paired by task and seed, 95% CI "
                               f"clustered by context; decided by the verdict rule as one family (docs/verdicts.md): a "
                               f"backbone passes when all of its simultaneous interval lies above +{MARGIN:g}, fails when it "
                               f"lies within ±{MARGIN:g} (level with forgetting) or below, and is inconclusive otherwise. "
                               "A backbone that does not pass has not shown that it uses its context: comparing compression "
                               "methods on it says nothing about memory (the paper's reason for choosing LingBot World v2)."))
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
    return page, [r.label for r in runs]


def is_report(folder: Path) -> bool:
    """Whether a folder holds a CMBench report and nothing else (``index.html`` marked as ours, ``img/``)."""
    names = {p.name for p in folder.iterdir()}
    if not names <= {INDEX, IMAGES} or not (folder / INDEX).is_file() or (folder / INDEX).is_symlink():
        return False
    with open(folder / INDEX, encoding="utf-8", errors="replace") as page:
        return GENERATOR in page.read(4096)


EARLIER = Legacy(required=((INDEX,),), names=(INDEX, IMAGES), recognise=is_report)
"""A report written before output folders were marked: its page (marked as CMBench's) and images only."""


def check_report_folder(out: Path) -> None:
    """Refuse an output folder that is not missing, empty or an earlier CMBench report holding nothing else
    (the report replaces the folder whole).

    Raises
    ------
    cmbench.runs.output_folder.OutputFolderError
        Naming the folder and why.
    """
    claim(out, "report", "report.out", names=(INDEX, IMAGES), legacy=EARLIER, whole=True)


def remove_stale_builds(out: Path) -> list[Path]:
    """Remove the sibling build folders of ``out`` that reports killed half-way left; a report killed
    between moving the earlier one aside and the new one in gets the earlier one back."""
    gone = []
    for folder, rest in dead_builds(out, BUILD_PREFIX.format(name=out.name)):
        if rest == "old" and not out.exists():
            os.replace(folder, out)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        gone.append(folder)
    return gone


def swap_in(build: Path, out: Path) -> None:
    """Put the folder ``build`` in the place of ``out`` (an earlier report, removed once replaced)."""
    old = out.parent / f"{BUILD_PREFIX.format(name=out.name)}{os.getpid()}-old"
    if out.exists():
        os.replace(out, old)
    try:
        os.replace(build, out)
    except OSError:
        if old.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


__all__ = ["ReportOutput", "build_report", "comparison_table", "format_value", "load_runs", "load_tasks", "table"]
