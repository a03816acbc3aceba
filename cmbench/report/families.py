"""Families of KV compression on one axis of device bytes: the family of a leaderboard entry, a leaderboard CSV
read with its columns checked, and the figure of score against device KV bytes.

The family is what the entry's records carry (the board's ``family`` column, :mod:`cmbench.method_family`): the
method class declares it, so a plug-in method and a relabelled run keep theirs:

- eviction (``decoprune``, ``streaming``, ``random``, ...): drops tokens, full precision;
- retrieval (``worldkv``, ``key_retrieval``): evicts to a host store and brings chunks back;
- merging (``tempcache``): merges similar keys;
- quantization (``fullkv+kivi2-...``): keeps every token in fewer bits;
- a method with a quantized format is its family + quantization (e.g. eviction + quantization).

A board written before records carried the family (no ``family`` column, or an empty cell) falls back to the
label (``<method>[@<target>][+<storage format>]``): the family the registered method of that name declares.

``python scripts/families_figure.py results/miniworld/families_bytes.csv results/miniworld/families_bytes.png``
draws the committed comparison's figure; :mod:`cmbench.paper.readme` writes the README's paragraph from the same CSV.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from cmbench.method_family import run_family
from cmbench.report.reading import read_table

LABEL = re.compile(r"^(?P<method>[^@+]+)(?:@(?P<target>[^+]+))?(?:\+(?P<storage>.+))?$")
COLUMNS = ("method", "score", "score_ci95", "kv_bytes_ratio")


def family(label: str) -> str:
    """The family of a leaderboard label written before records carried it: the family the registered method the
    label names declares (:mod:`cmbench.method_family`), ``decoprune@bytes15+kivi4-g32-r128`` -> ``eviction +
    quantization``, ``fullkv+kivi2-g32-r128`` -> ``quantization``, ``fullkv`` -> ``reference``; a label that names
    no registered method (a plug-in, a relabelled run) is ``other``: boards with a ``family`` column do not ask."""
    from cmbench.errors import ConfigError
    from cmbench.methods.registry import method_class

    match = LABEL.match(label)
    method = match["method"] if match else label
    try:
        declared = method_class("kvpress" if method.startswith("kvpress_") else method).family  # kvpress_<Press>
    except ConfigError:
        declared = ""
    return run_family(declared, bool(match and match["storage"]))


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
    out = table[[*COLUMNS, *(["family"] if "family" in table.columns else [])]].copy()
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
    return out


def points(board: pd.DataFrame) -> pd.DataFrame:
    """The points drawn (every entry but FullKV): ``x`` its KV bytes in % of FullKV's, ``y`` its score, ``yerr``
    the CI's half-width (0 where there is none), ``family`` and ``method``, sorted by family then bytes."""
    rows = board[board["family"] != "reference"]
    return pd.DataFrame({"family": rows["family"], "method": rows["method"], "x": 100 * rows["kv_bytes_ratio"],
                         "y": rows["score"], "yerr": rows["score_ci95"].fillna(0.0)}).sort_values(
        ["family", "x"], kind="stable").reset_index(drop=True)


def draw(board: pd.DataFrame, out: Path, title: str | None = None) -> Path:
    """Score (95% CI bars) against KV bytes in % of FullKV's (log axis), a colour per family, each point
    named by its label; FullKV's score as a horizontal line and band. Written to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import matplotlib.ticker  # noqa: F401  (the bytes axis' labels)

    fig, ax = plt.subplots(figsize=(10.5, 5.6))
    reference = board[board["family"] == "reference"]
    for row in reference.itertuples():
        ax.axhline(row.score, color="black", lw=1, ls="--", label=f"FullKV ({row.score:.3f})")
        if not math.isnan(row.score_ci95):
            ax.axhspan(row.score - row.score_ci95, row.score + row.score_ci95, color="black", alpha=0.08)
    colours = plt.get_cmap("tab10")
    for i, (name, group) in enumerate(points(board).groupby("family", sort=True)):
        ax.errorbar(group["x"], group["y"], yerr=group["yerr"], fmt="o", color=colours(i), capsize=3, label=name)
        for row in group.itertuples():
            ax.annotate(row.method.replace("-g32-r128", ""), (row.x, row.y), textcoords="offset points",
                        xytext=(4, 4), fontsize=7, color=colours(i))
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "1258" else ""))
    ax.set_xlabel("device KV bytes, % of FullKV's (log scale)")
    ax.set_ylabel("score (mean, 95% CI clustered by context)")
    ax.set_title(title or "Score vs device KV bytes, by family of KV compression")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out
