"""Score-vs-PR curves: methods at matched pruning ratios, the area under each curve, and their plot.

A curve is a method's points ``(realised test PR, score)``, one per target PR its own knob was
calibrated to (``python -m cmbench curves``); each point also carries the device KV bytes of its run over
FullKV's (``kv_bytes_ratio``), and the plot draws score against those bytes beside score against PR (a
storage format or a merging rule moves a method along the bytes axis, not the PR axis). On a curve:

- :func:`score_at` interpolates linearly in realised PR between neighbouring points (NaN outside the
  realised range; points of equal PR are averaged first);
- :func:`curve_area` integrates the piecewise-linear curve with the trapezoid rule over realised PR
  between ``lo`` and ``hi`` (the ends interpolated), and :func:`area_table` takes ``[lo, hi]`` as the
  range every method covers: the largest of the curves' lowest PRs to the smallest of their highest
  (``mean_score = auc / (hi - lo)``: the curve's average height there).

``curves.csv`` columns are :data:`CURVE_COLUMNS`, then, for each quality metric the records carry
(VBench's names), its mean and CI bounds (``<metric>``, ``<metric>_ci_low``, ``<metric>_ci_high``); the
scores and their 95% CIs come from the leaderboard's own statistics
(:func:`cmbench.report.leaderboard.leaderboard`, clustered by context). ``curves_reference.csv`` holds
FullKV's row in the same columns.

Quality beside memory (the paper's argument that quality metrics cannot pick a compression budget):
:func:`normalised_points` divides every curve point's score and quality metrics (and CI bounds) by
FullKV's; :func:`quality_vs_memory_plot` draws memory and each quality metric against PR on one shared
normalised axis (``quality_vs_memory.png``); :func:`quality_vs_memory_table` gives, over a PR window,
each metric's range of normalised values across all methods' points (``quality_vs_memory.csv``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cmbench.report.reading import read_table
from cmbench.runs import atomic
from cmbench.scoring.quality_names import QUALITY_FIELDS

CURVE_COLUMNS = ["method", "target_pr", "knob", "knob_value", "calibration_pr", "test_pr", "kv_bytes_ratio", "score",
                 "ci_low", "ci_high", "n_tasks", "label", "run_dir", "note"]
"""The columns of ``curves.csv`` (``test_pr``: the PR realised on the test suite; ``kv_bytes_ratio``: the
device KV bytes there over FullKV's, the leaderboard's "KV bytes"; ``note``: the calibration's note, or why
a target has no point)."""
AREA_COLUMNS = ["method", "pr_low", "pr_high", "auc", "mean_score", "points"]
CURVES_FILE, AREA_FILE, PLOT_FILE = "curves.csv", "auc.csv", "curves.png"
REFERENCE_FILE, QUALITY_PLOT_FILE, QUALITY_TABLE_FILE = ("curves_reference.csv", "quality_vs_memory.png",
                                                         "quality_vs_memory.csv")
QUALITY_WINDOW = (0.75, 0.95)  # the PR range over which quality_vs_memory.csv compares ranges
QUALITY_TABLE_COLUMNS = ["metric", "kind", "pr_low", "pr_high", "points", "min_vs_fullkv", "max_vs_fullkv",
                         "range_vs_fullkv"]
OPERATING_PR = 0.85  # the paper's operating point: the leaderboard's "Score @ 85% PR"


def _points(pr, score) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct PRs and their scores (the mean where several points share a PR), NaNs dropped."""
    frame = pd.DataFrame({"pr": np.asarray(pr, dtype=float), "score": np.asarray(score, dtype=float)}).dropna()
    frame = frame.groupby("pr", sort=True)["score"].mean()
    return frame.index.to_numpy(dtype=float), frame.to_numpy(dtype=float)


def score_at(pr, score, x: float) -> float:
    """The curve through ``(pr, score)`` at PR ``x`` (linear between neighbours), NaN outside its range.

    Parameters
    ----------
    pr, score : array-like ``[n]``
        The points, in any order.
    x : float
    """
    xs, ys = _points(pr, score)
    if not len(xs) or x < xs[0] or x > xs[-1]:
        return math.nan
    return float(np.interp(x, xs, ys))


