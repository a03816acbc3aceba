"""Each finding of the paper and the one criterion that decides it, as data.

The findings table (:mod:`cmbench.paper.findings`: its "Why" cell), ``diagnose``'s verdict and
docs/findings.md's criteria block are all generated from :data:`CRITERIA`; no other place states a
criterion. A criterion names the metric that decides it (the paper's own, or none: then the finding cannot
be tested here), what is compared and how it is paired, where (task set, target PR), and its rule.

Every claim a criterion makes is decided by the one verdict rule of :mod:`cmbench.report.verdicts` (its kind:
lead, equivalent, non-inferior or deficit; its margin; the simultaneous intervals of the table's family). The
findings table is one family: every part of every row it decides, in both worlds, is corrected together
(:func:`cmbench.paper.findings.decide_table`). A finding with several parts holds when every part holds, does not
hold when any part does not, and is inconclusive otherwise (:func:`cmbench.report.verdicts.combined`); a part without an interval (fewer
than two clusters) is inconclusive.

One rule is not a test of two entries: **flat** (:func:`flat`): quality stays within +-margin of FullKV's
(relative) at every point while the task score falls below ``1 - margin`` of FullKV's somewhere. Holds when both;
does not hold when the score falls and a quality metric leaves the band; inconclusive when the score never falls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cmbench.report.verdicts import (
    DEFICIT,
    EQUIVALENT,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    LEAD,
    MARGINS,
    NONINFERIOR,
    declared_margin,
    rule_text,
)

UNTESTABLE, NOT_RUN = "cannot be tested here", "not run"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, UNTESTABLE, NOT_RUN)
FLAT, NONE = "flat", "none"

DIAGNOSIS_MARGIN = 0.005
"""The deficit margin of the diagnosis (finding 1), whose differences are token MSEs, not task scores: a tenth of
the error of a new place's tokens at the probe step (0.06 in the committed diagnosis); a smaller gap is no evidence
that the cache holds what the chunk shows."""

MEMORY_SCORE = ("the task score, as the paper computes it: the target's best similarity over the continuation's "
                "frames, averaged over tasks (DINO after OWL-ViT and SAM 2 on CMBench; on MiniWorld the light scorer, "
                "the same protocol on light features)")


def flat(memory_low: float, quality_low: float, quality_high: float, margin: float) -> str:
    """Quality flat while memory falls, from the lowest memory ratio and the quality ratios' range (each
    relative to FullKV at the same point): see the module's rules."""
    if any(math.isnan(v) for v in (memory_low, quality_low, quality_high)):
        return INCONCLUSIVE
    if memory_low >= 1 - margin:
        return INCONCLUSIVE
    return HOLDS if 1 - margin <= quality_low and quality_high <= 1 + margin else FAILS


RULE_TEXT = {
    FLAT: "holds when the task score falls below {low:g} of FullKV's somewhere on the curves while every quality "
          "metric stays within +-{margin:.0%} of FullKV's at every point, does not hold when the score falls and a "
          "quality metric leaves that band, inconclusive when the score never falls",
    NONE: "no verdict is computed",
}
"""The rules that are not a claim of :mod:`cmbench.report.verdicts` (whose words :func:`rule_text` gives)."""


