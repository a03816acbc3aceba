"""The paper's findings, one row each, from the run records ``scripts/reproduce_paper.sh`` writes.

Each finding reads its experiment's outputs under ``<out>/`` (run directories as leaderboard entries,
:func:`cmbench.report.reading.load_runs`; the diagnosis's CSV; the curves' quality table) and returns a
:class:`Finding`: what CMBench measured with its 95% CIs (clustered by context; differences paired by
task and seed), the verdict by the finding's criterion (:data:`cmbench.paper.criteria.CRITERIA`, the one
place each criterion is stated) and the numbers that decided it. A finding whose outputs are absent says
so ("not run") instead of guessing.

Each reader returns a :class:`Reading`: what it measured and the claims its criterion makes (or a verdict that
no claim decides: not run, cannot be tested, the flat rule). The claims of every row of one table, in every
world it shows, are one family (:func:`decide_table`: the table's verdicts read Bonferroni-simultaneous
intervals, :mod:`cmbench.report.verdicts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from cmbench.methods.decoprune import DeCoPrune
from cmbench.paper.criteria import (
    BY_NUMBER,
    NOT_RUN,
    PAPER_PR,
    PROBE_STEPS,
    ROPE_VISIBLE,
    SELECTION_PR,
    SIMILAR_BELOW,
    UNTESTABLE,
    Criterion,
    flat,
)
from cmbench.paper.diagnose import verdict
from cmbench.report.comparisons import comparisons
from cmbench.report.gate import backbone_gate
from cmbench.report.leaderboard import leaderboard
from cmbench.report.reading import ReportError, RunRecords, load_runs
from cmbench.report.verdicts import (
    EQUIVALENT,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    LEAD,
    NONINFERIOR,
    Claim,
    Decided,
    combined,
    correction_text,
    decide,
)

MATCHED_PR = 0.005
"""Reverse is at DeCoPrune's PR when it was calibrated to a target within this of the PR DeCoPrune realised
(calibration runs on calibration contexts, so the realised PRs, both shown, differ a little more)."""
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
    decided : tuple of Decided
        Its claims as the table's family decided them (empty when no claim decides the row).
    """

    criterion: Criterion
    measured: str
    command: str
    verdict: str
    outcome: str
    decided: tuple[Decided, ...] = ()

    @property
    def number(self) -> int:
        return self.criterion.number


@dataclass(frozen=True)
class Reading:
    """What a finding's reader found in its experiment folder.

    Attributes
    ----------
    measured : str
        Scores and paired differences with their 95% CIs ("—" when nothing ran).
    claims : tuple of Claim
        The parts its criterion claims, decided with the table's family.
    verdict : str
        A verdict no claim decides (not run, cannot be tested, the flat rule); "" when the claims decide.
    note : str
        Why: the whole outcome for such a verdict, else what goes before the parts' tally.
    """

    measured: str
    claims: tuple[Claim, ...] = ()
    verdict: str = ""
    note: str = ""


Reader = Callable[[Path], Reading]
"""A finding's reader: its experiment folder -> what it found."""


def changes(d: float) -> str:
    """``with - without = d`` in words that agree with its sign: ``loses 0.0122 without`` when ``d`` is positive
    (the run without scores lower), ``gains 0.0122 without`` when negative."""
    return f"{'loses' if d >= 0 else 'gains'} {abs(d):.4f}"


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

    def claim(self, name: str, kind: str, a: RunRecords, b: RunRecords) -> Claim:
        """The ``kind`` claim on ``a`` minus ``b`` over the pairs both finished."""
        row = comparisons(self.runs, [(a.label, b.label)]).iloc[0]
        return Claim.of_interval(name, kind, float(row["delta"]), float(row["delta_ci95"]), int(row["contexts"]),
                                 int(row["n_pairs"]))


def realised_pr(runs: list[RunRecords], method: str) -> float | None:
    """The PR ``method`` realised at its default threshold (its run without a target PR), None if it did not run:
    the PR the selection ablation's Reverse is calibrated to."""
    run = _find(runs, lambda r: _field(r, "method") == method and _target(r) is None)
    return None if run is None else _Board(runs).score(run)[2]


def tally(parts: list[str]) -> str:
    counts = [f"{parts.count(v)} {v}" for v in (HOLDS, FAILS, INCONCLUSIVE) if parts.count(v)]
    return f"{len(parts)} part{'s' if len(parts) != 1 else ''}: " + ", ".join(counts)


