"""Leaderboards from run records: overall, per source, per task type, per seed, paired comparisons, plot.

Reports are always regenerated from ``records*.jsonl`` files (of ``run`` directories and of ``score``
output folders alike), never edited by hand; which folders make which entries (the seeds of one setup
are one entry) is :mod:`cmbench.report.reading`. Every table names its metric (``DINO`` for the
paper's scorer, the scorer's own name otherwise). Statistics (:mod:`cmbench.report.statistics`):

- the score of an entry is the mean over its finished (task, seed) pairs; its 95% confidence interval
  is cluster-robust over contexts (the tasks and seeds of one context video are not independent);
  with several seeds, ``score_seed_std`` is the sample standard deviation of the per-seed means (the
  spread across seeds) and ``leaderboard_by_seed.csv`` lists each seed's mean;
- paired comparisons (against FullKV in ``paired_deltas.csv``; in ``comparisons.csv`` each entry
  against FullKV by default, and the pairs asked for: :func:`comparison_pairs`) match
  ``(task_id, seed)`` (``task_id`` alone when a side's seeds are unknown), give the mean difference
  with its clustered CI, wins / ties / losses and the p-value of the cluster-robust paired t-test;
- the headline speed-up (``cost_speedup_vs_fullkv``) is FullKV's attention FLOPs over the entry's on
  the tasks both ran: deterministic, from each task's model calls. Measured speed stays beside it:
  ``speedup_vs_fullkv = FPS(entry) / FPS(FullKV)`` with ``FPS = sum of continuation frames / sum of
  continuation seconds`` over the tasks both ran, and ``fps_measured_together`` says whether the two
  were measured at overlapping times on one machine (if not, machine load may differ and the ratio
  is not a controlled measurement: ``scripts/bench_speed.py`` is).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from cmbench.report.reading import (
    NUMERIC,
    UNNAMED_METRIC,
    ReportError,
    RunRecords,
    check_comparable,
    folder_manifest,
    load_runs,
    read_records,
    read_table,
    task_set_note,
)
from cmbench.report import gate
from cmbench.report.comparisons import (
    REFERENCE_METHOD,
    adjusted,
    both_finished,
    comparison_pairs,
    comparisons,
    paired_deltas,
    successful,
)
from cmbench.report.curves import CURVES_FILE, OPERATING_PR, SCORE_MARGIN, read_curves, score_range, scores_at
from cmbench.report.fidelity import FIDELITY_COLUMNS, fidelity
from cmbench.report.precision import bytes_axis, frame_precisions
from cmbench.report.leaderboard_json import FILE as BOARD_JSON, board_json, board_text, refilled
from cmbench.report.statistics import clustered_mean_ci, seed_spread
from cmbench.report.board_folder import REPORT_FILES, board_folder
from cmbench.runs.atomic import dead_builds
from cmbench.report.suspect import SUSPECT_COLUMN, SUSPECT_MARK, ranked, suspect_count, suspect_note
from cmbench.report.text import markdown_text
from cmbench.scoring.frame_count import flagged
from cmbench.scoring.quality_names import QUALITY_FIELDS, QUALITY_LABELS, TEMPORAL_QUALITY, is_undefined

__all__ = ["NUMERIC", "REFERENCE_METHOD", "REPORT_FILES", "UNNAMED_METRIC", "ReportError", "RunRecords", "breakdown",
           "check_comparable", "clustered_mean_ci", "comparison_pairs", "comparisons", "find_curves", "folder_manifest",
           "leaderboard", "load_runs", "markdown_table", "paired_deltas", "pareto_plot", "read_records",
           "seed_breakdown", "write_reports"]

MATCHED_COLUMN = "score_at_85pr"
MATCHED_NOTE = ("Score @ 85% PR: the method's score-vs-PR curve (curves.csv from `python -m cmbench curves`: its own "
                "knob calibrated to each target PR on calibration contexts, then run on the test suite: on as many of "
                "its tasks as curves.csv's `n_tasks` says) interpolated linearly at realised PR 85%; — where 85% "
                "lies outside its realised range or it has no curve.")
BUILD_PREFIX = ".{name}.tmp-"  # the sibling folder a leaderboard is built in (+ process id)


def _summarise(frame: pd.DataFrame) -> dict[str, Any]:
    ok = successful(frame)
    mean, ci = clustered_mean_ci(ok["score"].to_numpy(dtype=np.float64), ok["context_id"].to_numpy())
    return {
        "score": mean,
        "score_ci95": ci,
        "pr": _mean(ok["pr"]),
        "n_tasks": int(len(ok)),
        "failures": int((frame["status"] != "ok").sum()),
    }


FLAG_COLUMN = "frame_count_flags"
FLAG_MARK = "‡"


def frame_count_flags(frame: pd.DataFrame) -> int:
    """How many of an entry's records are flagged by the frame-count rule (:func:`flagged`: frames came
    other than the frames scored); records without ``frames_received`` (older ones) are not."""
    def known(column: str) -> list[int | None]:
        values = pd.to_numeric(frame[column], errors="coerce") if column in frame else pd.Series([], dtype=float)
        return [None if math.isnan(v) else int(v) for v in values]

    return sum(flagged(r, n) for r, n in zip(known("frames_received"), known("n_frames")))


def frame_count_note(board: pd.DataFrame) -> str:
    """The note on the board's frame-count mark; empty when no record is flagged (or the board was written
    before the column)."""
    flags = int(board[FLAG_COLUMN].fillna(0).sum()) if FLAG_COLUMN in board else 0
    if not flags:
        return ""
    return (f"{FLAG_MARK} {flags} continuation(s) had another frame count than the task defines: only the "
            "frames it defines were scored (extra frames left unscored; a shorter one failed, scored as "
            f"missing); see `{FLAG_COLUMN}` in leaderboard.csv and each record's `frames_received`.")


def _fps(frame: pd.DataFrame) -> float:
    seconds = frame["continuation_seconds"].sum()
    return float(frame["continuation_frames"].sum() / seconds) if seconds > 0 else math.nan


def _mean(column: pd.Series) -> float:
    return float(column.mean()) if column.notna().any() else math.nan


def _interval_ns(frame: pd.DataFrame) -> tuple[float, float]:
    """When a run's continuations were measured: from the first one's start (its record's time minus
    its continuation seconds) to the last record."""
    ends = frame["recorded_ns"].astype("float64")
    starts = ends - frame["continuation_seconds"].fillna(0).astype("float64") * 1e9
    return float(starts.min()), float(ends.max())


def measured_together(a: RunRecords, b: RunRecords) -> bool:
    """Whether two entries' speeds were measured on one machine at overlapping times (False when
    either does not say where or when: records from before the ``machine`` field)."""
    if a is b:
        return True
    fa, fb = successful(a.frame), successful(b.frame)
    both = pd.concat([fa, fb])
    if both.empty or both["machine"].isna().any() or both["recorded_ns"].isna().any() \
            or both["machine"].nunique() != 1:
        return False
    (a0, a1), (b0, b1) = _interval_ns(fa), _interval_ns(fb)
    return a0 <= b1 and b0 <= a1


def _ratio(reference: pd.Series, entry: pd.Series) -> float:
    """``sum(reference) / sum(entry)``, NaN when a value is missing or the entry's sum is 0."""
    if not len(entry) or reference.isna().any() or entry.isna().any() or entry.sum() <= 0:
        return math.nan
    return float(reference.sum() / entry.sum())


