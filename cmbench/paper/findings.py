"""The paper's findings, one row each, from the folders ``scripts/reproduce_paper.sh`` writes.

Each finding reads its experiment's outputs under ``<out>/`` (run directories as leaderboard entries,
:func:`cmbench.report.reading.load_runs`; the diagnosis's CSV; the curves' quality table) and returns a
:class:`Finding`: the paper's number, CMBench's with its 95% CI (clustered by context; differences
paired by task and seed), the command, and whether it holds, with the criterion applied. A finding
whose outputs are absent says so ("not run") instead of guessing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cmbench.paper.diagnose import verdict
from cmbench.report.gate import backbone_gate
from cmbench.report.leaderboard import comparisons, leaderboard
from cmbench.report.reading import ReportError, RunRecords, load_runs

HOLDS, FAILS, UNTESTABLE, NOT_RUN = "holds", "does not hold", "cannot be tested on this setup", "not run"
INCONCLUSIVE = "inconclusive"  # the CI neither shows the finding nor rules it out (too few tasks)
SIMILAR = 0.05  # a "meaningful" score difference; two scores are "close" when their paired CI stays within it
FLAT = 0.10  # quality is "flat" when it stays within this fraction of FullKV's


@dataclass(frozen=True)
class Finding:
    """One row of the findings table."""

    number: int
    name: str
    paper: str
    measured: str
    command: str
    status: str
    reason: str


def _ci(mean: float, half: float, digits: int = 4) -> str:
    if math.isnan(mean):
        return "—"
    return f"{mean:.{digits}f}" + ("" if math.isnan(half) else f" ± {half:.{digits}f}")


def run_dirs(folder: Path) -> list[Path]:
    """Run directories (folders with records) under ``folder/<data>/``."""
    return sorted(p for p in folder.glob("*/*") if p.is_dir() and any(p.glob("records*.jsonl")))


def entries(folder: Path) -> list[RunRecords]:
    """The leaderboard entries of one experiment's runs (empty when it did not run)."""
    dirs = run_dirs(folder)
    return load_runs(dirs) if dirs else []


def _field(run: RunRecords, name: str) -> Any:
    values = run.frame[name].dropna() if name in run.frame else pd.Series(dtype=object)
    return values.iloc[0] if len(values) else None


def _knob(run: RunRecords, name: str, default: Any) -> Any:
    config = _field(run, "method_config")
    return config.get(name, default) if isinstance(config, dict) else default


def _find(runs: list[RunRecords], keep: Callable[[RunRecords], bool]) -> RunRecords | None:
    return next((r for r in runs if keep(r)), None)


def _labelled(runs: list[RunRecords], prefix: str) -> RunRecords | None:
    return next((r for r in runs if r.label.startswith(prefix)), None)


def _score(runs: list[RunRecords], run: RunRecords) -> tuple[float, float, float]:
    """Score, its CI half-width and the realised PR of one entry."""
    row = leaderboard(runs).set_index("method").loc[run.label]
    return float(row["score"]), float(row["score_ci95"]), float(row["pr"])


def _paired(runs: list[RunRecords], a: RunRecords, b: RunRecords) -> tuple[float, float, int]:
    row = comparisons(runs, [(a.label, b.label)]).iloc[0]
    return float(row["delta"]), float(row["delta_ci95"]), int(row["n_pairs"])


def above(d: float, ci: float) -> str:
    """A claimed positive difference: shown (CI above 0), ruled out (CI below :data:`SIMILAR`), or neither."""
    if math.isnan(ci):
        return INCONCLUSIVE
    return HOLDS if d - ci > 0 else FAILS if d + ci < SIMILAR else INCONCLUSIVE


def close(d: float, ci: float) -> str:
    """A claimed absence of difference: shown (CI within +-:data:`SIMILAR`), ruled out (CI outside it), or neither."""
    if math.isnan(ci):
        return INCONCLUSIVE
    return HOLDS if abs(d) + ci <= SIMILAR else FAILS if abs(d) - ci > SIMILAR else INCONCLUSIVE


def combined(statuses: list[str]) -> str:
    """Every part holds: holds; some part fails: does not hold; else inconclusive."""
    return FAILS if FAILS in statuses else HOLDS if statuses and all(x == HOLDS for x in statuses) else INCONCLUSIVE


def _not_run(number: int, name: str, paper: str, command: str, what: str) -> Finding:
    return Finding(number, name, paper, "—", command, NOT_RUN, f"no outputs of this finding under {what}")


