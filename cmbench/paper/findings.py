"""The paper's findings, one row each, from the run records ``scripts/reproduce_paper.sh`` writes.

Each finding reads its experiment's outputs under ``<out>/`` (run directories as leaderboard entries,
:func:`cmbench.report.reading.load_runs`; the diagnosis's CSV; the curves' quality table) and returns a
:class:`Finding`: what CMBench measured with its 95% CIs (clustered by context; differences paired by
task and seed), the verdict by the finding's criterion (:data:`cmbench.paper.criteria.CRITERIA`, the one
place each criterion is stated) and the numbers that decided it. A finding whose outputs are absent says
so ("not run") instead of guessing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cmbench.paper.criteria import (
    BY_NUMBER,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_RUN,
    PAPER_PR,
    PROBE_STEPS,
    ROPE_VISIBLE,
    SIMILAR_BELOW,
    UNTESTABLE,
    Criterion,
    combined,
    flat,
    lead,
    similar,
)
from cmbench.methods.decoprune import DeCoPrune
from cmbench.paper.diagnose import verdict
from cmbench.report.comparisons import comparisons
from cmbench.report.gate import backbone_gate
from cmbench.report.leaderboard import leaderboard
from cmbench.report.reading import ReportError, RunRecords, load_runs

MATCHED_PR = 0.005
"""Reverse is at DeCoPrune's PR when it was calibrated to a target within this of the PR DeCoPrune realised
(calibration runs on calibration contexts, so the realised PRs, both shown, differ a little more)."""
SUPPLEMENTARY_PR = 0.85
"""The selection ablation's supplementary comparison: every method calibrated to this PR."""
PAPER_QUALITY = ("temporal_flickering", "motion_smoothness", "aesthetic_quality", "imaging_quality")
"""The quality metrics the paper reports (VBench's names)."""


@dataclass(frozen=True)
class Finding:
    """One row of the findings table: the criterion's finding, what was measured and the verdict.

    Attributes
    ----------
    criterion : Criterion
    measured : str
        Scores and paired differences with their 95% CIs ("—" when nothing ran).
    command : str
        The command(s) that produce its outputs.
    verdict : str
        One of :data:`cmbench.paper.criteria.VERDICTS`.
    outcome : str
        Why this verdict, from the numbers (the criterion itself is stated once, beside the table).
    """

    criterion: Criterion
    measured: str
    command: str
    verdict: str
    outcome: str

    @property
    def number(self) -> int:
        return self.criterion.number


Reader = Callable[[Path], tuple[str, str, str]]
"""A finding's reader: its experiment folder -> (measured, verdict, outcome)."""


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


def _target(run: RunRecords) -> float | None:
    target = _field(run, "target_pr")
    return None if target is None else float(target)


def _find(runs: list[RunRecords], keep: Callable[[RunRecords], bool]) -> RunRecords | None:
    return next((r for r in runs if keep(r)), None)


def _labelled(runs: list[RunRecords], label: str) -> RunRecords | None:
    return next((r for r in runs if r.label == label), None)


class _Board:
    """One experiment's entries with their leaderboard rows, computed once."""

    def __init__(self, runs: list[RunRecords]):
        self.runs = runs
        self.rows = leaderboard(runs).set_index("method")

    def score(self, run: RunRecords) -> tuple[float, float, float]:
        """Score, its CI half-width and the realised PR of one entry."""
        row = self.rows.loc[run.label]
        return float(row["score"]), float(row["score_ci95"]), float(row["pr"])

    def shown(self, title: str, run: RunRecords) -> str:
        score, ci, pr = self.score(run)
        return f"{title} {_ci(score, ci)} @ {100 * pr:.1f}%"

    def paired(self, a: RunRecords, b: RunRecords) -> tuple[float, float, int]:
        """``a`` minus ``b``: mean paired difference, its CI half-width and the number of pairs."""
        row = comparisons(self.runs, [(a.label, b.label)]).iloc[0]
        return float(row["delta"]), float(row["delta_ci95"]), int(row["n_pairs"])


def realised_pr(runs: list[RunRecords], method: str) -> float | None:
    """The PR ``method`` realised at its default threshold (its run without a target PR), None if it did not run:
    the PR the selection ablation's Reverse is calibrated to."""
    run = _find(runs, lambda r: _field(r, "method") == method and _target(r) is None)
    return None if run is None else _Board(runs).score(run)[2]


