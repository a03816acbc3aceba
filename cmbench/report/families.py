"""Families of KV compression on one axis of device bytes: the family of a leaderboard entry, a leaderboard CSV
read with its columns checked, and the figure of score against device KV bytes.

The family is what the entry's records carry (the board's ``family`` column, :mod:`cmbench.method_family`): the
method class declares it, so a plug-in method and a relabelled run keep theirs:

- eviction (``decoprune``, ``streaming``, ``random``, ...): drops tokens, full precision;
- retrieval (``worldkv``, ``key_retrieval``): evicts to a host store and brings chunks back;
- merging (``tempcache``): merges similar keys;
- quantization (``fullkv+kivi2-...``, ``fullkv+qvg2x1k16-...``): keeps every token in fewer bits;
- low-rank (``fullkv+lowrank16-r0``): keeps every token, its key projected to a few coefficients;
- a method in a storage format is its family + the format's (e.g. eviction + quantization, eviction + low-rank).

A board written before records carried the family (no ``family`` column, or an empty cell) falls back to the
label (``<method>[@<target>][+<storage format>]``): the family the registered method of that name declares.

Where an entry lands: a bytes target is calibrated on calibration tasks, and the bytes an entry realises on the
test tasks differ (DeCoPrune calibrated to 0.25 stored 0.287 on them). An entry counts at its target only when
those bytes are within :data:`LANDING_TOLERANCE` (relative) of it (:func:`on_target`); otherwise the board shows
it off target and it is not ranked there (its difference from FullKV is still stated: that claim does not depend
on the target). Comparing on each family's score-vs-bytes curve instead (interpolated between calibrated points
bracketing the target) was the other choice; it is not taken because a point interpolated between two runs has
no per-task pairs with the other entries, so the paired, context-clustered intervals every verdict rests on do
not exist there, and because the end targets (0.25, 0.08) are not bracketed by any family's runs.

Total memory beside device memory: a retrieval method keeps evicted chunks in a host store and moves them back; the
board gives each entry's peak device bytes, peak host-store bytes and their sum over FullKV's peak device bytes, and
the bytes moved per generated chunk (:func:`memory_columns`); the figure's second panel draws score against that
sum. Every ratio is relative to FullKV in the board's cache precision (:func:`cmbench.report.precision.bytes_axis`).

``python scripts/families_figure.py runs/families/board/leaderboard.csv results/miniworld/families_bytes.png --table
results/miniworld/families_bytes.csv`` writes the committed comparison's board (the leaderboard and these columns)
and figure; :mod:`cmbench.paper.readme` writes the README's paragraph from the same CSV.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from cmbench.method_family import STORAGE_FAMILY, UNDECLARED, run_family
from cmbench.report.precision import bytes_axis
from cmbench.report.reading import read_table

LABEL = re.compile(r"^(?P<method>[^@+]+)(?:@(?P<target>[^+]+))?(?:\+(?P<storage>.+))?$")
COLUMNS = ("method", "score", "score_ci95", "kv_bytes_ratio")
MEMORY_COLUMNS = ("peak_kv_bytes", "peak_store_bytes", "moved_bytes_per_chunk")
"""Leaderboard columns the memory columns and the second panel read (a board without them: no store, peaks unknown)."""
LANDING_TOLERANCE = 0.05
"""How far, relative to its target, the device bytes an entry realises on the test tasks may be for it to count at
that target (the calibration's own tolerance, 0.005 absolute on its calibration tasks, is 2-6% of these targets)."""
REFERENCE = "fullkv"


def family(label: str) -> str:
    """The family of a leaderboard label written before records carried it: the family the registered method the
    label names declares (:mod:`cmbench.method_family`), ``decoprune@bytes15+kivi4-g32-r128`` -> ``eviction +
    quantization``, ``fullkv+kivi2-g32-r128`` -> ``quantization``, ``fullkv+lowrank16-r0`` -> ``low-rank``,
    ``fullkv`` -> ``reference``; a label that names no registered method (a plug-in, a relabelled run) or no
    storage format CMBench knows is ``other``: boards with a ``family`` column do not ask."""
    from cmbench.errors import ConfigError
    from cmbench.methods.registry import method_class

    match = LABEL.match(label)
    method = match["method"] if match else label
    try:
        declared = method_class("kvpress" if method.startswith("kvpress_") else method).family  # kvpress_<Press>
    except ConfigError:
        declared = ""
    stored = re.match(r"[a-z]*", match["storage"])[0] if match and match["storage"] else "fp"  # type: ignore[index]
    return run_family(declared, stored) if stored in STORAGE_FAMILY else UNDECLARED


def entry_families(board: pd.DataFrame) -> list[str]:
    """Each entry's family: its ``family`` cell (what its records carry) where the board has one, else
    :func:`family` of its label."""
    recorded = board["family"] if "family" in board.columns else pd.Series([None] * len(board), index=board.index)
    return [str(f) if isinstance(f, str) and f else family(str(m)) for m, f in zip(board["method"], recorded)]


def bytes_target(label: str) -> float | None:
    """The device-bytes target of a leaderboard label, from the tag ``method.target_bytes`` puts in it
    (``decoprune@bytes15+kivi4-g32-r128`` -> 0.15, ``x@bytes12.5`` -> 0.125); None for an entry without one
    (FullKV, a storage format alone, a PR target)."""
    match = LABEL.match(label)
    tag = re.fullmatch(r"bytes(\d+(?:\.\d+)?)", match["target"] or "") if match else None
    return float(tag[1]) / 100 if tag else None


def bytes_miss(target: float | None, realised: float) -> float:
    """How far the bytes an entry realised are from its target, relative (``0.287`` at ``0.25``: ``+0.148``);
    NaN for an entry without a target or without realised bytes."""
    if target is None or pd.isna(target) or pd.isna(realised):
        return math.nan
    return float(realised) / float(target) - 1.0


def on_target(target: float | None, realised: float, tolerance: float = LANDING_TOLERANCE) -> bool:
    """Whether an entry counts at its bytes target: its realised bytes within ``tolerance`` (relative) of it; an
    entry without a target (FullKV, a format alone) counts where it is."""
    if target is None or pd.isna(target):
        return True
    miss = bytes_miss(target, realised)
    return not math.isnan(miss) and abs(miss) <= tolerance


def memory_columns(board: pd.DataFrame) -> pd.DataFrame:
    """``board`` with where each entry lands and its total memory (columns added, rows kept):

    - ``store_bytes_ratio``: peak retrieval-store bytes over FullKV's peak device bytes (0 without a store);
    - ``store_on_device``: whether the store was kept on the device (:func:`store_on_device`);
    - ``device_bytes_ratio``: what the entry holds on the device over FullKV's: ``kv_bytes_ratio``, plus
      ``store_bytes_ratio`` where the store was on the device (WorldKV's ``bank_on_device``: the same rows attend
      as with its store on the host, but the device holds the store too);
    - ``bytes_target``: the label's target (NaN without one), ``bytes_miss``: :func:`bytes_miss` and ``on_target``:
      :func:`on_target` of ``device_bytes_ratio``;
    - ``total_bytes_ratio``: peak device plus peak store bytes over FullKV's peak device bytes;
    - ``moved_bytes_per_chunk``: bytes moved host <-> device per generated chunk (0 without a store).

    FullKV's peak is the ``fullkv`` row's ``peak_kv_bytes`` (NaN ratios on a board without it or the column).
    """
    out = board.copy()
    out["kv_bytes_ratio"] = pd.to_numeric(out["kv_bytes_ratio"], errors="coerce")
    for column in MEMORY_COLUMNS:
        if column not in out.columns:
            out[column] = math.nan
        out[column] = pd.to_numeric(out[column], errors="coerce")
    reference = out.loc[out["method"] == REFERENCE, "peak_kv_bytes"]
    full_peak = float(reference.iloc[0]) if len(reference) else math.nan
    store = out["peak_store_bytes"].fillna(0.0)
    out["moved_bytes_per_chunk"] = out["moved_bytes_per_chunk"].fillna(0.0)
    out["store_bytes_ratio"] = store / full_peak
    out["store_on_device"] = store_on_device(out)
    out["device_bytes_ratio"] = out["kv_bytes_ratio"] + out["store_bytes_ratio"].where(out["store_on_device"], 0.0)
    out["total_bytes_ratio"] = (out["peak_kv_bytes"] + store) / full_peak
    out["bytes_target"] = [bytes_target(str(m)) for m in out["method"]]
    out["bytes_miss"] = [bytes_miss(t, r) for t, r in zip(out["bytes_target"], out["device_bytes_ratio"])]
    out["on_target"] = [on_target(t, r) for t, r in zip(out["bytes_target"], out["device_bytes_ratio"])]
    return out


def store_on_device(board: pd.DataFrame) -> pd.Series:
    """Whether each entry kept its retrieval store on the device: it has a store (``peak_store_bytes`` > 0) and
    moved nothing over the host link (``moved_bytes_per_chunk`` 0: WorldKV's ``method.bank_on_device``; a store in
    host memory moves every row it brings back)."""
    store = pd.to_numeric(board["peak_store_bytes"], errors="coerce").fillna(0.0)
    moved = pd.to_numeric(board["moved_bytes_per_chunk"], errors="coerce").fillna(0.0)
    return (store > 0) & (moved == 0)


def read_board(path: Path) -> pd.DataFrame:
    """The columns the figure needs from the leaderboard CSV at ``path``, one row per entry (read as every table
    a command wrote: regular file, within the table limit, not empty nor torn).

    Raises
    ------
    ValueError
        One line naming the file, and the missing column or the row and field that is not a number.
    CMBenchError
        The file missing, not a regular file, over the limit, empty or torn (:func:`read_table`).
    """
    table = read_table(path, (), "leaderboard", "leaderboard")
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (a leaderboard CSV has {', '.join(COLUMNS)})")
    extra = [c for c in ("family", "cache_dtype", *MEMORY_COLUMNS) if c in table.columns]
    out = table[[*COLUMNS, *extra]].copy()
    for field in COLUMNS[1:]:
        numbers = pd.to_numeric(out[field], errors="coerce")
        blank_allowed = field == "score_ci95"  # no CI with fewer than two contexts
        bad = (out[field].notna() & numbers.isna()) | (out[field].isna() & (not blank_allowed))
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            value = out[field].iloc[row]
            what = "empty, expected a number" if pd.isna(value) else f"{value!r} is not a number"
            raise ValueError(f"{path}: row {row + 2} ({out['method'].iloc[row]}), {field}: {what}")
        out[field] = numbers
    out["family"] = entry_families(out)
    return memory_columns(out)


def board_axis(board: pd.DataFrame) -> str:
    """What the board's bytes are relative to, from its one ``cache_dtype`` (float32 for a board without it)."""
    named = board["cache_dtype"].dropna().unique() if "cache_dtype" in board.columns else []
    if len(named) > 1:
        raise ValueError(f"the board mixes cache precisions ({', '.join(sorted(map(str, named)))}): one bytes axis "
                         "cannot hold them")
    return bytes_axis(str(named[0]) if len(named) else "float32")


def series(label: str) -> str:
    """The curve an entry belongs to: its method and storage format without the target (``decoprune@bytes15+kivi4-
    g32-r128`` -> ``decoprune+kivi4-g32-r128``): the calibrated points of one family member."""
    match = LABEL.match(label)
    if not match:
        return label
    return match["method"] + (f"+{match['storage']}" if match["storage"] else "")


def points(board: pd.DataFrame) -> pd.DataFrame:
    """The points drawn (every entry but FullKV): ``x`` its KV bytes in % of FullKV's, ``y`` its score, ``yerr``
    the CI's half-width (0 where there is none), ``family`` and ``method``, sorted by family then bytes."""
    rows = board[board["family"] != "reference"]
    landed = rows["on_target"] if "on_target" in rows.columns else pd.Series(True, index=rows.index)
    total = rows["total_bytes_ratio"] if "total_bytes_ratio" in rows.columns else pd.Series(math.nan, index=rows.index)
    device = rows["device_bytes_ratio"] if "device_bytes_ratio" in rows.columns else rows["kv_bytes_ratio"]
    return pd.DataFrame({"family": rows["family"], "method": rows["method"], "x": 100 * device,
                         "y": rows["score"], "yerr": rows["score_ci95"].fillna(0.0),
                         "series": [series(str(m)) for m in rows["method"]], "on_target": landed.astype(bool),
                         "total": 100 * total}).sort_values(["family", "x"], kind="stable").reset_index(drop=True)


def draw(board: pd.DataFrame, out: Path, title: str | None = None) -> Path:
    """Two panels, score (95% CI bars) against bytes in % of FullKV's (log axes, named with the board's
    precision): device KV bytes (left), device plus host-store bytes at their peaks (right, retrieval entries
    listed with the bytes they move per chunk). One curve per family member (:func:`series`) through its
    calibrated points, a colour and marker each (its family in the legend); a hollow marker is an entry off its
    target (not ranked there); FullKV's score a horizontal line and band. Written to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import matplotlib.ticker  # noqa: F401  (the bytes axis' labels)

    axis = board_axis(board)
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6), sharey=True)
    pts = points(board)
    colours = plt.get_cmap("tab20")
    markers = "osD^vP*Xhp"
    for ax, x, what in ((left, "x", "device KV bytes"), (right, "total", "device + host-store KV bytes (peaks)")):
        for row in board[board["family"] == "reference"].itertuples():
            ax.axhline(row.score, color="black", lw=1, ls="--", label=f"FullKV ({row.score:.3f})")
            if not math.isnan(row.score_ci95):
                ax.axhspan(row.score - row.score_ci95, row.score + row.score_ci95, color="black", alpha=0.08)
        for i, (name, group) in enumerate(pts.dropna(subset=[x]).groupby("series", sort=True)):
            group = group.sort_values(x)
            colour = colours(i % 20)
            marker = markers[i % len(markers)]
            ax.plot(group[x], group["y"], color=colour, lw=1, alpha=0.7)
            for landed, part in group.groupby("on_target"):
                ax.errorbar(part[x], part["y"], yerr=part["yerr"], fmt=marker, color=colour, capsize=3,
                            markerfacecolor=colour if landed else "white", markersize=6,
                            label=f"{name.replace('-g32-r128', '')} ({group['family'].iloc[0]})" if landed or
                            not group["on_target"].any() else None)
            end = group.iloc[-1]
            ax.annotate(name.replace("-g32-r128", ""), (end[x], end["y"]), textcoords="offset points",
                        xytext=(4, -10 if i % 2 else 4), fontsize=7, color=colour)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:g}" if f"{v:g}"[0] in "1258" else ""))
        ax.set_xlabel(f"{what}, % ({axis}; log scale)")
        ax.grid(alpha=0.3, which="both")
    moved = board[board["moved_bytes_per_chunk"] > 0] if "moved_bytes_per_chunk" in board.columns else board.iloc[:0]
    if len(moved):
        right.text(0.98, 0.02, "moved host <-> device per chunk:\n" + "\n".join(
            f"{row.method}: {row.moved_bytes_per_chunk / 1e6:.1f} MB" for row in moved.itertuples()),
            transform=right.transAxes, ha="right", va="bottom", fontsize=7,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.8"})
    left.set_ylabel("score (mean, 95% CI clustered by context)")
    left.set_title("device memory")
    right.set_title("device + host memory")
    fig.suptitle(title or f"Score vs KV bytes by family of KV compression ({axis}; hollow: off its target, not ranked)")
    left.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out