def diagnose_finding(out: Path, command: str) -> Finding:
    name, paper = "Denoising error with and without the relevant context", (
        "qualitative (four backbones): the probe error is low and flat when the retained context holds what "
        "the chunk shows, high and steep when it does not")
    found = sorted(out.glob("*/diagnose/*/diagnose.csv"))
    if not found:
        return _not_run(1, name, paper, command, f"{out}/<data>/diagnose/")
    rows = pd.read_csv(found[0])
    probe = 2
    said, comparisons_ = verdict(rows, probe)
    at = rows[(rows["arm"] == "method") & (rows["step"] == probe)].groupby("group")["error"].mean()
    steep = rows[rows["arm"] == "method"].groupby(["group", "step"])["error"].mean().unstack()
    slope = {g: float(steep.loc[g].iloc[0] - steep.loc[g].iloc[-1]) for g in steep.index}
    measured = (f"token MSE at step {probe} under DeCoPrune's cache: "
                + ", ".join(f"{g} {at[g]:.4f}" for g in at.index) + "; "
                + "; ".join(f"{c.a} − {c.b} {_ci(c.difference, c.ci95)} ({c.contexts} contexts)" for c in comparisons_)
                + "; drop from step 0 to the last: " + ", ".join(f"{g} {v:.4f}" for g, v in slope.items()))
    contexts = rows["context_id"].nunique()
    status = {"holds": HOLDS, "does not hold": FAILS}.get(said, UNTESTABLE if said.startswith("cannot") else INCONCLUSIVE)
    reason = (f"{said}: criterion: the error of still-cached places is below that of pruned and of new places "
              f"(paired over contexts, 95% CI below 0) at the probe step; {contexts} contexts, "
              f"{found[0].parent.name}'s cache")
    return Finding(1, name, paper, measured, command, status, reason)


def probe_step_finding(folder: Path, command: str) -> Finding:
    name, paper = "Probe-step ablation", ("score-vs-PR curves of probe steps 1, 2, 3 similar over a wide PR range, "
                                          "apart only at aggressive pruning")
    runs = entries(folder)
    if not runs:
        return _not_run(2, name, paper, command, str(folder))
    points: dict[float, dict[int, RunRecords]] = {}
    for run in runs:
        target = _field(run, "target_pr")
        if target is not None:
            points.setdefault(round(float(target), 4), {})[int(_knob(run, "probe_step", 2))] = run
    parts, similar = [], []
    for target in sorted(points):
        steps = points[target]
        parts.append(f"PR {target:g}: " + ", ".join(
            f"step {s} {_ci(*_score(runs, steps[s])[:2])} @ {100 * _score(runs, steps[s])[2]:.1f}%" for s in sorted(steps)))
        if target < 0.9:
            for a in sorted(steps):
                for b in sorted(steps):
                    if a < b:
                        d, ci, _ = _paired(runs, steps[a], steps[b])
                        similar.append(close(d, ci))
    if not similar:
        return Finding(2, name, paper, "; ".join(parts), command, UNTESTABLE,
                       "no target below PR 0.9 with two probe steps ran")
    status = combined(similar)
    reason = ("criterion: at targets below PR 0.9, every pair of probe steps' paired score difference has a 95% CI "
              f"within +-{SIMILAR} ({similar.count(HOLDS)} of {len(similar)} pairs are, {similar.count(FAILS)} outside); CMBench's steps are zero-based and the "
              "last step (702) is the final x0, so the paper's 1, 2, 3 run as 0, 1, 2")
    return Finding(2, name, paper, "; ".join(parts), command, status, reason)


def selection_finding(folder: Path, command: str) -> Finding:
    name, paper = "Selection ablation", ("DeCoPrune 0.6701 @ 85.43%; Random 0.6091 @ 85.31%; Reverse 0.5621 @ 18.79%; "
                                         "Reverse at matched PR 0.4512 @ 85.39%")
    runs = entries(folder)
    if not runs:
        return _not_run(3, name, paper, command, str(folder))

    def arm(method: str, matched: bool) -> RunRecords | None:
        return _find(runs, lambda r: _field(r, "method") == method and (_field(r, "target_pr") is not None) == matched)

    shown = []
    for method, title in (("decoprune", "DeCoPrune"), ("random", "Random"), ("decoprune_reverse", "Reverse")):
        for matched in (False, True):
            run = arm(method, matched)
            if run is not None:
                score, ci, pr = _score(runs, run)
                shown.append(f"{title}{' @ PR 0.85' if matched else ''} {_ci(score, ci)} @ {100 * pr:.1f}%")
    deco, random_, deco_matched, reverse_matched = (arm("decoprune", False), arm("random", False),
                                                    arm("decoprune", True), arm("decoprune_reverse", True))
    checks, missing = [], []
    for a, b, what in ((deco, random_, "DeCoPrune − Random (its per-chunk counts, default threshold)"),
                       (deco_matched, reverse_matched, "DeCoPrune − Reverse at PR 0.85")):
        if a is None or b is None:
            missing.append(what)
            continue
        d, ci, n = _paired(runs, a, b)
        shown.append(f"{what} {_ci(d, ci)} ({n} pairs)")
        checks.append(above(d, ci))
    criterion = ("criterion: DeCoPrune's paired score is above Random's at the same per-chunk counts and above "
                 f"Reverse's at the same PR (95% CIs above 0; ruled out when a CI lies below {SIMILAR})")
    if combined(checks) == FAILS or not missing:
        return Finding(3, name, paper, "; ".join(shown), command, combined(checks), criterion)
    return Finding(3, name, paper, "; ".join(shown) or "—", command, UNTESTABLE,
                   f"{criterion}; not run here: {', '.join(missing)}")