def _tally(parts: list[str]) -> str:
    counts = [f"{parts.count(v)} {v}" for v in (HOLDS, FAILS, INCONCLUSIVE) if parts.count(v)]
    return f"{len(parts)} part{'s' if len(parts) != 1 else ''}: " + ", ".join(counts)


def diagnose_finding(out: Path) -> tuple[str, str, str]:
    found = sorted(out.glob("*/diagnose/*/diagnose.csv"))
    if not found:
        return "—", NOT_RUN, f"no diagnosis under {out}/<data>/diagnose/"
    rows = pd.read_csv(found[0])
    probe = DeCoPrune.probe_step
    said, pairs = verdict(rows, probe)
    at = rows[(rows["arm"] == "method") & (rows["step"] == probe)].groupby("group")["error"].mean()
    steep = rows[rows["arm"] == "method"].groupby(["group", "step"])["error"].mean().unstack()
    slope = {g: float(steep.loc[g].iloc[0] - steep.loc[g].iloc[-1]) for g in steep.index}
    measured = (f"token MSE at step {probe} under {found[0].parent.name}'s cache: "
                + ", ".join(f"{g} {at[g]:.4f}" for g in at.index) + "; "
                + "; ".join(f"{c.a} − {c.b} {_ci(c.difference, c.ci95)} ({c.contexts} contexts)" for c in pairs)
                + "; drop from step 0 to the last: " + ", ".join(f"{g} {v:.4f}" for g, v in slope.items()))
    return measured, said, f"{rows['context_id'].nunique()} contexts; " + _tally([c.verdict for c in pairs])


def probe_step_finding(folder: Path) -> tuple[str, str, str]:
    runs = entries(folder)
    if not runs:
        return "—", NOT_RUN, f"no runs under {folder}"
    board = _Board(runs)
    points: dict[float, dict[int, RunRecords]] = {}
    for run in runs:
        target = _target(run)
        if target is not None:
            points.setdefault(round(target, 4), {})[int(_knob(run, "probe_step", 2))] = run
    parts, shown = [], []
    for target in sorted(points):
        steps = points[target]
        shown.append(f"PR {target:g}: " + ", ".join(board.shown(f"step {s}", steps[s]) for s in sorted(steps)))
        if target < SIMILAR_BELOW:
            for a in sorted(steps):
                for b in sorted(steps):
                    if a < b and {a, b} <= set(PROBE_STEPS):
                        d, ci, n = board.paired(steps[a], steps[b])
                        shown.append(f"step {a} − step {b} at PR {target:g} {_ci(d, ci)} ({n} pairs)")
                        parts.append(similar(d, ci))
    if not parts:
        return "; ".join(shown) or "—", NOT_RUN, f"no target below PR {SIMILAR_BELOW:g} ran with two of the probe " \
                                                  f"steps {', '.join(map(str, PROBE_STEPS))}"
    return "; ".join(shown), combined(parts), _tally(parts)


def selection_finding(folder: Path) -> tuple[str, str, str]:
    runs = entries(folder)
    if not runs:
        return "—", NOT_RUN, f"no runs under {folder}"
    board = _Board(runs)

    def arm(method: str, target: Callable[[float | None], bool]) -> RunRecords | None:
        return _find(runs, lambda r: _field(r, "method") == method and target(_target(r)))

    deco, random_ = arm("decoprune", lambda t: t is None), arm("random", lambda t: t is None)
    shown = [board.shown(title, run) for title, run in (("DeCoPrune", deco), ("Random (its per-chunk counts)", random_))
             if run is not None]
    reverse = None
    if deco is not None:
        deco_pr = board.score(deco)[2]
        reverse = _find(runs, lambda r: _field(r, "method") == "decoprune_reverse" and _target(r) is not None
                        and abs(float(_target(r)) - deco_pr) <= MATCHED_PR)  # type: ignore[arg-type]
    if reverse is not None:
        shown.append(board.shown("Reverse at DeCoPrune's PR", reverse))
    parts, missing = [], []
    for a, b, what in ((deco, random_, "DeCoPrune − Random"), (deco, reverse, "DeCoPrune − Reverse at matched PR")):
        if a is None or b is None:
            missing.append(what)
            continue
        d, ci, n = board.paired(a, b)
        shown.append(f"{what} {_ci(d, ci)} ({n} pairs)")
        parts.append(lead(d, ci))
    beside = {m: arm(m, lambda t: t is not None and abs(t - SUPPLEMENTARY_PR) < 1e-6)
              for m in ("decoprune", "random", "decoprune_reverse")}
    default_reverse = arm("decoprune_reverse", lambda t: t is None)
    titles = {"decoprune": "DeCoPrune", "random": "Random", "decoprune_reverse": "Reverse"}
    extra = [board.shown(f"{titles[m]} @ PR {SUPPLEMENTARY_PR:g}", run) for m, run in beside.items() if run is not None]
    matched_deco = beside["decoprune"]
    for other in ("random", "decoprune_reverse"):
        matched_other = beside[other]
        if matched_deco is not None and matched_other is not None:
            d, ci, n = board.paired(matched_deco, matched_other)
            extra.append(f"DeCoPrune − {titles[other]} @ PR {SUPPLEMENTARY_PR:g} {_ci(d, ci)} ({n} pairs)")
    if default_reverse is not None:
        extra.append(board.shown("Reverse at its default threshold", default_reverse))
    measured = "; ".join(shown) + (f" (beside: {'; '.join(extra)})" if extra else "")
    if missing:
        return measured or "—", NOT_RUN, "not run: " + ", ".join(missing)
    return measured, combined(parts), _tally(parts)