def quality_metrics(runs: Iterable[RunRecords]) -> list[str]:
    """The quality fields (VBench's names, :data:`QUALITY_FIELDS` order) that any entry's successful
    records carry, or record as undefined on their video (a board of still continuations shows them
    undefined, not nothing)."""
    frames = [successful(r.frame) for r in runs]
    undefined = {name for f in frames for absent in f["quality_absent"] if isinstance(absent, dict)
                 for name, reason in absent.items() if is_undefined(reason)}
    return [name for name in QUALITY_FIELDS if name in undefined or any(f[name].notna().any() for f in frames)]


def quality_summary(frame: pd.DataFrame, names: Iterable[str]) -> dict[str, float]:
    """Each quality metric's mean over the successful records that carry it and its 95% CI
    (``<name>_ci95``, clustered by context like the score)."""
    ok = successful(frame)
    out: dict[str, float] = {}
    for name in names:
        have = ok[ok[name].notna()]
        out[name], out[f"{name}_ci95"] = clustered_mean_ci(have[name].to_numpy(dtype=np.float64),
                                                           have["context_id"].to_numpy())
    return out


UNDEFINED_COLUMN = "quality_undefined"
"""Successful records of an entry whose frame-comparing quality metrics are undefined (a still, black or
one-frame continuation): left out of the quality means. On a board only when some entry has one."""


def shows_undefined(still: int, column: str, value: float) -> bool:
    """Whether a board cell reads "undefined": a frame-comparing quality metric with no mean, of an entry
    with ``still`` tasks whose continuations left it undefined (markdown and HTML boards alike)."""
    return bool(still) and column in TEMPORAL_QUALITY and bool(pd.isna(value))


def undefined_quality(frame: pd.DataFrame) -> int:
    """How many successful records of ``frame`` record a quality metric as undefined on their video."""
    absent = successful(frame)["quality_absent"]
    return int(sum(isinstance(a, dict) and any(map(is_undefined, a.values())) for a in absent))