def rope_finding(folder: Path, command: str) -> Finding:
    name, paper = "RoPE re-index ablation", ("with / without: FullKV 0.6804 / 0.4385; DeCoPrune-HS 0.7156 / 0.6686; "
                                             "Random 0.6723 / 0.5515; TempDiff 0.6365 / 0.6019; Streaming 0.3994 / 0.4040")
    runs = entries(folder)
    if not runs:
        return _not_run(4, name, paper, command, str(folder))
    delta: dict[str, tuple[float, float, int]] = {}
    shown = []
    for method in ("fullkv", "decoprune_hs", "random", "tempdiff", "streaming"):
        on, off = (_labelled(runs, f"{method}-reindex_{arm}") for arm in (True, False))
        if on is not None and off is not None:
            delta[method] = _paired(runs, on, off)
            shown.append(f"{method} {_score(runs, on)[0]:.4f} / {_score(runs, off)[0]:.4f} "
                         f"(Δ {_ci(*delta[method][:2])})")
    if "fullkv" not in delta or "streaming" not in delta:
        return Finding(4, name, paper, "; ".join(shown) or "—", command, UNTESTABLE,
                       "FullKV and Streaming each need both arms")
    (fd, fci, _), (sd, sci, _) = delta["fullkv"], delta["streaming"]
    return Finding(4, name, paper, "; ".join(shown), command, combined([above(fd, fci), close(sd, sci)]),
                   "criterion: FullKV loses score without the re-index (paired Δ's 95% CI above 0; ruled out below "
                   f"{SIMILAR}) while Streaming does not change (CI within +-{SIMILAR}); {delta['fullkv'][2]} pairs")


def short_context_finding(folder: Path, command: str) -> Finding:
    name, paper = "Short contexts (LongLive, 18 tasks, 10 s)", "FullKV 0.6106; DeCoPrune 0.5880 @ 57.25% PR"
    runs = entries(folder)
    if not runs:
        return _not_run(5, name, paper, command, str(folder))
    full = _find(runs, lambda r: _field(r, "method") == "fullkv")
    deco = _find(runs, lambda r: _field(r, "method") == "decoprune")
    if full is None or deco is None:
        return Finding(5, name, paper, "—", command, UNTESTABLE, "FullKV and DeCoPrune are both needed")
    (fs, fci, _), (ds, dci, dpr) = _score(runs, full), _score(runs, deco)
    d, ci, n = _paired(runs, deco, full)
    measured = f"FullKV {_ci(fs, fci)}; DeCoPrune {_ci(ds, dci)} @ {100 * dpr:.1f}%; DeCoPrune − FullKV {_ci(d, ci)} ({n} pairs)"
    status = INCONCLUSIVE if math.isnan(ci) else HOLDS if d - ci >= -SIMILAR else FAILS if d + ci < -SIMILAR \
        else INCONCLUSIVE
    return Finding(5, name, paper, measured, command, status,
                   f"criterion: DeCoPrune stays within {SIMILAR} of FullKV (the paired CI's lower end >= -{SIMILAR}, "
                   f"ruled out when its upper end is below -{SIMILAR}; "
                   "the paper: -0.023); MiniWorld's default contexts are 12 s, so this suite is short in seconds, "
                   "not relative to the default one, and the backbone is the tiny model, not LongLive")


def gate_finding(folder: Path, command: str) -> Finding:
    name, paper = "Backbone gate", ("FullKV: LingBot World v2 0.6803; Self-Forcing 0.2609, Causal Forcing 0.2627, "
                                    "LongLive 0.2608 (they cannot use minute-scale context)")
    runs = entries(folder)
    if not runs:
        return _not_run(6, name, paper, command, str(folder))
    gate = backbone_gate(runs)
    if gate.empty:
        return Finding(6, name, paper, "—", command, UNTESTABLE, "FullKV and the no-context control are both needed")
    measured = "; ".join(f"{r.backbone}: FullKV − no context {_ci(r.delta, r.delta_ci95)} ({r.n_pairs} pairs), "
                         f"gate {'passes' if r.passes else 'fails'}" for r in gate.itertuples())
    return Finding(6, name, paper, measured, command, UNTESTABLE,
                   "the finding is about the three short-context backbones, which need GPUs; on this setup the gate "
                   "checks only that the backbone here uses its context (run the same commands with backbone=... "
                   "for another)")