def diagnose_finding(out: Path) -> Reading:
    found = sorted(out.glob("*/diagnose/*/diagnose.csv"))
    if not found:
        return Reading("—", verdict=NOT_RUN, note=f"no diagnosis under {out}/<data>/diagnose/")
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
    contexts = f"{rows['context_id'].nunique()} contexts; "
    if said == UNTESTABLE:
        return Reading(measured, verdict=UNTESTABLE, note=contexts + "no ground truth of what each chunk shows")
    return Reading(measured, tuple(c.claim for c in pairs), note=contexts)


def probe_step_finding(folder: Path) -> Reading:
    runs = entries(folder)
    if not runs:
        return Reading("—", verdict=NOT_RUN, note=f"no runs under {folder}")
    board = _Board(runs)
    points: dict[float, dict[int, RunRecords]] = {}
    for run in runs:
        target = _target(run)
        if target is not None:
            points.setdefault(round(target, 4), {})[int(_knob(run, "probe_step", 2))] = run
    claims, shown = [], []
    for target in sorted(points):
        steps = points[target]
        shown.append(f"PR {target:g}: " + ", ".join(board.shown(f"step {s}", steps[s]) for s in sorted(steps)))
        if target < SIMILAR_BELOW:
            for a in sorted(steps):
                for b in sorted(steps):
                    if a < b and {a, b} <= set(PROBE_STEPS):
                        what = f"step {a} − step {b} at PR {target:g}"
                        d, ci, n = board.paired(steps[a], steps[b])
                        shown.append(f"{what} {_ci(d, ci)} ({n} pairs)")
                        claims.append(board.claim(what, EQUIVALENT, steps[a], steps[b]))
    if not claims:
        return Reading("; ".join(shown) or "—", verdict=NOT_RUN,
                       note=f"no target below PR {SIMILAR_BELOW:g} ran with two of the probe steps "
                            f"{', '.join(map(str, PROBE_STEPS))}")
    return Reading("; ".join(shown), tuple(claims))


def selection_finding(folder: Path) -> Reading:
    runs = entries(folder)
    if not runs:
        return Reading("—", verdict=NOT_RUN, note=f"no runs under {folder}")
    board = _Board(runs)
    titles = {"decoprune": "DeCoPrune", "random": "Random", "decoprune_reverse": "Reverse"}

    def arm(method: str, target: Callable[[float | None], bool]) -> RunRecords | None:
        return _find(runs, lambda r: _field(r, "method") == method and target(_target(r)))

    matched = {m: arm(m, lambda t: t is not None and abs(t - SELECTION_PR) < 1e-6) for m in titles}
    shown = [board.shown(f"{titles[m]} @ PR {SELECTION_PR:g}", run) for m, run in matched.items() if run is not None]
    claims, missing = [], []
    for other in ("random", "decoprune_reverse"):
        a, b = matched["decoprune"], matched[other]
        what = f"DeCoPrune − {titles[other]} @ PR {SELECTION_PR:g}"
        if a is None or b is None:
            missing.append(what)
            continue
        d, ci, n = board.paired(a, b)
        shown.append(f"{what} {_ci(d, ci)} ({n} pairs)")
        claims.append(board.claim(what, LEAD, a, b))
    deco, random_ = arm("decoprune", lambda t: t is None), arm("random", lambda t: t is None)
    extra = [board.shown(title, run) for title, run in (("DeCoPrune at its default threshold", deco),
                                                        ("Random (its per-chunk counts)", random_)) if run is not None]
    reverse = None
    if deco is not None:
        deco_pr = board.score(deco)[2]
        reverse = _find(runs, lambda r: _field(r, "method") == "decoprune_reverse" and _target(r) is not None
                        and abs(float(_target(r)) - deco_pr) <= MATCHED_PR)  # type: ignore[arg-type]
    if reverse is not None:
        extra.append(board.shown("Reverse at DeCoPrune's PR", reverse))
    for b, what in ((random_, "DeCoPrune − Random"), (reverse, "DeCoPrune − Reverse at DeCoPrune's PR")):
        if deco is not None and b is not None:
            d, ci, n = board.paired(deco, b)
            extra.append(f"{what} {_ci(d, ci)} ({n} pairs)")
    default_reverse = arm("decoprune_reverse", lambda t: t is None)
    if default_reverse is not None:
        extra.append(board.shown("Reverse at its default threshold", default_reverse))
    measured = "; ".join(shown) + (f" (beside, the default-threshold run: {'; '.join(extra)})" if extra else "")
    if missing:
        return Reading(measured or "—", verdict=NOT_RUN, note="not run: " + ", ".join(missing))
    return Reading(measured, tuple(claims))


