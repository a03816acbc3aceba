"""The backbone gate: can this backbone use its context at all?

Compressing a KV cache only matters on a backbone whose uncompressed cache helps: the paper chose
LingBot World v2 because Self-Forcing, Causal Forcing and LongLive score about 0.26 with FullKV, no
better than forgetting the context, so comparing compression methods on them measures nothing. On
every backbone of a leaderboard that has both, FullKV is paired with the no-context control (Streaming
with ``recent_chunks=0``: the sink chunk only, e.g. ``run method=streaming method.recent_chunks=0
label=sink_only``) over the (task, seed) pairs both finished; the backbone passes when the lower end
of the paired difference's 95% CI (clustered by context) is at least :data:`MARGIN`. Otherwise the
leaderboard warns and the report shows why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from cmbench.report.comparisons import REFERENCE_METHOD, comparisons
from cmbench.report.reading import ReportError, RunRecords, read_table
from cmbench.report.text import markdown_text

MARGIN = 0.05
"""FullKV must beat the no-context control by at least this much score, at the lower end of the 95% CI."""
COLUMNS = ("backbone", "fullkv", "no_context", "delta", "delta_ci95", "n_pairs", "passes", "meaning")
FILE = "backbone_gate.csv"


def _first(run: RunRecords, field: str):
    values = run.frame[field].dropna() if field in run.frame else pd.Series(dtype=object)
    return values.iloc[0] if len(values) else None


def is_no_context(run: RunRecords) -> bool:
    """Whether an entry is the no-context control: Streaming with no recent window (the sink only)."""
    config = _first(run, "method_config")
    return _first(run, "method") == "streaming" and isinstance(config, dict) and config.get("recent_chunks") == 0


def backbone_gate(runs: Sequence[RunRecords]) -> pd.DataFrame:
    """One row per backbone with both a FullKV entry and a no-context control entry: see :data:`COLUMNS`.

    ``delta`` is FullKV minus the control (paired), ``passes`` whether ``delta - delta_ci95 >= MARGIN``
    (``False`` when the interval cannot be computed: fewer than two contexts), ``meaning`` a sentence.
    """
    by_backbone: dict[str, list[RunRecords]] = {}
    for run in runs:
        by_backbone.setdefault(str(_first(run, "backbone")), []).append(run)
    rows = []
    for backbone, entries in sorted(by_backbone.items()):
        full = next((r for r in entries if r.label == REFERENCE_METHOD), None) or next(
            (r for r in entries if _first(r, "method") == REFERENCE_METHOD), None)
        control = next((r for r in entries if is_no_context(r)), None)
        if full is None or control is None:
            continue
        pair = comparisons(list(entries), [(full.label, control.label)]).iloc[0]
        delta, ci = float(pair["delta"]), float(pair["delta_ci95"])
        passes = clears_margin(delta, ci)
        rows.append({"backbone": backbone, "fullkv": full.label, "no_context": control.label, "delta": delta,
                     "delta_ci95": ci, "n_pairs": int(pair["n_pairs"]), "passes": passes,
                     "meaning": meaning(backbone, delta, ci, passes)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def clears_margin(delta: float, ci: float) -> bool:
    """Whether a paired difference passes the gate: its 95% CI's lower end at least :data:`MARGIN` (False
    without a CI)."""
    return not math.isnan(ci) and delta - ci >= MARGIN


def meaning(backbone: str, delta: float, ci: float, passes: bool) -> str:
    """The gate's sentence for one backbone."""
    if passes:
        return (f"FullKV beats the no-context control by {delta:+.4f} (95% CI +- {ci:.4f}): {backbone} uses its "
                "context, so comparing compression methods on it is meaningful")
    shown = "no CI (fewer than two contexts)" if math.isnan(ci) else f"95% CI +- {ci:.4f}"
    return (f"warning: FullKV is not above the no-context control by a clear margin ({delta:+.4f}, {shown}; "
            f"needed: the CI's lower end >= {MARGIN}): {backbone} does not use its context (or this board cannot "
            "show that it does), so differences between compression methods on it say nothing about memory")


def markdown(gate: pd.DataFrame) -> str:
    """The gate as markdown (empty when no backbone has both entries)."""
    if gate.empty:
        return ""
    lines = ["", f"Backbone gate (FullKV minus the no-context control, paired; passes when the 95% CI's lower "
                 f"end is >= {MARGIN}):", ""]
    lines += [f"- {'PASS' if r.passes else 'WARN'} {markdown_text(r.backbone)}: {markdown_text(r.meaning)} "
              f"({r.n_pairs} pairs)" for r in gate.itertuples()]
    return "\n".join(lines) + "\n"


def read_gate(path: Path) -> pd.DataFrame:
    """A ``backbone_gate.csv`` written by a leaderboard, its verdicts and sentences derived again from its
    numbers (the file is data: its ``passes`` and ``meaning`` are not trusted).

    Raises
    ------
    ReportError
        The file is not a gate table (one line naming the file and what is wrong).
    """
    table = read_table(path, COLUMNS, kind="backbone gate", command="leaderboard")
    numbers = table[["delta", "delta_ci95"]].apply(pd.to_numeric, errors="coerce")
    if numbers["delta"].isna().any():
        raise ReportError(f"{path}: column delta must hold a number in every row")
    table["delta_ci95"] = numbers["delta_ci95"]
    table["passes"] = [clears_margin(delta, ci) for delta, ci in zip(numbers["delta"], numbers["delta_ci95"])]
    table["meaning"] = [meaning(str(r.backbone), float(r.delta), float(r.delta_ci95), bool(r.passes)) for r in table.itertuples()]
    return table