def quality_finding(folder: Path, command: str) -> Finding:
    name, paper = "Quality vs memory", ("VBench quality (flickering, smoothness, aesthetic, imaging) stays flat across "
                                        "methods while DINO falls")
    tables = sorted(folder.glob("*/leaderboard/quality_vs_memory.csv"))
    if not tables:
        return _not_run(7, name, paper, command, f"{folder}/<data>/leaderboard/")
    table = pd.read_csv(tables[0])
    memory = table[table["kind"] == "memory"]
    quality = table[table["kind"] == "quality"]
    measured = "relative to FullKV over PR {:g}–{:g}: ".format(table["pr_low"].min(), table["pr_high"].max()) + "; ".join(
        f"{r.metric} {r.min_vs_fullkv:.3f}–{r.max_vs_fullkv:.3f}" for r in table.itertuples())
    if memory.empty or quality.empty:
        return Finding(7, name, paper, measured, command, UNTESTABLE, "the curves carry no quality columns")
    falls = float(memory["min_vs_fullkv"].min()) < 1 - FLAT
    within = (quality["min_vs_fullkv"] >= 1 - FLAT) & (quality["max_vs_fullkv"] <= 1 + FLAT)
    moved = ", ".join(quality.loc[~within, "metric"])
    return Finding(7, name, paper, measured, command, HOLDS if falls and bool(within.all()) else FAILS,
                   f"criterion: memory falls below {1 - FLAT:g} of FullKV somewhere on the curves while every quality "
                   f"metric stays within {FLAT:.0%} of FullKV's at every point (CPU stand-ins `*_light` on MiniWorld); "
                   f"memory {'falls' if falls else 'does not fall'}; outside the band: {moved or 'none'}")


FINDINGS = (
    (diagnose_finding, "", "python -m cmbench diagnose experiment=paper_diagnose"),
    (probe_step_finding, "probe_step", "python -m cmbench run -m experiment=paper_probe_step"),
    (selection_finding, "selection", "python -m cmbench run -m experiment=paper_selection"),
    (rope_finding, "rope", "python -m cmbench run -m experiment=paper_rope"),
    (short_context_finding, "short", "python -m cmbench run -m experiment=paper_short_context"),
    (gate_finding, "gate", "python -m cmbench run experiment=paper_backbone_gate method=fullkv{o}; python -m cmbench run "
                           "experiment=paper_backbone_gate method=streaming method.recent_chunks=0 label=sink_only{o}; "
                           "python -m cmbench leaderboard"),
    (quality_finding, "quality", "python -m cmbench curves experiment=paper_quality_memory"),
)
"""Each finding's reader, its folder under ``<out>`` and its command (the overrides it ran with go where
``{o}`` stands, else at the end)."""


def collect(out: Path, setup: str = "", extra_for: dict[int, str] | None = None) -> list[Finding]:
    """Every finding from the outputs under ``out`` (``setup``: overrides appended to each command;
    ``extra_for``: more overrides for the findings whose numbers it names, as they were run)."""
    rows = []
    for number, (read, folder, command) in enumerate(FINDINGS, start=1):
        overrides = " ".join(o for o in (setup, (extra_for or {}).get(number, "")) if o.strip())
        tail = f" {overrides}" if overrides else ""
        command = command.replace("{o}", tail) if "{o}" in command else command + tail
        try:
            rows.append(read(out / folder, command))
        except ReportError as err:  # e.g. a run still being written: the row says so, the table is still written
            rows.append(Finding(number, read.__name__.removesuffix("_finding").replace("_", " "), "—", "—",
                                command, NOT_RUN, f"its outputs could not be read: {err}"))
    return rows


def markdown(findings: list[Finding], *, title: str, preamble: str) -> str:
    """The findings table with its preamble."""
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = [f"# {title}", "", preamble.strip(), "",
             "| # | Finding | Paper | CMBench (95% CI) | Command | Verdict | Why |", "|---|---|---|---|---|---|---|"]
    for f in findings:
        lines.append(f"| {f.number} | {cell(f.name)} | {cell(f.paper)} | {cell(f.measured)} | `{cell(f.command)}` | "
                     f"**{f.status}** | {cell(f.reason)} |")
    return "\n".join(lines) + "\n"