def rope_finding(folder: Path) -> Reading:
    runs = entries(folder)
    if not runs:
        return Reading("—", verdict=NOT_RUN, note=f"no runs under {folder}")
    board = _Board(runs)
    delta: dict[str, tuple[float, float, int]] = {}
    arms: dict[str, tuple[RunRecords, RunRecords]] = {}
    shown = []
    for method in ("fullkv", "streaming", "decoprune", "decoprune_hs", "random", "tempdiff"):
        on, off = (_labelled(runs, f"{method}-reindex_{arm}") for arm in (True, False))
        if on is not None and off is not None:
            arms[method] = (on, off)
            delta[method] = board.paired(on, off)
            shown.append(f"{method} {board.score(on)[0]:.4f} / {board.score(off)[0]:.4f} "
                         f"(with − without {_ci(*delta[method][:2])})")
    backbone = _field(runs[0], "backbone") or "this backbone"
    missing = [m for m in ("fullkv", "streaming") if m not in delta]
    if missing:
        return Reading("; ".join(shown) or "—", verdict=NOT_RUN,
                       note=f"not run with and without the re-index: {', '.join(missing)}")
    fd, n = delta["fullkv"][0], delta["fullkv"][2]
    if fd < ROPE_VISIBLE:
        return Reading("; ".join(shown), verdict=UNTESTABLE, note=(
            f"on {backbone}, FullKV {changes(fd)} without the re-index, less than the {ROPE_VISIBLE:g} a backbone "
            "must lose to show the effect: this backbone cannot show it (docs/tiny_model.md says why)"))
    claims = (board.claim("FullKV with − without the re-index", LEAD, *arms["fullkv"]),
              board.claim("Streaming with − without the re-index", EQUIVALENT, *arms["streaming"]))
    return Reading("; ".join(shown), claims, note=f"{backbone}, {n} pairs; ")


def short_context_finding(folder: Path) -> Reading:
    runs = entries(folder)
    if not runs:
        return Reading("—", verdict=NOT_RUN, note=f"no runs under {folder}")
    board = _Board(runs)
    at_pr = [r for r in runs if _target(r) is not None and abs(_target(r) - PAPER_PR) < 1e-6]  # type: ignore[operator]
    deco = _find(at_pr, lambda r: _field(r, "method") == "decoprune")
    full = _find(runs, lambda r: _field(r, "method") == "fullkv")
    shown = [board.shown("FullKV", full)] if full is not None else []
    shown += [board.shown(str(_field(r, "method")), r) for r in at_pr]
    if deco is None or full is None:
        return Reading("; ".join(shown) or "—", verdict=NOT_RUN,
                       note=f"FullKV and DeCoPrune calibrated to PR {PAPER_PR:g} are needed")
    d, ci, n = board.paired(deco, full)
    shown.append(f"DeCoPrune − FullKV {_ci(d, ci)} ({n} pairs)")
    beside = []
    for other in (r for r in at_pr if r is not deco):
        d, ci, n = board.paired(deco, other)
        beside.append(f"DeCoPrune − {_field(other, 'method')} {_ci(d, ci)} ({n} pairs)")
    measured = "; ".join(shown) + (f" (beside, whether DeCoPrune leads the others: {'; '.join(beside)})"
                                   if beside else "")
    return Reading(measured, (board.claim("DeCoPrune − FullKV", NONINFERIOR, deco, full),))


def gate_finding(folder: Path) -> Reading:
    runs = entries(folder)
    if not runs:
        return Reading("—", verdict=NOT_RUN, note=f"no runs under {folder}")
    gate = backbone_gate(runs)
    if gate.empty:
        return Reading("—", verdict=NOT_RUN, note="FullKV and the no-context control are both needed")
    measured = "; ".join(f"{r.backbone}: FullKV − no context {_ci(r.delta, r.delta_ci95)} ({r.n_pairs} pairs), "
                         f"gate {r.verdict}" for r in gate.itertuples())
    return Reading(measured, verdict=UNTESTABLE, note=f"needs {BY_NUMBER[6].needs}; the gate here only shows the "
                                                      "tiny backbone uses its context")