def rope_finding(folder: Path) -> tuple[str, str, str]:
    runs = entries(folder)
    if not runs:
        return "—", NOT_RUN, f"no runs under {folder}"
    board = _Board(runs)
    delta: dict[str, tuple[float, float, int]] = {}
    shown = []
    for method in ("fullkv", "streaming", "decoprune", "decoprune_hs", "random", "tempdiff"):
        on, off = (_labelled(runs, f"{method}-reindex_{arm}") for arm in (True, False))
        if on is not None and off is not None:
            delta[method] = board.paired(on, off)
            shown.append(f"{method} {board.score(on)[0]:.4f} / {board.score(off)[0]:.4f} "
                         f"(with − without {_ci(*delta[method][:2])})")
    backbone = _field(runs[0], "backbone") or "this backbone"
    missing = [m for m in ("fullkv", "streaming") if m not in delta]
    if missing:
        return "; ".join(shown) or "—", NOT_RUN, f"not run with and without the re-index: {', '.join(missing)}"
    (fd, fci, n), (sd, sci, _) = delta["fullkv"], delta["streaming"]
    if fd < ROPE_VISIBLE:
        return "; ".join(shown), UNTESTABLE, (
            f"on {backbone}, FullKV loses {fd:.4f} without the re-index, less than the {ROPE_VISIBLE:g} a backbone "
            "must lose to show the effect: this backbone cannot show it (docs/tiny_model.md says why)")
    parts = [lead(fd, fci), similar(sd, sci)]
    return "; ".join(shown), combined(parts), f"{backbone}, {n} pairs; " + _tally(parts)


def short_context_finding(folder: Path) -> tuple[str, str, str]:
    runs = entries(folder)
    if not runs:
        return "—", NOT_RUN, f"no runs under {folder}"
    board = _Board(runs)
    at_pr = [r for r in runs if _target(r) is not None and abs(_target(r) - PAPER_PR) < 1e-6]  # type: ignore[operator]
    deco = _find(at_pr, lambda r: _field(r, "method") == "decoprune")
    full = _find(runs, lambda r: _field(r, "method") == "fullkv")
    shown = [board.shown("FullKV", full)] if full is not None else []
    shown += [board.shown(str(_field(r, "method")), r) for r in at_pr]
    others = [r for r in at_pr if r is not deco]
    if deco is None or not others:
        return "; ".join(shown) or "—", NOT_RUN, (f"DeCoPrune and at least one other method calibrated to PR "
                                                  f"{PAPER_PR:g} are needed")
    parts = []
    for other in others:
        d, ci, n = board.paired(deco, other)
        shown.append(f"DeCoPrune − {_field(other, 'method')} {_ci(d, ci)} ({n} pairs)")
        parts.append(lead(d, ci))
    if full is not None:
        d, ci, n = board.paired(deco, full)
        shown.append(f"beside: DeCoPrune − FullKV {_ci(d, ci)} ({n} pairs)")
    return "; ".join(shown), combined(parts), _tally(parts)


def gate_finding(folder: Path) -> tuple[str, str, str]:
    runs = entries(folder)
    if not runs:
        return "—", NOT_RUN, f"no runs under {folder}"
    gate = backbone_gate(runs)
    if gate.empty:
        return "—", NOT_RUN, "FullKV and the no-context control are both needed"
    measured = "; ".join(f"{r.backbone}: FullKV − no context {_ci(r.delta, r.delta_ci95)} ({r.n_pairs} pairs), "
                         f"gate {'passes' if r.passes else 'fails'}" for r in gate.itertuples())
    return measured, UNTESTABLE, f"needs {BY_NUMBER[6].needs}; the gate here only shows the tiny backbone uses " \
                                 "its context"


