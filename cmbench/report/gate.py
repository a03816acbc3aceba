"""The backbone gate: can this backbone use its context at all?

Compressing a KV cache only matters on a backbone whose uncompressed cache helps: the paper chose
LingBot World v2 because Self-Forcing, Causal Forcing and LongLive score about 0.26 with FullKV, no
better than forgetting the context, so comparing compression methods on them measures nothing. On
every backbone of a leaderboard that has both, FullKV is paired with the no-context control (Streaming
with ``recent_chunks=0``: the sink chunk only, e.g. ``run method=streaming method.recent_chunks=0
label=sink_only``) over the (task, seed) pairs both finished, and the claim "FullKV is level with the
no-context control" is decided by CMBench's verdict rule (:mod:`cmbench.report.verdicts`: an equivalence
claim at its margin, :data:`MARGIN`; the backbones of one board are one family). The backbone **passes**
when that claim does not hold with FullKV above (its simultaneous interval lies wholly above the margin:
it uses its context), **fails** when it holds (level with forgetting) or FullKV lies below by more than the
margin, and is **inconclusive** otherwise (the board cannot show it either way, e.g. too few contexts).
Every backbone that does not pass is warned about on the leaderboard and shown first in the report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from cmbench.report.comparisons import REFERENCE_METHOD, comparisons
from cmbench.report.reading import ReportError, RunRecords, read_table
from cmbench.report.text import markdown_text
from cmbench.report.verdicts import EQUIVALENT, FAILS, HOLDS, MARGINS, Claim, Decided, decide

MARGIN = MARGINS[EQUIVALENT].value
"""How far FullKV must lie above the no-context control, all of its simultaneous interval, to pass."""
PASSES, FAILS_GATE, INCONCLUSIVE_GATE = "passes", "fails", "inconclusive"
READ = ("backbone", "fullkv", "no_context", "delta", "delta_ci95", "n_pairs")
"""The columns a gate file must have: the rest is derived again from them when it is read."""
COLUMNS = (*READ, "contexts", "low", "high", "level", "verdict", "passes", "meaning")
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

    ``delta`` is FullKV minus the control (paired, its 95% half-width ``delta_ci95`` over ``contexts``), decided
    as one family (:func:`decided_table`): ``verdict``, ``passes`` (only a pass: an inconclusive gate warns too)
    and ``meaning`` a sentence.
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
        rows.append({"backbone": backbone, "fullkv": full.label, "no_context": control.label,
                     "delta": float(pair["delta"]), "delta_ci95": float(pair["delta_ci95"]),
                     "n_pairs": int(pair["n_pairs"]), "contexts": int(pair["contexts"])})
    return decided_table(pd.DataFrame(rows, columns=[*READ, "contexts"]))


def decided_table(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (:data:`READ` and ``contexts``) with each backbone's claim decided as one family: its simultaneous
    interval (``low``, ``high`` at ``level``), ``verdict`` (:func:`gate_verdict`), ``passes`` and ``meaning``."""
    claims = [Claim.of_interval(f"{r.backbone}: {r.fullkv} level with {r.no_context}", EQUIVALENT, float(r.delta),
                                float(r.delta_ci95), int(r.contexts), int(r.n_pairs), a=str(r.fullkv),
                                b=str(r.no_context)) for r in rows.itertuples()]
    decided = decide(claims)
    out = rows.copy()
    out["low"], out["high"], out["level"] = ([getattr(d, k) for d in decided] for k in ("low", "high", "level"))
    out["verdict"] = [gate_verdict(d) for d in decided]
    out["passes"] = out["verdict"] == PASSES
    out["meaning"] = [meaning(str(r.backbone), d) for r, d in zip(rows.itertuples(), decided)]
    return out[list(COLUMNS)] if len(out) else pd.DataFrame(columns=list(COLUMNS))


def gate_verdict(decided: Decided) -> str:
    """The gate's word for the decided claim "FullKV level with the no-context control": ``passes`` when it does
    not hold with FullKV above, ``fails`` when it holds or FullKV lies below, else ``inconclusive``."""
    if decided.verdict == FAILS:
        return PASSES if decided.claim.estimate > 0 else FAILS_GATE
    return FAILS_GATE if decided.verdict == HOLDS else INCONCLUSIVE_GATE


def meaning(backbone: str, decided: Decided) -> str:
    """The gate's sentence for one backbone."""
    c = decided.claim
    shown = (f"{c.estimate:+.4f}, no interval: fewer than two contexts" if math.isnan(decided.low) else
             f"{c.estimate:+.4f}, interval [{decided.low:+.4f}, {decided.high:+.4f}] at {decided.level:.2%}")
    verdict = gate_verdict(decided)
    if verdict == PASSES:
        return (f"FullKV is above the no-context control by more than {MARGIN:g} ({shown}): {backbone} uses its "
                "context, so comparing compression methods on it is meaningful")
    said = (f"FullKV is level with the no-context control (within ±{MARGIN:g}: {shown}): {backbone} does not use "
            "its context" if decided.verdict == HOLDS else
            f"FullKV is below the no-context control by more than {MARGIN:g} ({shown}): {backbone} does worse with "
            "its context than without" if verdict == FAILS_GATE else
            f"this board cannot show that FullKV is above the no-context control by more than {MARGIN:g} ({shown})")
    return f"warning: {said}, so differences between compression methods on {backbone} say nothing about memory"


def markdown(gate: pd.DataFrame) -> str:
    """The gate as markdown (empty when no backbone has both entries)."""
    if gate.empty:
        return ""
    lines = ["", f"Backbone gate (FullKV against the no-context control, paired, by the verdict rule: passes when "
                 f"all of its simultaneous interval lies above +{MARGIN:g}; docs/verdicts.md):", ""]
    lines += [f"- {'PASS' if r.passes else 'WARN'} {markdown_text(r.backbone)}: {markdown_text(r.meaning)} "
              f"({r.n_pairs} pairs)" for r in gate.itertuples()]
    return "\n".join(lines) + "\n"


def read_gate(path: Path) -> pd.DataFrame:
    """A ``backbone_gate.csv`` written by a leaderboard, its verdicts and sentences decided again from its numbers
    (the file is data: its ``verdict``, ``passes`` and ``meaning`` are not trusted). A file written before the gate
    recorded its contexts is read when it gates one backbone (a family of one: its 95% interval is the
    simultaneous one, whatever the contexts).

    Raises
    ------
    ReportError
        The file is not a gate table, or gates several backbones without their contexts (one line naming the
        file and what is wrong).
    """
    table = read_table(path, READ, kind="backbone gate", command="leaderboard")
    numbers = table[["delta", "delta_ci95", "n_pairs"]].apply(pd.to_numeric, errors="coerce")
    if numbers["delta"].isna().any() or numbers["n_pairs"].isna().any():
        raise ReportError(f"{path}: columns delta and n_pairs must hold a number in every row")
    if "contexts" in table.columns:
        contexts = pd.to_numeric(table["contexts"], errors="coerce")
        if contexts.isna().any():
            raise ReportError(f"{path}: column contexts must hold a number in every row")
    elif len(table) > 1:
        raise ReportError(f"{path}: gates {len(table)} backbones without their contexts (written before the gate "
                          "recorded them): run the leaderboard again to decide them as one family")
    else:
        contexts = numbers["n_pairs"]  # one backbone: its interval does not depend on them
    rows = table[list(READ)].copy()
    rows["delta"], rows["delta_ci95"] = numbers["delta"], numbers["delta_ci95"]
    rows["n_pairs"], rows["contexts"] = numbers["n_pairs"].astype(int), contexts.astype(int)
    return decided_table(rows)