def quality_finding(folder: Path) -> Reading:
    tables = sorted(folder.glob("*/leaderboard/quality_vs_memory.csv"))
    if not tables:
        return Reading("—", verdict=NOT_RUN, note=f"no quality_vs_memory.csv under {folder}/<data>/leaderboard/")
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
        margin = float(BY_NUMBER[7].margin or 0)
        said = flat(float(memory["min_vs_fullkv"].min()), float(paper["min_vs_fullkv"].min()),
                    float(paper["max_vs_fullkv"].max()), margin)
        inside = (paper["min_vs_fullkv"] >= 1 - margin) & (paper["max_vs_fullkv"] <= 1 + margin)
        return Reading(measured, verdict=said,
                       note=f"outside the band: {', '.join(paper.loc[~inside, 'metric']) or 'none'}")
    measured += "; stand-in: " + span(stand_in, lambda m: m + (" (camera motion)" if m == "temporal_flickering" else ""))
    absent = [m for m in PAPER_QUALITY if m not in set(paper["metric"])]
    return Reading(measured, verdict=UNTESTABLE, note=f"the paper's {', '.join(absent)} are not measured here")


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


def read_all(out: Path, setup: str = "", extra_for: dict[int, str] | None = None
             ) -> list[tuple[Criterion, str, Reading]]:
    """Every finding's criterion, command and reading from the outputs under ``out`` (``setup``: overrides
    appended to each run command; ``extra_for``: more overrides for the findings whose numbers it names)."""
    rows = []
    for experiment in EXPERIMENTS:
        overrides = " ".join(o for o in (setup, (extra_for or {}).get(experiment.number, "")) if o.strip())
        command = "; ".join(c.replace("{o}", f" {overrides}" if overrides else "") for c in experiment.commands)
        try:
            reading = experiment.read(out / experiment.folder)
        except ReportError as err:  # e.g. a run still being written: the row says so, the table is still written
            reading = Reading("—", verdict=NOT_RUN, note=f"its outputs could not be read: {err}")
        rows.append((BY_NUMBER[experiment.number], command, reading))
    return rows


def decide_table(*worlds: list[tuple[Criterion, str, Reading]], names: tuple[str, ...] = ()) -> list[list[Finding]]:
    """The findings of every world the table shows, their claims decided as one family (every part of every row,
    in every world: :func:`cmbench.report.verdicts.decide`); ``names`` prefix each world's claims in the verdict
    CSV."""
    claims = [replace(claim, name=f"{names[w] if w < len(names) else ''}{c.number}. {claim.name}",
                      margin=claim.margin if claim.margin is not None else c.margin)
              for w, world in enumerate(worlds) for c, _, reading in world for claim in reading.claims]
    decided = iter(decide(claims))
    out = []
    for world in worlds:
        findings = []
        for criterion, command, reading in world:
            mine = tuple(next(decided) for _ in reading.claims)
            said = reading.verdict or combined(d.verdict for d in mine)
            outcome = reading.note if reading.verdict else reading.note + tally([d.verdict for d in mine])
            findings.append(Finding(criterion, reading.measured, command, said, outcome, mine))
        out.append(findings)
    return out


def collect(out: Path, setup: str = "", extra_for: dict[int, str] | None = None) -> list[Finding]:
    """Every finding from the outputs under ``out``, its table's claims decided as one family (:func:`read_all`,
    :func:`decide_table`)."""
    return decide_table(read_all(out, setup, extra_for))[0]


def verdict_rows(*worlds: list[Finding]) -> list[Decided]:
    """Every decided claim of the table, in its rows' order: the table's verdict CSV."""
    return [d for world in worlds for f in world for d in f.decided]


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


VERDICTS_NAME = "paper_findings_verdicts.csv"
"""The findings table's verdict CSV, written beside the table (``scripts/paper_findings.py``)."""


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
    worlds = [read_all(out, overrides, extra_for)] + ([read_all(second, overrides, extra_for)] if second else [])
    decided = decide_table(*worlds, names=("", f"[{second_name}] "))
    findings, again = decided[0], (decided[1] if second is not None else None)
    family = verdict_rows(*decided)
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
        "",
        f"Every claim the table decides, in {'both worlds' if second is not None else 'its world'}, is one family "
        f"(docs/verdicts.md): {correction_text(family)}; each claim's simultaneous interval, p and adjusted p are in "
        "the verdict CSV beside this table (`paper_findings_verdicts.csv`).",
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