@dataclass(frozen=True)
class Criterion:
    """One finding and how it is decided.

    Attributes
    ----------
    number, name : int, str
        The finding's row and title.
    paper : str
        What the paper reports, in its words and numbers.
    metric : str
        The metric that decides it (the paper's own); for an untestable finding, the metric the paper uses and
        what it needs that this setup lacks.
    compared : str
        What is compared, paired how (each part of the claim).
    where : str
        The tasks and operating points.
    rule : str
        A claim kind of :mod:`cmbench.report.verdicts` (:data:`LEAD`, :data:`EQUIVALENT`, :data:`NONINFERIOR`,
        :data:`DEFICIT`), :data:`FLAT` or :data:`NONE` (not decided here).
    margin : float or None
        The rule's margin; None: the claim kind's (:data:`cmbench.report.verdicts.MARGINS`).
    beside : str
        What the row shows beside the verdict without deciding it ("" for nothing).
    needs : str
        What deciding it needs that the default setup lacks ("" for nothing): where it is missing, the
        row is "cannot be tested here" and says this.
    """

    number: int
    name: str
    paper: str
    metric: str
    compared: str
    where: str
    rule: str
    margin: float | None = None
    beside: str = ""
    needs: str = ""

    @property
    def the_margin(self) -> float:
        """The margin its claims declare: its own, else its kind's."""
        return declared_margin(self.rule, self.margin)

    def statement(self) -> str:
        """The criterion in one paragraph: the text of docs/findings.md and of the table's "Why" cell."""
        if self.rule in RULE_TEXT:
            rule = RULE_TEXT[self.rule].format(margin=self.margin, low=1 - (self.margin or 0))
        else:
            article = "an" if self.rule[0] in "aeiou" else "a"
            rule = f"{article} {self.rule} claim, margin {self.the_margin:g}: " + rule_text(self.rule, self.the_margin)
        text = f"Metric: {self.metric}. Compared: {self.compared}. Where: {self.where}. Verdict: {rule}."
        text += f" Cannot be tested without {self.needs}." if self.needs else ""
        return text + (f" Shown beside, not deciding: {self.beside}." if self.beside else "")


PAPER_PR = 0.5725
"""DeCoPrune's PR on the paper's short-context (10-s, LongLive) set."""
PROBE_STEPS = (1, 2, 3)
"""The paper's probe steps (zero-based): timesteps 957, 899, 702 of (999, 957, 899, 702)."""
SELECTION_PR = 0.85
"""The selection ablation's operating point: the paper's PR (85.43%, 85.31%, 85.39%), every method calibrated to it."""
SIMILAR_BELOW = 0.9
"""The probe-step curves are claimed similar at targets below this PR (apart only at aggressive pruning)."""
ROPE_VISIBLE = 0.10
"""The RoPE row is decided only on a backbone whose FullKV loses at least this much without the re-index."""