def curve_area(pr, score, lo: float, hi: float) -> float:
    """Trapezoid-rule area under the piecewise-linear curve through ``(pr, score)`` on ``[lo, hi]``.

    NaN when ``[lo, hi]`` is not inside the curve's PR range or is empty (``lo >= hi``).
    """
    xs, ys = _points(pr, score)
    if not len(xs) or not xs[0] <= lo < hi <= xs[-1]:
        return math.nan
    inner = (xs > lo) & (xs < hi)
    x = np.concatenate([[lo], xs[inner], [hi]])
    y = np.concatenate([[np.interp(lo, xs, ys)], ys[inner], [np.interp(hi, xs, ys)]])
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def area_table(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per method: the common realised range ``[pr_low, pr_high]`` of all methods, the area under
    its curve there, the mean score over it, and its number of points (NaN range and area when the
    methods share no range, e.g. one point each)."""
    ok = curves.dropna(subset=["test_pr", "score"])
    methods = list(dict.fromkeys(curves["method"]))
    groups = {m: ok[ok["method"] == m] for m in methods}
    lows = [g["test_pr"].min() for g in groups.values() if len(g)]
    highs = [g["test_pr"].max() for g in groups.values() if len(g)]
    lo = max(lows) if len(lows) == len(methods) else math.nan
    hi = min(highs) if len(highs) == len(methods) else math.nan
    if not lo < hi:  # the curves share no range (or a method has none): no range, no area
        lo = hi = math.nan
    rows = []
    for m, g in groups.items():
        auc = curve_area(g["test_pr"], g["score"], lo, hi) if lo < hi else math.nan
        rows.append({"method": m, "pr_low": lo, "pr_high": hi, "auc": auc,
                     "mean_score": auc / (hi - lo) if not math.isnan(auc) else math.nan, "points": len(g)})
    return pd.DataFrame(rows, columns=AREA_COLUMNS)


def read_curves(path: str | Path) -> pd.DataFrame:
    """``curves.csv``, checked for its columns (:func:`cmbench.report.reading.read_table`).

    Raises
    ------
    ReportError
        A missing, empty or torn file (its last line cut off, or a row of another field count), or one
        without the columns a curve needs: one line naming the file (and line).
    """
    return read_table(path, ("method", "test_pr", "score"), kind="curves", command="curves")


def scores_at(curves: pd.DataFrame, x: float = OPERATING_PR) -> dict[str, float]:
    """``method -> score at PR x`` on each method's curve (NaN outside its realised range)."""
    return {str(m): score_at(g["test_pr"], g["score"], x) for m, g in curves.groupby("method", sort=False)}


SCORE_MARGIN = 0.03  # space above and below the score range in plots


def score_range(scores) -> tuple[float, float]:
    """The score range a plot shows: [0, 1] (max-similarity scores), widened to any score outside it;
    confidence intervals are clipped to it (with one context, a t-interval can span several units)."""
    values = [float(v) for v in scores if not math.isnan(float(v))]
    return min([0.0, *values]), max([1.0, *values])


BYTES_AXIS = "kv_bytes_ratio"
"""The curves table's column of the second panel's x axis (device KV bytes over FullKV's)."""


def curves_plot(curves: pd.DataFrame, path: str | Path, reference: tuple[float, float] | None = None,
                metric: str = "score") -> Path:
    """Score (y) against realised test PR (x), one line per method with its 95% CI band; the reference
    (FullKV: ``(score, ci95 half-width)``) as a horizontal line with its band. The y-axis is the
    score range (:func:`score_range`), bands clipped to it. When any point has its device KV bytes over
    FullKV's (``kv_bytes_ratio``), a second panel draws the same scores against them (in % of FullKV's),
    FullKV's reference the same; a point without its bytes is left out of that panel only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = curves.dropna(subset=["test_pr", "score"])
    with_bytes = BYTES_AXIS in points.columns and points[BYTES_AXIS].notna().any()
    fig, axes = plt.subplots(1, 2 if with_bytes else 1, figsize=(12.0 if with_bytes else 6.4, 4.4), dpi=120,
                             squeeze=False)
    scores = [*points["score"], *([] if reference is None or math.isnan(reference[0]) else [reference[0]])]
    lo, hi = score_range(scores)
    panels = [("test_pr", "realised pruning ratio on the test suite (%)", "PR (each method's own knob, calibrated)")]
    if with_bytes:
        panels.append((BYTES_AXIS, "device KV bytes on the test suite (% of FullKV's)", "KV bytes (the same runs)"))
    for ax, (column, xlabel, what) in zip(axes[0], panels):
        _score_panel(ax, points.dropna(subset=[column]), column, (lo, hi), reference)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{metric} (mean max-similarity)")
        ax.set_title(f"CMBench: {metric} vs {what}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return Path(path)


def _score_panel(ax, points: pd.DataFrame, column: str, span: tuple[float, float],
                 reference: tuple[float, float] | None) -> None:
    """One panel of :func:`curves_plot`: FullKV's line and band, then each method's scores and CI band
    against ``100 * points[column]``, the y axis ``span`` with its margins."""
    lo, hi = span
    if reference is not None and not math.isnan(reference[0]):
        score, ci = reference
        ax.axhline(score, color="black", lw=1, label="fullkv")
        if not math.isnan(ci):
            ax.axhspan(max(lo, score - ci), min(hi, score + ci), color="black", alpha=0.08)
    for method, g in points.groupby("method", sort=False):
        g = g.sort_values(column)
        line, = ax.plot(100 * g[column], g["score"], "o-", ms=3, label=str(method))
        ax.fill_between(100 * g[column], g["ci_low"].clip(lo, hi), g["ci_high"].clip(lo, hi),
                        color=line.get_color(), alpha=0.15)
    ax.set_ylim(lo - SCORE_MARGIN, hi + SCORE_MARGIN)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def write_curves(curves: pd.DataFrame, out: str | Path, reference: tuple[float, float], metric: str) -> pd.DataFrame:
    """Write ``curves.csv``, ``auc.csv`` (:func:`area_table`) and ``curves.png`` (:func:`curves_plot`) into
    ``out``, each a new file renamed into place (a full disk leaves the previous files whole); the areas.

    Raises
    ------
    cmbench.runs.atomic.OutputError
        A file cannot be written (one line naming it).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    areas = area_table(curves)
    atomic.write_with(out / CURVES_FILE, lambda tmp: curves.to_csv(tmp, index=False, float_format="%.6g"))
    atomic.write_with(out / AREA_FILE, lambda tmp: areas.to_csv(tmp, index=False, float_format="%.6g"))
    atomic.write_with(out / PLOT_FILE, lambda tmp: curves_plot(curves, tmp, reference, metric=metric))
    return areas


def board_point(row: Mapping[str, Any]) -> dict[str, Any]:
    """A curve point from a leaderboard row (:func:`cmbench.report.leaderboard.leaderboard`): realised
    PR, device KV bytes over FullKV's (NaN in a row from before they were recorded), score and CI bounds,
    task count, and each quality metric's mean and CI bounds."""
    point = {"test_pr": row["pr"], BYTES_AXIS: row.get("kv_bytes_ratio", math.nan), "score": row["score"], "ci_low": row["score"] - row["score_ci95"],
             "ci_high": row["score"] + row["score_ci95"], "n_tasks": row["n_tasks"]}
    for name in QUALITY_FIELDS:
        if name in row:
            point.update({name: row[name], f"{name}_ci_low": row[name] - row[f"{name}_ci95"],
                          f"{name}_ci_high": row[name] + row[f"{name}_ci95"]})
    return point


def quality_columns(frame: pd.DataFrame) -> list[str]:
    """The quality metrics a curves table has values for, in :data:`QUALITY_FIELDS` order."""
    return [name for name in QUALITY_FIELDS if name in frame.columns and frame[name].notna().any()]


def curve_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``curves.csv``: :data:`CURVE_COLUMNS`, then the quality columns any row has."""
    frame = pd.DataFrame(rows)
    extra = [f"{n}{suffix}" for n in quality_columns(frame) for suffix in ("", "_ci_low", "_ci_high")]
    return frame.reindex(columns=CURVE_COLUMNS + extra)


def normalised_points(curves: pd.DataFrame, reference: Mapping[str, Any], memory: str = "score") -> pd.DataFrame:
    """Every curve point's metrics divided by FullKV's (1 = FullKV's value).

    Parameters
    ----------
    curves : a ``curves.csv`` table
    reference : FullKV's row (``curves_reference.csv``): ``score`` and the quality columns
    memory : the name the memory metric gets in the output (``DINO``, ``light``)

    Returns
    -------
    DataFrame with columns method, test_pr, metric, kind (``memory`` | ``quality``), value, ci_low,
    ci_high (NaN where FullKV's value is missing or 0).
    """
    rows = []
    ok = curves.dropna(subset=["test_pr"])
    for column, name, kind in [("score", memory, "memory")] + [(q, q, "quality") for q in quality_columns(curves)]:
        ref = float(reference.get(column, math.nan))
        low, high = ("ci_low", "ci_high") if column == "score" else (f"{column}_ci_low", f"{column}_ci_high")
        for r in ok.itertuples(index=False):
            values = [getattr(r, c) for c in (column, low, high)]
            scaled = [v / ref if ref and not math.isnan(ref) else math.nan for v in values]
            rows.append({"method": r.method, "test_pr": r.test_pr, "metric": name, "kind": kind,
                         "value": scaled[0], "ci_low": scaled[1], "ci_high": scaled[2]})
    return pd.DataFrame(rows, columns=["method", "test_pr", "metric", "kind", "value", "ci_low", "ci_high"])


def quality_vs_memory_table(points: pd.DataFrame, window: tuple[float, float] = QUALITY_WINDOW) -> pd.DataFrame:
    """Per metric, over the points whose realised PR lies in ``window``: their count and the lowest,
    highest and range of the normalised values across every method (:func:`normalised_points`)."""
    lo, hi = window
    rows = []
    for (metric, kind), g in points.groupby(["metric", "kind"], sort=False):
        inside = g[(g["test_pr"] >= lo) & (g["test_pr"] <= hi)].dropna(subset=["value"])
        low, high = (float(inside["value"].min()), float(inside["value"].max())) if len(inside) else (math.nan,) * 2
        rows.append({"metric": metric, "kind": kind, "pr_low": lo, "pr_high": hi, "points": len(inside),
                     "min_vs_fullkv": low, "max_vs_fullkv": high, "range_vs_fullkv": high - low})
    return pd.DataFrame(rows, columns=QUALITY_TABLE_COLUMNS)


def quality_vs_memory_plot(points: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """The memory metric and each quality metric against realised PR, one panel each on a shared axis
    normalised to FullKV (a black line at 1 and FullKV's own point at PR 0), one line per method with
    its 95% CI (bars and band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(dict.fromkeys(points["metric"]))
    fig, axes = plt.subplots(1, len(metrics), figsize=(2.6 * len(metrics) + 0.6, 3.4), dpi=120, sharey=True,
                             squeeze=False)
    methods = list(dict.fromkeys(points["method"]))
    colours = {m: f"C{i}" for i, m in enumerate(methods)}
    for ax, metric in zip(axes[0], metrics):
        g = points[points["metric"] == metric]
        ax.axhline(1.0, color="black", lw=1)
        ax.plot([0.0], [1.0], "ks", ms=4, label="fullkv")  # the reference, at PR 0
        for method, m in g.dropna(subset=["value"]).groupby("method", sort=False):
            m = m.sort_values("test_pr")
            x = 100 * m["test_pr"]
            ax.errorbar(x, m["value"], yerr=[m["value"] - m["ci_low"], m["ci_high"] - m["value"]], fmt="o-", ms=3,
                        capsize=2, color=colours[method], label=str(method))
            ax.fill_between(x, m["ci_low"], m["ci_high"], color=colours[method], alpha=0.15)
        kind = g["kind"].iloc[0] if len(g) else ""
        ax.set_title(f"{metric}" + (" (memory)" if kind == "memory" else ""), fontsize=8)
        ax.set_xlabel("realised PR (%)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("relative to FullKV (= 1)", fontsize=8)
    axes[0][-1].legend(fontsize=6, loc="lower left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return Path(path)