def leaderboard(runs: list[RunRecords], curves: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per entry: metric, score (mean, 95% CI, spread over seeds), PR, the quality metrics the
    records carry (VBench's names, each with its clustered 95% CI, after PR), speed-ups vs FullKV
    (attention cost; measured FPS and whether it was measured together), FPS, attention keys per
    token, peak KV bytes, counts, records from other code, and ``frame_count_flags``: the records
    whose continuation had another frame count than the task defines (:mod:`cmbench.scoring.frame_count`);
    with ``curves`` (a ``curves.csv``,
    :mod:`cmbench.report.curves`), also ``score_at_85pr``: the curve of the method the entry's label
    names, interpolated linearly at realised PR 0.85 (NaN outside its realised range or without one).

    An entry with no successful task gets a row with NaN means and its failure count.
    """
    reference = next((r for r in runs if r.label == REFERENCE_METHOD), None)
    rows = []
    for run in runs:
        ok = successful(run.frame)
        row = {"method": run.label, "metric": run.metric, **_summarise(run.frame)}
        row["context_pr"] = _mean(ok["context_pr"])
        row["continuation_fps"] = _fps(ok)
        row["speedup_vs_fullkv"] = row["cost_speedup_vs_fullkv"] = math.nan
        row["fps_measured_together"] = None
        if reference is not None:
            mine, ref = both_finished(run, reference)
            row["speedup_vs_fullkv"] = _fps(mine) / _fps(ref) if len(mine) else math.nan
            row["cost_speedup_vs_fullkv"] = _ratio(ref["attention_flops"], mine["attention_flops"])
            row["fps_measured_together"] = measured_together(run, reference)
        row["peak_kv_bytes"] = _mean(ok["peak_kv_bytes"])
        row["kv_bytes_ratio"] = _mean(ok["kv_bytes_ratio"])
        row.update(fidelity(run, reference) if reference is not None else dict.fromkeys(FIDELITY_COLUMNS, math.nan))
        for name in STORE_COLUMNS:  # retrieval methods: host store and transfers (NaN for the others)
            row[name] = _mean(ok[name]) if name in ok else math.nan
        row["attention_keys_per_token"] = _mean(ok["attention_keys_per_token"])
        row["seeds"] = max(1, len(run.seeds))
        row["score_seed_std"] = seed_spread(ok["score"], ok["run_seed"].fillna(-1)) if len(ok) else math.nan
        row["other_code_tasks"] = len(run.other_code_tasks)
        row["task_count"], row["unshared_tasks"] = run.frame["task_id"].nunique(), len(run.unshared)
        row[FLAG_COLUMN] = frame_count_flags(run.frame)
        row[SUSPECT_COLUMN] = suspect_count(run.frame)
        row["family"] = recorded_family(run.frame)
        row["cache_dtype"] = "+".join(frame_precisions(run.frame))
        rows.append(row)
    cols = ["method", "metric", "score", "score_ci95", "pr", "kv_bytes_ratio", "context_pr", "speedup_vs_fullkv",
            "continuation_fps",
            "peak_kv_bytes", "n_tasks", "failures", "cost_speedup_vs_fullkv", "attention_keys_per_token",
            "fps_measured_together", "seeds", "score_seed_std", "other_code_tasks", "task_count", "unshared_tasks",
            *FIDELITY_COLUMNS, FLAG_COLUMN, SUSPECT_COLUMN, *STORE_COLUMNS,
            "family", "cache_dtype"]
    board = pd.DataFrame(rows, columns=cols)
    quality = quality_metrics(runs)
    if quality:
        values = pd.DataFrame([quality_summary(run.frame, quality) for run in runs])
        undefined = [undefined_quality(run.frame) for run in runs]
        if any(undefined):  # the column only where some continuation was still: other boards keep their columns
            values[UNDEFINED_COLUMN] = undefined
        after_pr = cols.index("pr") + 1
        for offset, column in enumerate(values.columns):
            board.insert(after_pr + offset, column, values[column].to_numpy())
    if curves is not None:
        at = scores_at(curves, OPERATING_PR)
        board.insert(4, MATCHED_COLUMN, [at.get(label, math.nan) for label in board["method"]])
    return board


def recorded_family(frame: pd.DataFrame) -> str | None:
    """The family of KV compression an entry's records carry (:mod:`cmbench.method_family`: what the method
    declared when it ran, whatever the entry's label), the latest record's; None when no record carries one
    (records written before the field: :func:`cmbench.report.families.family` reads the label then)."""
    named = frame["family"].dropna()
    return str(named.iloc[-1]) if len(named) else None


def breakdown(runs: list[RunRecords], by: str) -> pd.DataFrame:
    """Per-entry score, CI, PR and counts for each value of ``by`` (``source``, ``task_type``,
    ``run_seed``)."""
    rows = []
    for run in runs:
        for value, group in run.frame.groupby(by, sort=True):
            rows.append({"method": run.label, "metric": run.metric, by: value, **_summarise(group)})
    return pd.DataFrame(rows, columns=["method", "metric", by, "score", "score_ci95", "pr", "n_tasks", "failures"])


def seed_breakdown(runs: list[RunRecords]) -> pd.DataFrame:
    """Per entry and global seed: score, CI, PR and counts (the per-seed means behind ``score_seed_std``)."""
    return breakdown(runs, "run_seed").rename(columns={"run_seed": "seed"})


# ------------------------------------------------------------------------------------------ markdown
def _cell(value: float | None, fmt: str) -> str:
    """A number for a table cell, ``—`` when it is NaN (nothing measured)."""
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def board_metric(board: pd.DataFrame) -> str:
    """The metric a leaderboard reports (``DINO``, a scorer's name); several are joined by ``/``."""
    return " / ".join(sorted(set(board["metric"].astype(str)))) or UNNAMED_METRIC


STORE_COLUMNS = ("peak_store_bytes", "moved_bytes_per_chunk")
FIDELITY_LABELS = {"psnr_vs_fullkv": "PSNR vs FullKV (dB)", "ssim_vs_fullkv": "SSIM vs FullKV",
                   "last_frame_psnr_vs_fullkv": "Last-frame PSNR vs FullKV (dB)",
                   "last_frame_ssim_vs_fullkv": "Last-frame SSIM vs FullKV"}
"""The headers of the fidelity columns the pages show (:mod:`cmbench.report.fidelity`), in their order."""


def shown_fidelity(board: pd.DataFrame) -> list[str]:
    """The fidelity columns of :data:`FIDELITY_LABELS` that some entry of ``board`` has a value in (none
    when no FullKV entry was among the board's inputs, or in a board written before them)."""
    return [c for c in FIDELITY_LABELS if c in board.columns and board[c].notna().any()]


def fidelity_lines(board: pd.DataFrame) -> list[str]:
    """The fidelity-to-FullKV table of the entries with a value (``∞`` dB: identical frames), else nothing."""
    shown = shown_fidelity(board)
    if not shown:
        return []
    lines = ["", "Fidelity to FullKV (each continuation against FullKV's of the same task and seed, mean over the "
             "pairs; last frame: the drift at the continuation's end)", "",
             "| Method | " + " | ".join(FIDELITY_LABELS[c] for c in shown) + " |", "|---|" + "---|" * len(shown)]
    for _, r in board[board[shown].notna().any(axis=1)].iterrows():
        cells = ["∞" if r[c] == math.inf else _cell(r[c], "{:.2f}" if "psnr" in c else "{:.4f}") for c in shown]
        lines.append(f"| {markdown_text(r['method'])} | " + " | ".join(cells) + " |")
    return lines


def store_lines(board: pd.DataFrame) -> list[str]:
    """The host-store table of the entries that have one (retrieval methods), else nothing."""
    have = board[board["peak_store_bytes"].notna()] if "peak_store_bytes" in board.columns else board.iloc[:0]
    if not len(have):
        return []
    lines = ["", "Host store (methods that move history off the device and bring it back; Peak KV above is the "
             "device's, restored tokens included)", "", "| Method | Peak KV (MB) | Peak store (MB) | Moved per chunk (MB) |",
             "|---|---|---|---|"]
    for r in have.itertuples():
        lines.append(f"| {markdown_text(r.method)} | {_cell(r.peak_kv_bytes / 1e6, '{:.2f}')} | "
                     f"{_cell(r.peak_store_bytes / 1e6, '{:.2f}')} | {_cell(r.moved_bytes_per_chunk / 1e6, '{:.3f}')} |")
    return lines


def board_bytes_axis(board: pd.DataFrame) -> str:
    """What the board's bytes ratios are relative to (:func:`cmbench.report.precision.bytes_axis`), from its
    ``cache_dtype`` column (one precision: :func:`load_runs` refuses mixed ones); float32 for a board without it."""
    named = board["cache_dtype"].dropna().unique() if "cache_dtype" in board.columns else []
    return bytes_axis(str(named[0]) if len(named) == 1 else "float32")


def task_set_markdown(board: pd.DataFrame) -> str | None:
    """The board's note on its rows' task sets (:func:`cmbench.report.reading.task_set_note`), as markdown; None
    when every row covers the same tasks or the board predates the ``task_count`` column."""
    if "task_count" not in board.columns or board["task_count"].isna().any():
        return None
    unshared = board["unshared_tasks"] if "unshared_tasks" in board.columns else pd.Series(0, board.index)
    note = task_set_note([(markdown_text(str(m)), int(t), int(u)) for m, t, u in
                          zip(board["method"], board["task_count"], unshared.fillna(0))])
    return f"**Task sets:** {note}." if note else None


def markdown_table(board: pd.DataFrame, compared: pd.DataFrame | None = None) -> str:
    """The leaderboard as a GitHub markdown table (score with CI, PR, speed-ups, FPS, memory, seeds,
    counts; ``—`` where nothing was measured), notes on what the speed columns are and on records from
    other code, and the paired comparisons when there are any."""
    matched = MATCHED_COLUMN in board.columns
    lines = [f"| Method | {markdown_text(board_metric(board))} (95% CI) | " + ("Score @ 85% PR | " if matched else "")
             + "PR | KV bytes | Speed-up | FPS speed-up | FPS | Peak KV (MB) | Seeds | Tasks | Failed |",
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if matched else "")]
    apart = other = False
    for r in board.itertuples():
        ci = "" if math.isnan(r.score_ci95) else f" ± {r.score_ci95:.4f}"
        fps_speedup = _cell(r.speedup_vs_fullkv, "{:.2f}x")
        if fps_speedup != "—" and r.fps_measured_together is False:
            fps_speedup, apart = fps_speedup + "*", True
        name = markdown_text(r.method) + (" †" if r.other_code_tasks else "")
        other = other or bool(r.other_code_tasks)
        name += f" {FLAG_MARK}" if getattr(r, FLAG_COLUMN, 0) else ""  # no column: a board written before it
        name += f" {SUSPECT_MARK}" if (getattr(r, SUSPECT_COLUMN, 0) or 0) > 0 else ""
        seeds = f"{r.seeds}" + ("" if math.isnan(r.score_seed_std) else f" (sd {r.score_seed_std:.4f})")
        at = f"{_cell(getattr(r, MATCHED_COLUMN), '{:.4f}')} | " if matched else ""
        lines.append(
            f"| {name} | {_cell(r.score, '{:.4f}')}{ci} | {at}{_cell(100 * r.pr, '{:.2f}%')} | "
            f"{_cell(100 * getattr(r, 'kv_bytes_ratio', math.nan), '{:.2f}%')} | "  # NaN: a csv from before it
            f"{_cell(r.cost_speedup_vs_fullkv, '{:.2f}x')} | {fps_speedup} | {_cell(r.continuation_fps, '{:.1f}')} | "
            f"{_cell(r.peak_kv_bytes / 1e6, '{:.2f}')} | {seeds} | {r.n_tasks} | {r.failures} |"
        )
    tasks = task_set_markdown(board)
    if tasks:
        lines += ["", tasks]
    lines += ["", "Speed-up: FullKV's attention FLOPs over the method's on the tasks both ran (counted at every "
              "model call: deterministic, but attention only, so the whole model gains less); FPS speed-up: "
              "measured continuation FPS over FullKV's" + (" (`*`: not measured together, at other times or on "
                                                           "another machine)" if apart else "")
              + "; `scripts/bench_speed.py` measures speed in one controlled run. Seeds: runs per method, with the "
              "standard deviation of their mean scores; the CI is over all (task, seed) pairs, clustered by context. "
              "KV bytes: the device bytes of the KV cache over FullKV's on the same tasks (summed over the "
              "continuation's chunks, scales and metadata included; FullKV's computed from the geometry): "
              + board_bytes_axis(board) + "."]
    lines += store_lines(board)
    lines += fidelity_lines(board)
    quality = [c for c in QUALITY_FIELDS if c in board.columns]
    if quality:
        lines += ["", "Quality (VBench's metrics on the same continuations; `*_light`: VBench's formula on CPU "
                  "features, not VBench's numbers; mean ± 95% CI clustered by context)", "",
                  "| Method | " + " | ".join(QUALITY_LABELS.get(c, c) for c in quality) + " |",
                  "|---|" + "---|" * len(quality)]
        undefined = board[UNDEFINED_COLUMN] if UNDEFINED_COLUMN in board.columns else pd.Series(0, board.index)
        for i, r in board.iterrows():
            cells = ["undefined" if shows_undefined(undefined[i], c, r[c])
                     else _cell(r[c], "{:.4f}") + ("" if math.isnan(r[f"{c}_ci95"]) else f" ± {r[f'{c}_ci95']:.4f}")
                     for c in quality]
            name = markdown_text(r["method"]) + (" †" if r["other_code_tasks"] else "")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        still = [f"{markdown_text(m)} {int(n)} of {int(t)}" for m, n, t in zip(board["method"], undefined, board["n_tasks"])
                 if n]
        if still:
            lines += ["", "Undefined: a still, black or one-frame continuation (all frames identical, or fewer than 2) "
                      "has no temporal flickering or consistency to measure (VBench's formulas would score it a "
                      "perfect 1); those tasks are left out of the temporal and consistency means: "
                      + ", ".join(still) + " tasks."]
    if matched:
        lines += ["", MATCHED_NOTE]
    if frame_count_note(board):
        lines.append(frame_count_note(board))
    if suspect_note(board):
        lines.append(suspect_note(board))
    if other:
        lines.append("† some task records were computed by other code (kept with `keep_other_code=true`): see "
                     "`other_code_tasks` in leaderboard.csv.")
    if compared is not None and len(compared):
        compared = compared if "p_adjusted" in compared.columns else adjusted(compared)  # a table from before it
        lines += ["", f"Paired comparisons ({markdown_text(board_metric(board))}: method minus versus over the (task, seed) pairs "
                      "both finished; 95% CI clustered by context; p: cluster-robust paired t-test; adjusted p: p times "
                      f"the {int(compared['p_value'].notna().sum())} tests of this table, Bonferroni; verdict: the method "
                      "against versus as an equivalence claim on the table's simultaneous intervals, docs/verdicts.md)",
                  "", "| Method | vs | Δ (95% CI) | p | adjusted p | verdict | W / T / L | Pairs |",
                  "|---|---|---|---|---|---|---|---|"]
        words = compared["verdict"] if "verdict" in compared.columns else pd.Series("—", index=compared.index)
        for c, said in zip(compared.itertuples(), words):
            ci = "" if math.isnan(c.delta_ci95) else f" ± {c.delta_ci95:.4f}"
            lines.append(f"| {markdown_text(c.method)} | {markdown_text(c.versus)} | {_cell(c.delta, '{:+.4f}')}{ci} | {_cell(c.p_value, '{:.3g}')} "
                         f"| {_cell(c.p_adjusted, '{:.3g}')} | {markdown_text(str(said))} | {c.wins} / {c.ties} / {c.losses} | {c.n_pairs} |")
    return "\n".join(lines) + "\n"


def separate_labels(fig: Any, labels: list[Any], gap: float = 2.0) -> None:
    """Move point labels (``ax.annotate`` in offset points) apart so that no two overlap: highest point first,
    each label keeps its place beside its point unless it would cover a label already placed, then goes
    below it (a thin line ties it to its point). Greedy, deterministic; ``gap`` points between labels."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72  # display pixels per point
    placed: list[Any] = []
    for label in sorted(labels, key=lambda a: (-a.xy[1], a.xy[0])):
        for _ in range(len(labels) + 1):
            box = Text.get_window_extent(label, renderer)  # the text alone, not the line to its point
            hit = [p for p in placed if box.x0 < p.x1 and p.x0 < box.x1 and box.y0 < p.y1 + gap * scale
                   and p.y0 < box.y1 + gap * scale]
            if not hit:
                break
            x, y = label.xyann  # move its bottom just under the lowest label it covers
            label.xyann = (x, y - (box.y1 - min(p.y0 for p in hit)) / scale - gap)
        placed.append(Text.get_window_extent(label, renderer))


def pareto_plot(board: pd.DataFrame, path: Path, title: str | None = None) -> Path:
    """Scatter of PR (x) against score (y), one labelled point per method, CI as error bars (clipped to
    the score range, :func:`cmbench.report.curves.score_range`, which the y-axis shows); the title says so (``CMBench: light score vs pruning ratio``) unless given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    lo, hi = score_range(board["score"])
    labels = []
    for r in board.itertuples():
        if math.isnan(r.pr) or math.isnan(r.score):
            continue  # nothing to place (no PR: scored videos of another generator; no score: all failed)
        ci = 0.0 if math.isnan(r.score_ci95) else r.score_ci95
        yerr = [[r.score - max(lo, r.score - ci)], [min(hi, r.score + ci) - r.score]]  # clipped to the range
        ax.errorbar(100 * r.pr, r.score, yerr=yerr, fmt="o", capsize=3)
        labels.append(ax.annotate(r.method, (100 * r.pr, r.score), textcoords="offset points", xytext=(5, 4),
                                  fontsize=8, arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.6}))
    ax.set_ylim(lo - SCORE_MARGIN, hi + SCORE_MARGIN)
    ax.set_xlabel("pruning ratio PR (%)")
    ax.set_ylabel(f"{board_metric(board)} (mean max-similarity)")
    ax.set_title(title or f"CMBench: {board_metric(board)} score vs pruning ratio")
    ax.grid(alpha=0.3)
    left, right = ax.get_xlim()
    for label in labels:  # a point in the right part of the plot has its label on its left, inside the figure
        if label.xy[0] > left + 0.6 * (right - left):
            label.set_horizontalalignment("right")
            label.xyann = (-5, 4)
    fig.tight_layout()
    separate_labels(fig, labels)
    fig.savefig(path)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ writing
def _swap_files(build: Path, out: Path, owned: set[str]) -> list[str]:
    """Move every file of ``build`` into ``out`` in place of an earlier leaderboard's report files, all or none.

    The earlier board's files (those of ``owned``, what CMBench wrote in ``out``) move into
    ``build/previous/`` first (those this board does not write are thus removed); if any move fails, the
    files moved in are taken out again and the earlier ones put back.

    Returns
    -------
    list of str
        The names moved in, sorted.
    """
    written = sorted(p.name for p in build.iterdir())
    previous = build / "previous"
    previous.mkdir()
    held = [name for name in REPORT_FILES if name in owned and (out / name).is_file()]
    moved: list[str] = []
    try:
        for name in held:
            os.replace(out / name, previous / name)
        for name in written:
            os.replace(build / name, out / name)
            moved.append(name)
    except BaseException:
        for name in moved:
            (out / name).unlink()
        for name in held:
            if (previous / name).is_file():
                os.replace(previous / name, out / name)
        raise
    return written


def find_curves(out_dir: str | Path, curves: str | Path | None = None) -> pd.DataFrame | None:
    """The curves table for a leaderboard: ``curves`` when given (it must exist), else ``curves.csv``
    in the leaderboard folder ``out_dir`` when there is one, else None."""
    if curves is not None:
        return read_curves(curves)
    beside = Path(out_dir) / CURVES_FILE
    return read_curves(beside) if beside.is_file() else None


def write_reports(run_dirs: Iterable[str | Path], out_dir: str | Path, allow_mixed: bool = False,
                  focus: Sequence[str] | None = None, compare: Sequence[Any] | None = None,
                  curves: str | Path | None = None, reference_aggregation: str | None = None,
                  allow_suspect: bool = False,
                  task_ids: Iterable[str] | None = None, shared_tasks: bool = False,
                  families: bool = False) -> dict[str, Path]:
    """Read runs into entries (:func:`load_runs`), and write every report into ``out_dir``.

    All files are written into a sibling folder first (``.<out>.tmp-<pid>``) and moved into ``out_dir``
    only when all of them exist, in place of an earlier leaderboard's report files (those this one does not
    write are removed); a move that fails puts the earlier board back. When the leaderboard is refused or
    fails, the previous one in ``out_dir`` is kept as it was, and stderr says so. Build folders of
    leaderboards that were killed are removed first.

    Parameters
    ----------
    run_dirs : paths
        ``run`` directories and ``score`` output folders.
    out_dir : path
    allow_mixed : bool
        Report runs with different task sets, seeds or scorers together.
    focus, compare : optional
        See :func:`comparison_pairs`.
    curves : path, optional
        A ``curves.csv`` for the "Score @ 85% PR" column (default: ``out_dir/curves.csv`` if present).
    reference_aggregation : {"mean", "max"}, optional
        Show every score as this aggregation of its references' best scores (default: each record's
        own score, i.e. its scorer's ``reference_aggregation``).
    allow_suspect : bool
        Rank entries with a suspect continuation by score too (default: listed after the others, not ranked:
        :mod:`cmbench.report.suspect`).
    task_ids : iterable of str, optional
        Only the records of these tasks (a sweep's board: the tasks the sweep ran).
    shared_tasks : bool
        Runs that ran different tasks make a board over the tasks all of them ran (said in a line and
        in the markdown) instead of being refused.
    families : bool
        Also the families board: ``families.csv`` and ``families.png`` (:mod:`cmbench.report.families_board`).

    Returns
    -------
    dict name -> written path, for the names of :data:`REPORT_FILES` written (``comparisons.csv``
    only when there are pairs to compare).

    Raises
    ------
    ReportError
        Runs that cannot be compared or read, or an output folder that cannot be written (one line).
    """
    out = Path(out_dir)
    folder = board_folder(out)  # an empty folder or a board CMBench wrote: nothing of a user's is replaced
    tmp = out.parent / f"{BUILD_PREFIX.format(name=out.name)}{os.getpid()}"
    removed = remove_stale_builds(out)
    if removed:
        print(f"leaderboard: removed {len(removed)} folder(s) left by killed leaderboards: "
              f"{', '.join(p.name for p in removed)}", file=sys.stderr)
    try:
        runs = load_runs(run_dirs, allow_mixed, reference_aggregation=reference_aggregation, task_ids=task_ids,
                         shared_tasks=shared_tasks)
        board = ranked(leaderboard(runs, find_curves(out, curves)), allow_suspect)
        compared = comparisons(runs, comparison_pairs(runs, focus, compare))
        tables = {
            "leaderboard.csv": board,
            "leaderboard_by_source.csv": breakdown(runs, "source"),
            "leaderboard_by_type.csv": breakdown(runs, "task_type"),
            "leaderboard_by_seed.csv": seed_breakdown(runs),
            "paired_deltas.csv": paired_deltas(runs),
        }
        if len(compared):
            tables["comparisons.csv"] = compared

        gated = gate.backbone_gate(runs)
        if len(gated):
            tables[gate.FILE] = gated
        for warning in gated.loc[~gated["passes"].astype(bool), "meaning"]:
            print(f"leaderboard: {warning}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, frame in tables.items():
            frame.to_csv(tmp / name, index=False, float_format="%.6g")
        (tmp / "leaderboard.md").write_text(markdown_table(board, compared) + gate.markdown(gated))
        (tmp / BOARD_JSON).write_text(board_text(board_json(runs, board, tables)))
        if families:
            from cmbench.report.families_board import write_families

            write_families(tmp)
        pareto_plot(board, tmp / "pareto.png")
        folder.add(*(p.name for p in tmp.iterdir()))
        written = _swap_files(tmp, out, folder.files)
    except OSError as err:
        _kept(out)
        raise ReportError(f"cannot write the leaderboard into {out}: {err.strerror or err}") from err
    except BaseException:
        _kept(out)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {name: out / name for name in written}


BOARD_COLUMNS = ("method", "metric", "score", "score_ci95", "pr", "cost_speedup_vs_fullkv", "speedup_vs_fullkv",
                 "continuation_fps", "fps_measured_together", "peak_kv_bytes", "seeds", "score_seed_std", "n_tasks",
                 "failures", "other_code_tasks")
"""The columns of ``leaderboard.csv`` that :func:`markdown_table` reads."""
TEXT_COLUMNS = ("method", "metric", "fps_measured_together")
COMPARISON_NUMBERS = ("delta", "delta_ci95", "p_value", "wins", "ties", "losses", "n_pairs")


def numeric_columns(frame: pd.DataFrame, path: Path, columns: Iterable[str]) -> pd.DataFrame:
    """``frame`` with ``columns`` as numbers (empty cells NaN).

    Raises
    ------
    ReportError
        A cell that is not a number: one line naming the file, line and column.
    """
    for column in columns:
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = values.isna() & frame[column].notna()
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise ReportError(f"{path}:{row + 2}: column {column}: {frame[column].iloc[row]!r} is not a number")
        frame[column] = values
    return frame


def refresh_matched_column(out_dir: str | Path, curves: str | Path | None = None) -> dict[str, Path]:
    """Fill "Score @ 85% PR" of the leaderboard already in ``out_dir`` from new curves, without its runs.

    ``curves`` reruns alone (more methods, new targets) change only that column: it is recomputed as
    :func:`leaderboard` computes it, and ``leaderboard.csv`` and ``leaderboard.md`` are written again
    (the markdown from the folder's own tables: ``leaderboard.csv``, ``comparisons.csv`` and
    ``backbone_gate.csv`` where present; every other file is left as it is). The folder is data: labels
    are escaped, and the gate's verdicts are derived again from its numbers.

    Parameters
    ----------
    out_dir : path
        A leaderboard folder (``leaderboard.out``).
    curves : path, optional
        A ``curves.csv`` (default: ``out_dir/curves.csv``, which must exist).

    Returns
    -------
    dict name -> written path (``leaderboard.csv``, ``leaderboard.md``).

    Raises
    ------
    ReportError
        No curves, or a missing, torn or foreign table in ``out_dir`` (one line naming the file).
    """
    from cmbench.runs import atomic

    out = Path(out_dir)
    folder = board_folder(out)  # a board CMBench wrote, or refused
    table = read_curves(curves if curves is not None else out / CURVES_FILE)
    board = numeric_columns(read_table(out / "leaderboard.csv", BOARD_COLUMNS, kind="leaderboard", command="leaderboard"),
                            out / "leaderboard.csv", [c for c in BOARD_COLUMNS if c not in TEXT_COLUMNS])
    at = scores_at(table, OPERATING_PR)
    values = [at.get(str(label), math.nan) for label in board["method"]]
    if MATCHED_COLUMN in board.columns:
        board[MATCHED_COLUMN] = values
    else:
        board.insert(4, MATCHED_COLUMN, values)
    compared = None
    if (out / "comparisons.csv").is_file():
        compared = numeric_columns(read_table(out / "comparisons.csv", ("method", "versus", *COMPARISON_NUMBERS),
                                              kind="comparisons", command="leaderboard"),
                                   out / "comparisons.csv", COMPARISON_NUMBERS)
    gated = gate.read_gate(out / gate.FILE) if (out / gate.FILE).is_file() else pd.DataFrame(columns=list(gate.COLUMNS))
    folder.add("leaderboard.csv", "leaderboard.md")
    written = {"leaderboard.csv": atomic.write_with(out / "leaderboard.csv",
                                                    lambda tmp: board.to_csv(tmp, index=False, float_format="%.6g")),
               "leaderboard.md": atomic.write_text(out / "leaderboard.md", markdown_table(board, compared) + gate.markdown(gated))}
    if (out / BOARD_JSON).is_file():  # a board from before leaderboard.json has none to refill
        folder.add(BOARD_JSON)
        written[BOARD_JSON] = atomic.write_text(out / BOARD_JSON, refilled(
            out / BOARD_JSON, MATCHED_COLUMN, dict(zip(board["method"].astype(str), values))))
    return written


def _kept(out: Path) -> None:
    """Say that a refused or failed leaderboard left the previous one in ``out`` as it was."""
    if (out / "leaderboard.md").is_file():
        print(f"leaderboard: not written; the previous leaderboard in {out} is kept as it was (it does not "
              f"show these runs)", file=sys.stderr)


def remove_stale_builds(out: Path) -> list[Path]:
    """Remove the build folders (``.<out>.tmp-<pid>``) that leaderboards killed half-way left beside ``out``."""
    gone = [folder for folder, _ in dead_builds(out, BUILD_PREFIX.format(name=out.name))]
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    return gone