CRITERIA = (
    Criterion(
        1, "Denoising error with and without the relevant context",
        paper="the method's premise: \"Kept tokens carry evidence the retained context could not predict\" (the "
              "x0 prediction at the probe step is close to the final one where the retained context holds what "
              "the chunk shows)",
        metric="the x0 prediction's token MSE against the clean chunk at DeCoPrune's probe step (DeCoPrune's own "
               "score), under DeCoPrune's retained cache",
        compared="per context, the mean error of tokens whose place is still cached minus that of tokens whose "
                 "place was pruned, and minus that of new places (paired over contexts)",
        where="the context chunks of miniworld_diagnostic8 (8 contexts), the probe step of the method's config",
        rule=DEFICIT,
        margin=DIAGNOSIS_MARGIN),
    Criterion(
        2, "Probe-step ablation",
        paper="probe steps 1, 2, 3 (timesteps 957, 899, 702 of the schedule 999, 957, 899, 702) give similar "
              "score-vs-PR curves over a wide PR range, apart only at aggressive pruning",
        metric=MEMORY_SCORE,
        compared="DeCoPrune with the probe at steps 1, 2 and 3, each calibrated to the same target PR: every pair "
                 "of steps, paired by task and seed",
        where=f"miniworld_quick16 (16 tasks), targets below PR {SIMILAR_BELOW:g} (0.75 and 0.85; 0.9 is shown, "
              "not decided: that is where the paper sees the curves part)",
        rule=EQUIVALENT),
    Criterion(
        3, "Selection ablation",
        paper="DeCoPrune 0.6701 @ 85.43%; Random 0.6091 @ 85.31%; Reverse 0.5621 @ 18.79%; Reverse at matched PR "
              "0.4512 @ 85.39%",
        metric=MEMORY_SCORE,
        compared=f"DeCoPrune minus Random and minus Reverse, each calibrated to the paper's operating point, PR "
                 f"{SELECTION_PR:g} (the paper's 85.43%, 85.31% and 85.39%), paired by task and seed",
        where="miniworld_quick16 (16 tasks)",
        rule=LEAD,
        beside="the default-threshold run: DeCoPrune at its default threshold minus Random at its per-chunk counts "
               "and minus Reverse calibrated to the PR DeCoPrune reaches, and Reverse at its default threshold"),
    Criterion(
        4, "RoPE re-index ablation",
        paper="with / without the re-index (separate diagnostic set): FullKV 0.6804 / 0.4385; DeCoPrune-HS "
              "0.7156 / 0.6686; Random 0.6723 / 0.5515; TempDiff 0.6365 / 0.6019; Streaming 0.3994 / 0.4040",
        metric=MEMORY_SCORE,
        compared="each method with minus without the re-index, paired by task and seed: FullKV must lead (it loses "
                 "score without the re-index) and Streaming must be equivalent with and without it (an equivalent "
                 f"claim, margin {MARGINS[EQUIVALENT].value:g})",
        where=f"miniworld_diagnostic8 (8 tasks), on a backbone trained as the real models are (true-time positions "
              f"within a short window: backbone=tiny_short); decided only where FullKV loses at least "
              f"{ROPE_VISIBLE:g} without the re-index, else the backbone cannot show the effect and the row says why",
        rule=LEAD,
        beside="DeCoPrune and Random with and without the re-index"),
    Criterion(
        5, "Short contexts (LongLive, 18 tasks, 10 s)",
        paper="LongLive, 18 cases, 10-s contexts: FullKV 0.6106; DeCoPrune 0.5880 @ 57.25%",
        metric=MEMORY_SCORE,
        compared=f"DeCoPrune calibrated to the paper's PR ({PAPER_PR:.2%}) minus FullKV, paired by task and seed "
                 "(the Paper column's claim: DeCoPrune close to FullKV at that PR)",
        where="miniworld_short (18 tasks, 9.75-s contexts) with the tiny backbone (not LongLive)",
        rule=NONINFERIOR,
        beside="every other method calibrated to the same PR, and DeCoPrune minus each (whether DeCoPrune leads "
               "the other methods)"),
    Criterion(
        6, "Backbone gate",
        paper="FullKV: LingBot World v2 0.6803; Causal Forcing 0.2627, Self-Forcing 0.2609, LongLive 0.2608 "
              "(they cannot use minute-scale context)",
        metric=MEMORY_SCORE,
        compared="FullKV minus the no-context control (the sink only), paired by task and seed, per backbone",
        where="miniworld_diagnostic8 (8 tasks) on the tiny backbone",
        rule=NONE,
        beside="whether the tiny backbone passes the gate (FullKV clearly above no context)",
        needs="the backbones the finding is about (Causal Forcing, Self-Forcing, LongLive: their weights and GPUs)"),
    Criterion(
        7, "Quality vs memory",
        paper="Quality metrics (VBench temporal flickering, motion smoothness, aesthetic, image quality) stay flat "
              "across methods while DINO falls: quality metrics alone cannot pick a compression budget",
        metric="VBench's temporal flickering, motion smoothness, aesthetic quality and imaging quality of each "
               "continuation, relative to FullKV's at the same target PR, beside the task score relative to FullKV's",
        compared="each quality metric of each method at each target PR, and the task score, relative to FullKV's",
        where="score-vs-PR curves of DeCoPrune, Random, TempDiff and Streaming at PR 0.75, 0.85, 0.95 on "
              "miniworld_quick16",
        rule=FLAT,
        margin=0.10,
        beside="the CPU stand-ins (`*_light`: VBench's consistency formula on light features) and temporal "
               "flickering, labelled stand-in: VBench defines flickering for static video, and on MiniWorld's "
               "panning camera it measures the camera's motion",
        needs="the weights of motion smoothness (AMT), aesthetic quality (LAION's predictor on CLIP ViT-L/14) and "
              "imaging quality (MUSIQ), and a static camera for temporal flickering"),
)
"""The findings, in the table's order."""

BY_NUMBER = {c.number: c for c in CRITERIA}
