"""Leaderboards from run records: overall, per source, per task type, paired deltas, Pareto plot.

Reports are always regenerated from ``records*.jsonl`` files (of ``run`` directories and of ``score``
output folders alike), never edited by hand. Every table names its metric (``DINO`` for the paper's
scorer, the scorer's own name otherwise). Records of tasks outside a folder's manifest are left out
(and listed); an impossible value (a score outside [-1, 1]) is an error naming file, line and field.
Statistics:

- the benchmark score of a method is the mean task score over its finished tasks;
- 95% confidence intervals are cluster-robust over contexts (the two tasks of one context video are
  not independent): with task values ``x_i``, mean ``m`` and ``G`` contexts,
  ``se^2 = G / (G - 1) * sum_c (sum_{i in c} (x_i - m))^2 / n^2`` and ``ci = t_{0.975, G-1} * se``;
- paired deltas against FullKV match tasks by ``(task_id, seed)``; a folder whose seeds are unknown
  (``score`` of another generator's videos) pairs on ``task_id`` alone;
- speed-up is ``FPS(method) / FPS(FullKV)`` with ``FPS = sum of continuation frames / sum of
  continuation seconds`` over the tasks both ran, all taken from the same sweep.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from scipy import stats

from cmbench.config_paths import to_dict
from cmbench.data.manifest import validate_manifest
from cmbench.errors import CMBenchError
from cmbench.runs.paths import videos_label
from cmbench.runs.records import FIELD_NAMES, read_task_records

REFERENCE_METHOD = "fullkv"
UNNAMED_METRIC = "Score"  # records that do not name their metric (written before the field existed)
NUMERIC = ("seed", "score", "detection_rate", "pr", "target_pr", "context_pr", "kept_tokens", "kept_context_tokens",
           "peak_kv_bytes", "prefill_seconds", "continuation_seconds", "continuation_frames", "continuation_fps",
           "best_frame", "n_frames")


class ReportError(CMBenchError):
    """Runs cannot be compared (different task sets, seeds or scorers) or are unreadable."""


@dataclass(frozen=True)
class RunRecords:
    """The records of one folder (a ``run`` directory or a ``score`` output).

    Attributes
    ----------
    path : Path
    label : str
        The leaderboard name.
    frame : DataFrame
        One row per task and seed (the latest record), a column per task-record field.
    metric : str
        What ``score`` measures (``DINO``, a scorer's name, or ``Score`` when unnamed).
    manifest : Path or None
        The manifest the folder names (None: it names none).
    checked : bool
        Whether the records were checked against it (False when it is missing).
    dropped : tuple of str
        Task ids of records left out because the manifest has no such task.
    """

    path: Path
    label: str
    frame: pd.DataFrame
    metric: str = UNNAMED_METRIC
    manifest: Path | None = None
    checked: bool = False
    dropped: tuple[str, ...] = field(default=())


def _folder_files(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``config.yaml`` and ``summary.json`` of a folder (empty when absent)."""
    config = to_dict(OmegaConf.load(folder / "config.yaml")) if (folder / "config.yaml").is_file() else {}
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").is_file() else {}
    return config, (summary if isinstance(summary, dict) else {})


def folder_manifest(folder: str | Path) -> Path | None:
    """The manifest a ``run`` or ``score`` folder was made from (``data.root`` / ``data.manifest`` of
    its ``config.yaml``, else of its ``summary.json``; relative to the working directory), or None."""
    config, summary = _folder_files(Path(folder))
    data = config.get("data") or summary.get("data") or {}
    if not isinstance(data, dict) or not data.get("root"):
        return None
    return Path(str(data["root"])) / str(data.get("manifest") or "metadata.jsonl")


def _default_label(folder: Path) -> str:
    """The name of records that carry none (``score`` before the typed record): the scored videos
    folder's (from ``summary.json``), else the folder's own."""
    videos = _folder_files(folder)[1].get("videos")
    return videos_label(videos) if videos else folder.name


def read_records(run_dir: str | Path, task_ids: Iterable[str] | None = None) -> RunRecords:
    """Read every records file of a folder; the last record (in time) of a (task_id, seed) wins.

    Parameters
    ----------
    run_dir : path
        A ``run`` directory or a ``score`` output folder.
    task_ids : iterable of str or None
        The tasks that may appear; by default those of the folder's manifest
        (:func:`folder_manifest`), or all when it names none or it is missing.

    Raises
    ------
    ReportError
        No records, or records of several labels.
    cmbench.runs.records.RecordsError
        An unreadable line or an impossible value, naming file, line and field.
    """
    run_dir = Path(run_dir)
    rows = [r.to_json() for r in read_task_records(run_dir)]
    if not rows:
        raise ReportError(f"{run_dir}: no records (not a run directory, or nothing finished yet)")
    frame = pd.DataFrame(rows, columns=sorted(FIELD_NAMES))
    for name in NUMERIC:
        frame[name] = pd.to_numeric(frame[name], errors="coerce")
    frame["seed"] = frame["seed"].astype("Int64")  # None: unknown (another generator's videos)
    frame["label"] = frame["label"].fillna(_default_label(run_dir))
    manifest = folder_manifest(run_dir) if task_ids is None else None
    checked = task_ids is not None or (manifest is not None and manifest.is_file())
    if manifest is not None and checked:
        tasks, _ = validate_manifest(manifest.parent, manifest.name, check_videos=False)
        task_ids = [t.task_id for t in tasks]
        for name, value in (("context_id", lambda t: t.context_id), ("source", lambda t: t.source),
                            ("task_type", lambda t: t.task_type)):
            known = {t.task_id: value(t) for t in tasks}
            frame[name] = frame[name].fillna(frame["task_id"].map(known))
    dropped: tuple[str, ...] = ()
    if task_ids is not None:
        known = frame["task_id"].isin(set(task_ids))
        dropped = tuple(sorted(set(frame.loc[~known, "task_id"])))
        frame = frame[known]
    if frame.empty:
        raise ReportError(f"{run_dir}: no records of tasks in its manifest {manifest} (left out: {', '.join(dropped)})")
    frame = frame.drop_duplicates(subset=["task_id", "seed"], keep="last")
    labels = frame["label"].unique()
    if len(labels) != 1:
        raise ReportError(f"{run_dir}: records of several methods ({', '.join(map(str, labels))}) in one run")
    metrics = sorted({str(m) for m in frame["metric"].dropna()})
    if len(metrics) > 1:
        raise ReportError(f"{run_dir}: records of several metrics ({', '.join(metrics)}) in one folder")
    return RunRecords(run_dir, str(labels[0]), frame.reset_index(drop=True),
                      metric=metrics[0] if metrics else UNNAMED_METRIC, manifest=manifest, checked=checked,
                      dropped=dropped)


def clustered_mean_ci(values: np.ndarray, clusters: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of its cluster-robust confidence interval.

    Parameters
    ----------
    values : ndarray ``[n]``
    clusters : ndarray ``[n]``
        Cluster id of each value (the context video).

    Returns
    -------
    (mean, half_width); the half-width is NaN with fewer than two clusters.
    """
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = float(values.mean())
    resid = pd.Series(values - mean).groupby(np.asarray(clusters)).sum().to_numpy()
    g = len(resid)
    if g < 2:
        return mean, math.nan
    se = math.sqrt(g / (g - 1) * float((resid**2).sum()) / n**2)
    return mean, float(stats.t.ppf(0.5 + level / 2, g - 1) * se)


def check_comparable(runs: list[RunRecords], allow_mixed: bool = False) -> None:
    """Refuse runs that differ in task set, seeds or scorer config, saying how they differ."""
    if allow_mixed or len(runs) < 2:
        return
    first = runs[0]

    def signature(run: RunRecords) -> dict[str, Any]:
        f = run.frame
        return {
            "task set": frozenset(f["task_id"]),
            "seeds": frozenset(int(s) for s in f["seed"].dropna()),
            "scorer config": frozenset(f["scorer_hash"].astype(str)),
        }

    base = signature(first)
    for run in runs[1:]:
        other = signature(run)
        for key, value in base.items():
            if key == "seeds" and not (value and other[key]):
                continue  # a folder of unknown seeds (scored videos of another generator) pairs with any
            if other[key] != value:
                only_a = sorted(map(str, value - other[key]))[:5]
                only_b = sorted(map(str, other[key] - value))[:5]
                raise ReportError(
                    f"runs differ in {key}: {first.path} ({first.label}) has {only_a} that {run.path} "
                    f"({run.label}) lacks, which has {only_b}; compare like with like, or pass "
                    f"allow_mixed=true to report them anyway"
                )


def _summarise(frame: pd.DataFrame) -> dict[str, Any]:
    ok = frame[frame["status"] == "ok"]
    mean, ci = clustered_mean_ci(ok["score"].to_numpy(dtype=np.float64), ok["context_id"].to_numpy())
    return {
        "score": mean,
        "score_ci95": ci,
        "pr": _mean(ok["pr"]),
        "n_tasks": int(len(ok)),
        "failures": int((frame["status"] != "ok").sum()),
    }


def _fps(frame: pd.DataFrame) -> float:
    seconds = frame["continuation_seconds"].sum()
    return float(frame["continuation_frames"].sum() / seconds) if seconds > 0 else math.nan


def _mean(column: pd.Series) -> float:
    return float(column.mean()) if column.notna().any() else math.nan


def _pair_keys(a: RunRecords, b: RunRecords) -> list[str]:
    """Pair on (task_id, seed), or on task_id alone when either side's seeds are unknown."""
    seeded = a.frame["seed"].notna().any() and b.frame["seed"].notna().any()
    return ["task_id", "seed"] if seeded else ["task_id"]


def leaderboard(runs: list[RunRecords]) -> pd.DataFrame:
    """One row per run: metric, score (mean, 95% CI), PR, speed-up vs FullKV, FPS, peak KV bytes, counts.

    A run with no successful task gets a row with NaN means and its failure count.
    """
    reference = next((r for r in runs if r.label == REFERENCE_METHOD), None)
    rows = []
    for run in runs:
        ok = run.frame[run.frame["status"] == "ok"]
        row = {"method": run.label, "metric": run.metric, **_summarise(run.frame)}
        row["context_pr"] = _mean(ok["context_pr"])
        row["continuation_fps"] = _fps(ok)
        row["speedup_vs_fullkv"] = math.nan
        if reference is not None:
            keys = _pair_keys(run, reference)
            ref_ok = reference.frame[reference.frame["status"] == "ok"]
            both = ok.merge(ref_ok[keys], on=keys)
            ref_both = ref_ok.merge(ok[keys], on=keys)
            row["speedup_vs_fullkv"] = _fps(both) / _fps(ref_both) if len(both) else math.nan
        row["peak_kv_bytes"] = _mean(ok["peak_kv_bytes"])
        rows.append(row)
    cols = ["method", "metric", "score", "score_ci95", "pr", "context_pr", "speedup_vs_fullkv", "continuation_fps",
            "peak_kv_bytes", "n_tasks", "failures"]
    return pd.DataFrame(rows, columns=cols)


def breakdown(runs: list[RunRecords], by: str) -> pd.DataFrame:
    """Per-method score, CI, PR and counts for each value of ``by`` (``source`` or ``task_type``)."""
    rows = []
    for run in runs:
        for value, group in run.frame.groupby(by, sort=True):
            rows.append({"method": run.label, "metric": run.metric, by: value, **_summarise(group)})
    return pd.DataFrame(rows, columns=["method", "metric", by, "score", "score_ci95", "pr", "n_tasks", "failures"])


def paired_deltas(runs: list[RunRecords]) -> pd.DataFrame:
    """Per method: mean paired score difference to FullKV (cluster-robust CI) and win/tie/loss counts.

    Pairs are the (task_id, seed) both finished (task_id alone when a side's seeds are unknown).
    """
    reference = next((r for r in runs if r.label == REFERENCE_METHOD), None)
    cols = ["method", "metric", "delta_vs_fullkv", "delta_ci95", "wins", "ties", "losses", "n_pairs"]
    if reference is None:
        return pd.DataFrame(columns=cols)
    ref_ok = reference.frame[reference.frame["status"] == "ok"]
    rows = []
    for run in runs:
        if run is reference:
            continue
        keys = _pair_keys(run, reference)
        ok = run.frame[run.frame["status"] == "ok"]
        pairs = ok.merge(ref_ok[[*keys, "score"]], on=keys, suffixes=("", "_ref"))
        delta = (pairs["score"] - pairs["score_ref"]).to_numpy(dtype=np.float64)
        mean, ci = clustered_mean_ci(delta, pairs["context_id"].to_numpy())
        rows.append(
            {
                "method": run.label,
                "metric": run.metric,
                "delta_vs_fullkv": mean,
                "delta_ci95": ci,
                "wins": int((delta > 0).sum()),
                "ties": int((delta == 0).sum()),
                "losses": int((delta < 0).sum()),
                "n_pairs": int(len(delta)),
            }
        )
    return pd.DataFrame(rows, columns=cols)


def _cell(value: float, fmt: str) -> str:
    """A number for a table cell, ``—`` when it is NaN (nothing measured)."""
    return "—" if value is None or math.isnan(value) else fmt.format(value)


def board_metric(board: pd.DataFrame) -> str:
    """The metric a leaderboard reports (``DINO``, a scorer's name); several are joined by ``/``."""
    return " / ".join(sorted(set(board["metric"].astype(str)))) or UNNAMED_METRIC


def markdown_table(board: pd.DataFrame) -> str:
    """The leaderboard as a GitHub markdown table, its score column named by the metric (score
    with CI, PR and speed-up as percentages/ratios, ``—`` where nothing was measured)."""
    lines = [f"| Method | {board_metric(board)} (95% CI) | PR | Speed-up | FPS | Peak KV (MB) | Tasks | Failed |",
             "|---|---|---|---|---|---|---|---|"]
    for r in board.itertuples():
        ci = "" if math.isnan(r.score_ci95) else f" ± {r.score_ci95:.4f}"
        lines.append(
            f"| {r.method} | {_cell(r.score, '{:.4f}')}{ci} | {_cell(100 * r.pr, '{:.2f}%')} | "
            f"{_cell(r.speedup_vs_fullkv, '{:.2f}x')} | {_cell(r.continuation_fps, '{:.1f}')} | "
            f"{_cell(r.peak_kv_bytes / 1e6, '{:.2f}')} | {r.n_tasks} | {r.failures} |"
        )
    return "\n".join(lines) + "\n"


def pareto_plot(board: pd.DataFrame, path: Path, title: str = "CMBench: memory vs pruning") -> Path:
    """Scatter of PR (x) against score (y), one labelled point per method, CI as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    for r in board.itertuples():
        if math.isnan(r.pr) or math.isnan(r.score):
            continue  # nothing to place (no PR: scored videos of another generator; no score: all failed)
        yerr = None if math.isnan(r.score_ci95) else r.score_ci95
        ax.errorbar(100 * r.pr, r.score, yerr=yerr, fmt="o", capsize=3)
        ax.annotate(r.method, (100 * r.pr, r.score), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("pruning ratio PR (%)")
    ax.set_ylabel(f"{board_metric(board)} (mean max-similarity)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_reports(run_dirs: Iterable[str | Path], out_dir: str | Path, allow_mixed: bool = False) -> dict[str, Path]:
    """Read runs, check they are comparable, and write every report into ``out_dir``.

    ``run_dirs`` may mix ``run`` directories and ``score`` output folders. Records of tasks outside
    a folder's manifest are left out, saying so on stderr.

    Returns
    -------
    dict name -> written path: leaderboard.csv, leaderboard_by_source.csv, leaderboard_by_type.csv,
    paired_deltas.csv, leaderboard.md, pareto.png.
    """
    runs = [read_records(d) for d in run_dirs]
    if not runs:
        raise ReportError("no run directories given")
    for run in runs:
        if run.manifest is not None and not run.checked:
            print(f"leaderboard: {run.path}: its manifest {run.manifest} is not there (run from another "
                  f"folder?): records not checked against it", file=sys.stderr)
        if run.dropped:
            print(f"leaderboard: {run.path}: left out the records of {len(run.dropped)} task(s) not in "
                  f"{run.manifest}: {', '.join(run.dropped[:10])}{' ...' if len(run.dropped) > 10 else ''}",
                  file=sys.stderr)
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise ReportError(f"several runs share a method label: {labels}; give each a distinct label")
    check_comparable(runs, allow_mixed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    board = leaderboard(runs).sort_values("score", ascending=False, kind="stable").reset_index(drop=True)
    written = {
        "leaderboard.csv": board,
        "leaderboard_by_source.csv": breakdown(runs, "source"),
        "leaderboard_by_type.csv": breakdown(runs, "task_type"),
        "paired_deltas.csv": paired_deltas(runs),
    }
    paths = {}
    for name, frame in written.items():
        frame.to_csv(out / name, index=False, float_format="%.6g")
        paths[name] = out / name
    (out / "leaderboard.md").write_text(markdown_table(board))
    paths["leaderboard.md"] = out / "leaderboard.md"
    paths["pareto.png"] = pareto_plot(board, out / "pareto.png")
    return paths