def quality_finding(folder: Path) -> tuple[str, str, str]:
    tables = sorted(folder.glob("*/leaderboard/quality_vs_memory.csv"))
    if not tables:
        return "—", NOT_RUN, f"no quality_vs_memory.csv under {folder}/<data>/leaderboard/"
    table = pd.read_csv(tables[0])
    memory = table[table["kind"] == "memory"]
    quality = table[table["kind"] == "quality"]
    paper = quality[quality["metric"].isin(PAPER_QUALITY)]
    stand_in = quality[~quality["metric"].isin(PAPER_QUALITY) | (quality["metric"] == "temporal_flickering")]

    def span(rows: pd.DataFrame, label: Callable[[str], str]) -> str:
        return "; ".join(f"{label(r.metric)} {r.min_vs_fullkv:.3f}–{r.max_vs_fullkv:.3f}" for r in rows.itertuples())

    measured = "relative to FullKV over PR {:g}–{:g}: memory: {}".format(
        table["pr_low"].min(), table["pr_high"].max(), span(memory, str))
    if set(paper["metric"]) == set(PAPER_QUALITY) and not memory.empty:
        measured += "; " + span(paper, str)
        margin = BY_NUMBER[7].margin
        said = flat(float(memory["min_vs_fullkv"].min()), float(paper["min_vs_fullkv"].min()),
                    float(paper["max_vs_fullkv"].max()), margin)
        inside = (paper["min_vs_fullkv"] >= 1 - margin) & (paper["max_vs_fullkv"] <= 1 + margin)
        return measured, said, f"outside the band: {', '.join(paper.loc[~inside, 'metric']) or 'none'}"
    measured += "; stand-in: " + span(stand_in, lambda m: m + (" (camera motion)" if m == "temporal_flickering" else ""))
    absent = [m for m in PAPER_QUALITY if m not in set(paper["metric"])]
    return measured, UNTESTABLE, f"the paper's {', '.join(absent)} are not measured here"


@dataclass(frozen=True)
class Experiment:
    """How one finding is produced and read: its reader, its folder under ``<out>`` and its commands."""

    number: int
    read: Reader
    folder: str
    commands: tuple[str, ...]


EXPERIMENTS = (
    Experiment(1, diagnose_finding, "", ("python -m cmbench diagnose experiment=paper_diagnose{o}",)),
    Experiment(2, probe_step_finding, "probe_step", ("python -m cmbench run -m experiment=paper_probe_step{o}",)),
    Experiment(3, selection_finding, "selection", (
        "python -m cmbench run -m experiment=paper_selection{o}",
        "python -m cmbench run experiment=paper_selection method=decoprune_reverse method.target_pr=<DeCoPrune's PR>{o}")),
    Experiment(4, rope_finding, "rope", ("python -m cmbench run -m experiment=paper_rope{o}",)),
    Experiment(5, short_context_finding, "short", (
        "python -m cmbench run experiment=paper_short_context method=fullkv{o}",
        "python -m cmbench run -m experiment=paper_short_context{o}")),
    Experiment(6, gate_finding, "gate", (
        "python -m cmbench run experiment=paper_backbone_gate method=fullkv{o}",
        "python -m cmbench run experiment=paper_backbone_gate method=streaming method.recent_chunks=0 label=sink_only{o}",
        "python -m cmbench leaderboard")),
    Experiment(7, quality_finding, "quality", ("python -m cmbench curves experiment=paper_quality_memory{o}",)),
)
"""Each finding's reader, folder under ``<out>`` and commands (``{o}``: the overrides it ran with)."""


def collect(out: Path, setup: str = "", extra_for: dict[int, str] | None = None) -> list[Finding]:
    """Every finding from the outputs under ``out`` (``setup``: overrides appended to each run command;
    ``extra_for``: more overrides for the findings whose numbers it names, as they were run)."""
    rows = []
    for experiment in EXPERIMENTS:
        overrides = " ".join(o for o in (setup, (extra_for or {}).get(experiment.number, "")) if o.strip())
        command = "; ".join(c.replace("{o}", f" {overrides}" if overrides else "") for c in experiment.commands)
        try:
            measured, said, outcome = experiment.read(out / experiment.folder)
        except ReportError as err:  # e.g. a run still being written: the row says so, the table is still written
            measured, said, outcome = "—", NOT_RUN, f"its outputs could not be read: {err}"
        rows.append(Finding(BY_NUMBER[experiment.number], measured, command, said, outcome))
    return rows


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


