"""When does the target come back? Per continuation frame, each method's mean similarity and detection rate.

A frame without a detection counts as similarity 0 (as a task never detected scores 0), so the
curve at frame ``t`` is the mean over a method's finished tasks of ``similarities[t]`` or 0, and the
detection rate at ``t`` is the fraction of those tasks with a detection at ``t``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cmbench.report.leaderboard import RunRecords


def frame_curves(runs: list[RunRecords]) -> pd.DataFrame:
    """One row per (method, frame): ``mean_similarity``, ``detection_rate``, ``n_tasks``.

    Tasks with fewer frames than others stop contributing after their last frame; records without
    per-frame similarities do not contribute.
    """
    rows = []
    for run in runs:
        ok = run.frame[run.frame["status"] == "ok"]
        per_task = [s for s in ok.get("similarities", []) if isinstance(s, list) and s]
        if not per_task:
            continue
        length = max(len(s) for s in per_task)
        sims = np.full((len(per_task), length), np.nan)  # [tasks, frames]; NaN past a task's last frame
        detected = np.zeros((len(per_task), length), dtype=bool)
        for i, values in enumerate(per_task):
            row = np.array([0.0 if v is None else float(v) for v in values])
            sims[i, : len(row)] = row
            detected[i, : len(row)] = [v is not None for v in values]
        present = ~np.isnan(sims)
        for t in range(length):
            n = int(present[:, t].sum())
            rows.append({"method": run.label, "frame": t, "mean_similarity": float(np.nanmean(sims[:, t])),
                         "detection_rate": float(detected[:, t].sum() / n), "n_tasks": n})
    return pd.DataFrame(rows, columns=["method", "frame", "mean_similarity", "detection_rate", "n_tasks"])


def frame_curves_plot(curves: pd.DataFrame, path: Path) -> Path:
    """Two panels over continuation frames: mean similarity and detection rate, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=110, sharex=True)
    for method, group in curves.groupby("method", sort=False):
        axes[0].plot(group["frame"], group["mean_similarity"], marker=".", label=str(method))
        axes[1].plot(group["frame"], group["detection_rate"], marker=".", label=str(method))
    axes[0].set_ylabel("mean similarity (0 where undetected)")
    axes[1].set_ylabel("detection rate")
    for ax in axes:
        ax.set_xlabel("continuation frame")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle("Recall over the continuation")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
