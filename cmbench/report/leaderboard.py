"""Leaderboards from run records: overall, per source, per task type, paired deltas, Pareto plot.

Reports are always regenerated from ``records.jsonl`` files, never edited by hand. Statistics:

- the benchmark score of a method is the mean task score over its finished tasks;
- 95% confidence intervals are cluster-robust over contexts (the two tasks of one context video are
  not independent): with task values ``x_i``, mean ``m`` and ``G`` contexts,
  ``se^2 = G / (G - 1) * sum_c (sum_{i in c} (x_i - m))^2 / n^2`` and ``ci = t_{0.975, G-1} * se``;
- paired deltas against FullKV match tasks by ``(task_id, seed)``;
- speed-up is ``FPS(method) / FPS(FullKV)`` with ``FPS = sum of continuation frames / sum of
  continuation seconds`` over the tasks both ran, all taken from the same sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
from scipy import stats

from cmbench.errors import CMBenchError
from cmbench.runs.records import read_all_records

REFERENCE_METHOD = "fullkv"


class ReportError(CMBenchError):
    """Runs cannot be compared (different task sets, seeds or scorers) or are unreadable."""


@dataclass(frozen=True)
class RunRecords:
    """The records of one run directory."""

    path: Path
    label: str
    frame: pd.DataFrame  # one row per record


def read_records(run_dir: str | Path) -> RunRecords:
    """Read every records file of a run directory; the last record of a (task_id, seed) wins."""
    run_dir = Path(run_dir)
    rows = read_all_records(run_dir)
    if not rows:
        raise ReportError(f"{run_dir}: no records (not a run directory, or nothing finished yet)")
    frame = pd.DataFrame(rows).drop_duplicates(subset=["task_id", "seed"], keep="last")
    labels = frame["label"].unique()
    if len(labels) != 1:
        raise ReportError(f"{run_dir}: records of several methods ({', '.join(map(str, labels))}) in one run")
    return RunRecords(run_dir, str(labels[0]), frame.reset_index(drop=True))


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
            "seeds": frozenset(f["seed"]),
            "scorer config": frozenset(f["scorer_hash"].astype(str)),
        }

    base = signature(first)
    for run in runs[1:]:
        other = signature(run)
        for key, value in base.items():
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
    mean, ci = clustered_mean_ci(ok["score"].to_numpy(), ok["context_id"].to_numpy())
    return {
        "score": mean,
        "score_ci95": ci,
        "pr": float(ok["pr"].mean()) if len(ok) else math.nan,
        "n_tasks": int(len(ok)),
        "failures": int((frame["status"] != "ok").sum()),
    }


def _fps(frame: pd.DataFrame) -> float:
    seconds = frame["continuation_seconds"].sum()
    return float(frame["continuation_frames"].sum() / seconds) if seconds > 0 else math.nan


def leaderboard(runs: list[RunRecords]) -> pd.DataFrame:
    """One row per run: score (mean, 95% CI), PR, speed-up vs FullKV, FPS, peak KV bytes, counts."""
    reference = next((r for r in runs if r.label == REFERENCE_METHOD), None)
    rows = []
    for run in runs:
        ok = run.frame[run.frame["status"] == "ok"]
        row = {"method": run.label, **_summarise(run.frame)}
        row["context_pr"] = float(ok["context_pr"].mean()) if len(ok) else math.nan
        row["continuation_fps"] = _fps(ok)
        row["speedup_vs_fullkv"] = math.nan
        if reference is not None:
            ref_ok = reference.frame[reference.frame["status"] == "ok"]
            both = ok.merge(ref_ok[["task_id", "seed"]], on=["task_id", "seed"])
            ref_both = ref_ok.merge(ok[["task_id", "seed"]], on=["task_id", "seed"])
            row["speedup_vs_fullkv"] = _fps(both) / _fps(ref_both) if len(both) else math.nan
        row["peak_kv_bytes"] = float(ok["peak_kv_bytes"].mean()) if len(ok) else math.nan
        rows.append(row)
    cols = ["method", "score", "score_ci95", "pr", "context_pr", "speedup_vs_fullkv", "continuation_fps",
            "peak_kv_bytes", "n_tasks", "failures"]
    return pd.DataFrame(rows, columns=cols)


def breakdown(runs: list[RunRecords], by: str) -> pd.DataFrame:
    """Per-method score, CI, PR and counts for each value of ``by`` (``source`` or ``task_type``)."""
    rows = []
    for run in runs:
        for value, group in run.frame.groupby(by, sort=True):
            rows.append({"method": run.label, by: value, **_summarise(group)})
    return pd.DataFrame(rows, columns=["method", by, "score", "score_ci95", "pr", "n_tasks", "failures"])


def paired_deltas(runs: list[RunRecords]) -> pd.DataFrame:
    """Per method: mean paired score difference to FullKV (cluster-robust CI) and win/tie/loss counts."""
    reference = next((r for r in runs if r.label == REFERENCE_METHOD), None)
    cols = ["method", "delta_vs_fullkv", "delta_ci95", "wins", "ties", "losses", "n_pairs"]
    if reference is None:
        return pd.DataFrame(columns=cols)
    ref = reference.frame[reference.frame["status"] == "ok"][["task_id", "seed", "score"]]
    rows = []
    for run in runs:
        if run is reference:
            continue
        ok = run.frame[run.frame["status"] == "ok"]
        pairs = ok.merge(ref, on=["task_id", "seed"], suffixes=("", "_ref"))
        delta = (pairs["score"] - pairs["score_ref"]).to_numpy()
        mean, ci = clustered_mean_ci(delta, pairs["context_id"].to_numpy())
        rows.append(
            {
                "method": run.label,
                "delta_vs_fullkv": mean,
                "delta_ci95": ci,
                "wins": int((delta > 0).sum()),
                "ties": int((delta == 0).sum()),
                "losses": int((delta < 0).sum()),
                "n_pairs": int(len(delta)),
            }
        )
    return pd.DataFrame(rows, columns=cols)


def markdown_table(board: pd.DataFrame) -> str:
    """The leaderboard as a GitHub markdown table (score with CI, PR and speed-up as percentages/ratios)."""
    lines = ["| Method | Score (95% CI) | PR | Speed-up | FPS | Peak KV (MB) | Tasks | Failed |",
             "|---|---|---|---|---|---|---|---|"]
    for r in board.itertuples():
        ci = "" if math.isnan(r.score_ci95) else f" ± {r.score_ci95:.4f}"
        speed = "—" if math.isnan(r.speedup_vs_fullkv) else f"{r.speedup_vs_fullkv:.2f}x"
        lines.append(
            f"| {r.method} | {r.score:.4f}{ci} | {100 * r.pr:.2f}% | {speed} | {r.continuation_fps:.1f} | "
            f"{r.peak_kv_bytes / 1e6:.2f} | {r.n_tasks} | {r.failures} |"
        )
    return "\n".join(lines) + "\n"


def pareto_plot(board: pd.DataFrame, path: Path, title: str = "CMBench: memory vs pruning") -> Path:
    """Scatter of PR (x) against score (y), one labelled point per method, CI as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    for r in board.itertuples():
        yerr = None if math.isnan(r.score_ci95) else r.score_ci95
        ax.errorbar(100 * r.pr, r.score, yerr=yerr, fmt="o", capsize=3)
        ax.annotate(r.method, (100 * r.pr, r.score), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("pruning ratio PR (%)")
    ax.set_ylabel("score (mean max-similarity)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_reports(run_dirs: Iterable[str | Path], out_dir: str | Path, allow_mixed: bool = False) -> dict[str, Path]:
    """Read runs, check they are comparable, and write every report into ``out_dir``.

    Returns
    -------
    dict name -> written path: leaderboard.csv, leaderboard_by_source.csv, leaderboard_by_type.csv,
    paired_deltas.csv, leaderboard.md, pareto.png.
    """
    runs = [read_records(d) for d in run_dirs]
    if not runs:
        raise ReportError("no run directories given")
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