TABLE_HEADER = ("| # | Finding | Paper | CMBench (95% CI) | Command | Verdict | Second world | Why |",
                "|---|---|---|---|---|---|---|---|")


def criteria_section(level: str = "##") -> str:
    """Every criterion, stated once: the text below the findings table and in docs/findings.md."""
    lines = [f"{level} Criteria", ""]
    for c in BY_NUMBER.values():
        lines += [f"**{c.number}. {c.name}.** {c.statement()}", ""]
    return "\n".join(lines)


def markdown(findings: list[Finding], *, title: str, preamble: str,
             second: list[Finding] | None = None, second_name: str = "") -> str:
    """The findings table with its preamble and the criteria section; ``second``: the same findings in a
    second world (its verdict and deciding numbers in their own column)."""
    other = {f.number: f for f in second or []}
    lines = [f"# {title}", "", preamble.strip(), "", *TABLE_HEADER]
    for f in findings:
        again = other.get(f.number)
        second_cell = "—" if again is None else f"**{again.verdict}**: {again.outcome}" + (
            f" ({second_name})" if second_name else "")
        lines.append(f"| {f.number} | {_cell(f.criterion.name)} | {_cell(f.criterion.paper)} | {_cell(f.measured)} | "
                     f"`{_cell(f.command)}` | **{f.verdict}** | {_cell(second_cell)} | {_cell(f.outcome)} "
                     f"(criterion {f.number} below) |")
    return "\n".join(lines) + "\n\n" + criteria_section() + "\n"


GPU = ("The GPU reproduction is `bash scripts/reproduce_paper.sh --setup \"data=cmbench backbone=lingbot_world_v2_14b "
       "scorer=owl_sam_dino\"` (every command with those overrides); it has not been run here.")


def page(out: Path, *, second: Path | None = None, second_name: str = "world_seed 2", setup: str = "",
         extra: str = "", extra_for: dict[int, str] | None = None,
         note: str = "") -> tuple[str, list[Finding], list[Finding] | None]:
    """The findings page (results/paper_findings.md) rebuilt from the outputs under ``out`` (and ``second``,
    the second world's column), with the findings of both worlds (None: no second world).

    ``setup`` and ``extra`` are the overrides every command ran with (``extra``: a quicker look, e.g.
    ``limit=2``); ``extra_for`` more overrides per finding number; ``note`` one sentence on what the run is.
    The paths are written as given: pass them relative to the repository for the committed page.
    """
    extra_for = extra_for or {}
    overrides = " ".join(s for s in (setup, extra) if s.strip())
    findings = collect(out, overrides, extra_for)
    again = collect(second, overrides, extra_for) if second is not None else None
    preamble = "\n".join([
        f"Generated by `python scripts/paper_findings.py` from the run records under `{out}`"
        + (f" and, for the second-world column, `{second}` ({second_name})" if second is not None else "")
        + f". Setup: {setup.strip() or 'MiniWorld, tiny backbone, light scorer (the defaults)'}"
        + (f"; extra overrides: `{extra.strip()}`" if extra.strip() else "")
        + "".join(f"; finding {n} also `{o.strip()}`" for n, o in sorted(extra_for.items()) if o.strip()) + ".",
        "",
        *([f"**{note.strip()}**", ""] if note.strip() else []),
        "Scores on MiniWorld are the light scorer's (not DINO); CIs are 95%, clustered by context; differences are "
        "paired by task and seed. Each finding's criterion (its metric, what is compared, where, and when it holds, "
        "does not hold or is inconclusive) is stated once, below the table; \"cannot be tested here\": the "
        "criterion needs what this setup lacks (the row says what, and shows what was measured); \"not run\": "
        "its outputs are absent. " + GPU,
    ])
    text = markdown(findings, title="The paper's findings on CMBench", preamble=preamble, second=again,
                    second_name=second_name if second is not None else "")
    return text, findings, again


def summary_lines(findings: list[Finding], second: list[Finding] | None = None) -> str:
    """One line per finding for the README: its verdict (and the second world's) and why, as in the table."""
    other = {f.number: f for f in second or []}
    lines = []
    for f in findings:
        again = other.get(f.number)
        also = f"; second world: **{again.verdict}**" if again is not None else ""
        lines.append(f"{f.number}. {f.criterion.name}: **{f.verdict}**{also}. {f.outcome}.")
    return "\n".join(lines)
