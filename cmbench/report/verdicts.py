"""The one rule that decides every verdict CMBench prints (docs/verdicts.md states it for readers).

A **claim** compares two entries on paired differences ``d = a - b`` (task scores, paired by task and seed;
contexts are the clusters, :mod:`cmbench.report.statistics`) and declares its kind:

- :data:`LEAD` (``a`` leads ``b``): holds when the interval lies above 0; does not hold when it lies below
  ``+margin`` (whatever lead there is, it is smaller than meaningful); inconclusive otherwise;
- :data:`EQUIVALENT` (``a`` level with ``b`` within ``+-margin``, the two one-sided tests read as an interval):
  holds when the interval lies within ``+-margin``; does not hold when it lies wholly outside; inconclusive
  otherwise. An interval that includes 0 but reaches past the margin is *inconclusive*: absence of evidence
  of a difference is never "level";
- :data:`NONINFERIOR` (``a`` not worse than ``b`` by more than ``margin``): holds when the interval lies above
  ``-margin``; does not hold when it lies below ``-margin``; inconclusive otherwise;
- :data:`DEFICIT` (``a`` below ``b``): holds when the interval lies below 0; does not hold when it lies above
  ``-margin`` (whatever deficit there is, it is smaller than meaningful); inconclusive otherwise.

Each kind's margin is stated once, with why, in :data:`MARGINS`; a claim may declare another (a quantity
that is not a task score) but never none, and a margin lies in (0, 1).

**One family per table.** The claims one table or board prints are decided together (:func:`decide`):
with ``m`` claims, each interval is the Bonferroni-simultaneous one, ``estimate +- t_{1 - 0.05 / (2m), G - 1}
* se`` (level ``1 - 0.05 / m``), so that every interval of the family covers its true difference together
with probability at least 95% whatever the dependence between them (they share FullKV and the contexts).
Bonferroni rather than Holm: each verdict reads its interval both ways (holds, does not hold), and Holm's
step-down adjusts the p-value of one null per claim and gives no interval to read the other way. The
adjusted p-value printed beside (``min(1, m p)``, of the test of no difference) is below 0.05 exactly when
the simultaneous interval excludes 0. A claim without a standard error (fewer than two contexts, or a pair
not measured) is inconclusive and not counted in ``m``.

**Best.** An entry is named "best" only when its lead over the runner-up holds; otherwise the two are a
"top group (not resolved)" (:func:`top_words`).

**One precision per table.** Entries whose caches stored their full-precision rows in different dtypes
(the record field ``cache_dtype``; absent: ``float32``, records from before it) are not compared
(:func:`one_precision`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from cmbench.report.reading import ReportError, read_table
from cmbench.report.statistics import clustered_mean_se

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
LEAD, EQUIVALENT, NONINFERIOR, DEFICIT = "lead", "equivalent", "non-inferior", "deficit"
KINDS = (LEAD, EQUIVALENT, NONINFERIOR, DEFICIT)
ALPHA = 0.05
"""The family's error rate: every interval of a family covers together with probability at least 1 - ALPHA."""
DEFAULT_PRECISION = "float32"
"""The cache precision of a record without ``cache_dtype`` (written before the field)."""


@dataclass(frozen=True)
class Margin:
    """A kind's margin and why it has that size."""

    value: float
    why: str


SCORE_MARGIN = 0.05
MARGINS: dict[str, Margin] = {
    LEAD: Margin(SCORE_MARGIN, "a lead smaller than 0.05 of a task score in [0, 1] is not one a user would act on "
                               "(the paper's FullKV and DeCoPrune rows differ by 0.023)"),
    EQUIVALENT: Margin(SCORE_MARGIN, "two entries within 0.05 of a task score in [0, 1] serve a user alike; the "
                                     "paper calls DeCoPrune (0.5880) close to FullKV (0.6106), 0.023 apart"),
    NONINFERIOR: Margin(SCORE_MARGIN, "a compressed cache may lose up to 0.05 of a task score in [0, 1] and still "
                                      "count as keeping what FullKV keeps (the paper's DeCoPrune loses 0.023)"),
    DEFICIT: Margin(SCORE_MARGIN, "the mirror of a lead: a deficit smaller than 0.05 of a score is none a user "
                                  "would notice"),
}
"""Each kind's margin, stated once (docs/verdicts.md prints this table)."""

CORRECTION = ("Bonferroni over the {m} tested claims of this table: each interval at level 1 - 0.05/{m} ({level:.2%}), "
              "all {m} covering together with probability at least 95%")


class VerdictError(ReportError):
    """A claim that cannot be decided as declared (no margin, a margin outside (0, 1), an unknown kind, entries of
    different cache precision): one line naming what and where."""


def declared_margin(kind: str, margin: float | None) -> float:
    """A claim's margin: its own where it declares one, else its kind's (:data:`MARGINS`)."""
    return MARGINS[kind].value if margin is None else margin


def check_margin(margin: float | None, where: str) -> float:
    """``margin`` when it lies in (0, 1); else :class:`VerdictError` naming ``where``."""
    if margin is None or (isinstance(margin, float) and math.isnan(margin)):
        raise VerdictError(f"{where}: the claim declares no margin (every claim needs one: docs/verdicts.md)")
    if not 0 < float(margin) < 1:
        raise VerdictError(f"{where}: margin {margin!r} is outside (0, 1)")
    return float(margin)


def rule(kind: str, low: float, high: float, margin: float) -> str:
    """The verdict of a ``kind`` claim whose interval of ``a - b`` is ``[low, high]`` (see the module's rules)."""
    if math.isnan(low) or math.isnan(high):
        return INCONCLUSIVE
    if kind == LEAD:
        return HOLDS if low > 0 else FAILS if high < margin else INCONCLUSIVE
    if kind == DEFICIT:
        return HOLDS if high < 0 else FAILS if low > -margin else INCONCLUSIVE
    if kind == EQUIVALENT:
        return HOLDS if -margin <= low and high <= margin else FAILS if low > margin or high < -margin \
            else INCONCLUSIVE
    if kind == NONINFERIOR:
        return HOLDS if low > -margin else FAILS if high < -margin else INCONCLUSIVE
    raise VerdictError(f"claim kind {kind!r} is not one of {', '.join(KINDS)}")


def rule_text(kind: str, margin: float) -> str:
    """The rule of ``kind`` in words, with its margin: what the findings' criteria and docs/verdicts.md say."""
    return {
        LEAD: f"holds when the simultaneous interval of the difference lies above 0, does not hold when it lies "
              f"below +{margin:g} (a lead, if any, smaller than {margin:g}), inconclusive otherwise",
        EQUIVALENT: f"holds when the simultaneous interval of the difference lies within +-{margin:g}, does not hold "
                    f"when it lies wholly outside, inconclusive otherwise (an interval that includes 0 but reaches "
                    f"past +-{margin:g} is inconclusive, not level)",
        NONINFERIOR: f"holds when the simultaneous interval of the difference lies above -{margin:g}, does not hold "
                     f"when it lies below -{margin:g}, inconclusive otherwise",
        DEFICIT: f"holds when the simultaneous interval of the difference lies below 0, does not hold when it lies "
                 f"above -{margin:g} (a deficit, if any, smaller than {margin:g}), inconclusive otherwise",
    }[kind]


def rules_section() -> str:
    """Every kind's rule, margin and why, and the family's correction: docs/verdicts.md's generated block."""
    lines = ["| kind | claim | margin | verdict | why this margin |", "|---|---|---|---|---|"]
    claims = {LEAD: "a leads b", EQUIVALENT: "a is level with b", NONINFERIOR: "a is not worse than b by more than "
              "the margin", DEFICIT: "a is below b"}
    for kind in KINDS:
        margin = MARGINS[kind]
        lines.append(f"| {kind} | {claims[kind]} | {margin.value:g} | {rule_text(kind, margin.value)} | {margin.why} |")
    return "\n".join([*lines, "", "The interval is that of the mean paired difference a - b (clustered by context: "
                       "a t interval on contexts - 1 degrees of freedom); with m tested claims in a table, each interval "
                       f"is at level 1 - {ALPHA:g}/m (Bonferroni), so that all m cover together with probability at "
                       f"least {1 - ALPHA:.0%}."])


def _two_sided_p(estimate: float, se: float, df: int) -> float:
    if math.isnan(se) or df < 1:
        return math.nan
    if se == 0:
        return 1.0 if estimate == 0 else 0.0
    return float(2 * stats.t.sf(abs(estimate / se), df))


@dataclass(frozen=True)
class Claim:
    """One claim about ``a - b``, before its family decides it.

    Attributes
    ----------
    name : str
        What is claimed, in words (``"decoprune@bytes15 level with fullkv"``).
    kind : str
        One of :data:`KINDS`.
    estimate, se : float
        The mean paired difference ``a - b`` and its cluster-robust standard error (NaN: not measured).
    contexts : int
        The clusters behind it (the interval has ``contexts - 1`` degrees of freedom).
    n_pairs : int
        The (task, seed) pairs both entries finished: entries that ran on different task sets are paired on
        the tasks both ran.
    margin : float or None
        None: the kind's (:data:`MARGINS`).
    a, b : str
        The entries compared (``""`` where the claim is not about two entries of a board).
    """

    name: str
    kind: str
    estimate: float
    se: float
    contexts: int
    n_pairs: int
    margin: float | None = None
    a: str = ""
    b: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise VerdictError(f"claim {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        check_margin(self.the_margin, f"claim {self.name!r}")

    @property
    def the_margin(self) -> float:
        return declared_margin(self.kind, self.margin)

    @property
    def testable(self) -> bool:
        return not (math.isnan(self.estimate) or math.isnan(self.se)) and self.contexts >= 2

    @classmethod
    def of_differences(cls, name: str, kind: str, differences, clusters, margin: float | None = None,
                       a: str = "", b: str = "") -> Claim:
        """A claim on paired differences ``differences[i]`` (``[n]``) clustered by ``clusters[i]`` (``[n]``)."""
        mean, se, g = clustered_mean_se(differences, clusters)
        return cls(name, kind, mean, se, g, len(np.asarray(differences)), margin, a, b)

    @classmethod
    def of_interval(cls, name: str, kind: str, estimate: float, half95: float, contexts: int, n_pairs: int,
                    margin: float | None = None, a: str = "", b: str = "") -> Claim:
        """A claim from a 95% cluster-robust interval ``estimate +- half95`` over ``contexts`` clusters (what the
        comparison tables hold): its standard error is ``half95 / t_{0.975, contexts - 1}``."""
        se = half95 / float(stats.t.ppf(0.975, contexts - 1)) if contexts >= 2 and not math.isnan(half95) \
            else math.nan
        return cls(name, kind, estimate, se, contexts, n_pairs, margin, a, b)


@dataclass(frozen=True)
class Decided:
    """A claim decided in its family of ``family_size`` claims: its simultaneous interval and verdict."""

    claim: Claim
    family_size: int
    level: float
    low: float
    high: float
    p: float
    p_adjusted: float
    verdict: str

    def row(self) -> dict[str, object]:
        """One row of a verdict CSV (:data:`COLUMNS`)."""
        c = self.claim
        return {"claim": c.name, "a": c.a, "b": c.b, "kind": c.kind, "margin": c.the_margin, "estimate": c.estimate, "low": self.low,
                "high": self.high, "level": self.level, "p": self.p, "p_adjusted": self.p_adjusted,
                "family_size": self.family_size, "verdict": self.verdict, "n_pairs": c.n_pairs,
                "contexts": c.contexts}


COLUMNS = ("claim", "a", "b", "kind", "margin", "estimate", "low", "high", "level", "p", "p_adjusted", "family_size", "verdict",
           "n_pairs", "contexts")
"""A verdict CSV's columns: the claim (and the entries ``a`` and ``b`` it compares, ``a - b``), its kind and margin, the estimate and its simultaneous interval [low, high]
at ``level``, the two-sided p of no difference and its Bonferroni adjustment, the family's size, the verdict, the
pairs and contexts behind it."""


def decide(claims: Sequence[Claim], alpha: float = ALPHA) -> list[Decided]:
    """Decide ``claims`` as one family (the claims one table prints): Bonferroni-simultaneous intervals at level
    ``1 - alpha / m`` over the ``m`` testable claims, each read by its kind's :func:`rule`."""
    m = sum(c.testable for c in claims)
    level = 1 - alpha / m if m else math.nan
    out = []
    for c in claims:
        if not c.testable:
            out.append(Decided(c, m, level, math.nan, math.nan, math.nan, math.nan, INCONCLUSIVE))
            continue
        half = float(stats.t.ppf(1 - alpha / (2 * m), c.contexts - 1)) * c.se
        low, high = c.estimate - half, c.estimate + half
        p = _two_sided_p(c.estimate, c.se, c.contexts - 1)
        out.append(Decided(c, m, level, low, high, p, min(1.0, m * p), rule(c.kind, low, high, c.the_margin)))
    return out


def combined(verdicts: Iterable[str]) -> str:
    """A claim of several parts: every part holds: holds; some part does not: does not hold; else inconclusive
    (also for no parts)."""
    parts = list(verdicts)
    return FAILS if FAILS in parts else HOLDS if parts and all(v == HOLDS for v in parts) else INCONCLUSIVE


def correction_text(decided: Sequence[Decided]) -> str:
    """The family's correction in one sentence (what each table states)."""
    m = decided[0].family_size if decided else 0
    return CORRECTION.format(m=m, level=decided[0].level) if m else "no claim of this table could be tested"


def said(row: Mapping[str, Any], versus: str) -> str:
    """What a decided claim of ``a`` against ``versus`` says, in the words every table uses; ``row`` is a row of a
    verdict CSV (:meth:`Decided.row`, or read back). An inconclusive equivalence whose interval lies on one side
    of 0 says that side: every statement read off a family's simultaneous intervals is covered by them together."""
    kind, v, m = str(row["kind"]), str(row["verdict"]), float(row["margin"])
    low, high, estimate = float(row["low"]), float(row["high"]), float(row["estimate"])
    if v == INCONCLUSIVE and kind == EQUIVALENT and (high < 0 or low > 0):
        return f"{'below' if high < 0 else 'above'} {versus} (whether by more than {m:g} is not resolved)"
    if v == INCONCLUSIVE:
        return f"not resolved against {versus}"
    if kind == EQUIVALENT:
        return f"level with {versus} (within ±{m:g})" if v == HOLDS else \
            f"{'below' if estimate < 0 else 'above'} {versus} by more than {m:g}"
    if kind == LEAD:
        return f"ahead of {versus}" if v == HOLDS else f"not ahead of {versus} by {m:g}"
    if kind == DEFICIT:
        return f"below {versus}" if v == HOLDS else f"not below {versus} by {m:g}"
    return f"not worse than {versus} by more than {m:g}" if v == HOLDS else f"worse than {versus} by more than {m:g}"


def top_words(top: str, runner_up: str | None, lead_verdict: str | None) -> str:
    """``best <top>`` when its lead over the runner-up holds, else ``top group (not resolved): <top>, <runner-up>``
    (a lone entry is best by default: nothing to resolve)."""
    if runner_up is None:
        return f"best {top} (alone)"
    if lead_verdict == HOLDS:
        return f"best {top}"
    return f"top group (not resolved): {top}, {runner_up}"


def write(decided: Sequence[Decided], path: Path) -> Path:
    """The verdict CSV of one family (:data:`COLUMNS`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([d.row() for d in decided], columns=list(COLUMNS)).to_csv(path, index=False, float_format="%.6g")
    return path


def read(path: Path) -> pd.DataFrame:
    """A verdict CSV, read as data (bounded, untorn, its columns checked)."""
    return read_table(path, COLUMNS, "verdict", "leaderboard")


def precision_of(frame: pd.DataFrame, where: str) -> str:
    """The cache precision of one entry's records: its ``cache_dtype`` (absent or empty: :data:`DEFAULT_PRECISION`);
    :class:`VerdictError` when its records differ."""
    if "cache_dtype" not in frame.columns:
        return DEFAULT_PRECISION
    found = {DEFAULT_PRECISION if (v is None or (isinstance(v, float) and math.isnan(v))) else str(v)
             for v in frame["cache_dtype"]}
    if len(found) > 1:
        raise VerdictError(f"{where}: its records differ in cache precision (cache_dtype {', '.join(sorted(found))})")
    return found.pop() if found else DEFAULT_PRECISION


def one_precision(precisions: Mapping[str, str], where: str) -> str:
    """The one cache precision of a table's entries (label -> precision); :class:`VerdictError` naming each entry's
    when they differ: bytes and scores of different precisions are not compared."""
    found = sorted(set(precisions.values()))
    if len(found) > 1:
        named = ", ".join(f"{label} ({p})" for label, p in precisions.items())
        raise VerdictError(f"{where}: entries differ in cache precision (cache_dtype): {named}")
    return found[0] if found else DEFAULT_PRECISION


def contexts_of_test(estimate: float, half95: float, p: float) -> int:
    """The number of contexts behind a comparison row written before tables carried it: the ``G`` whose t
    distribution (``G - 1`` degrees of freedom) gives both the row's 95% half-width and its p-value.

    ``p = 2 sf(|estimate| t_{0.975, G - 1} / half95, G - 1)`` pins ``G``: the integer in [2, 1000] that solves it
    best is returned. A row whose p-value does not pin ``G`` (a zero estimate or half-width, p at 0.05, where every
    ``G`` solves it) raises :class:`VerdictError`."""
    if not (half95 > 0 and estimate != 0 and 0 < p < 1 and not math.isclose(p, 0.05, rel_tol=1e-3)):
        raise VerdictError(f"a comparison row (estimate {estimate:g}, half-width {half95:g}, p {p:g}) does not say "
                           "how many contexts it has: rerun its leaderboard to write the contexts column")
    groups = np.arange(2, 1001)
    t = abs(estimate) * stats.t.ppf(0.975, groups - 1) / half95
    return int(groups[np.argmin(np.abs(np.log(2 * stats.t.sf(t, groups - 1)) - math.log(p)))])


def claim_of_pair(table: pd.DataFrame, a: str, b: str, kind: str, name: str, where: str,
                  margin: float | None = None) -> Claim:
    """A claim on ``a - b`` from a comparisons table (rows ``method``, ``versus``, ``delta``, ``delta_ci95``,
    ``p_value``, ``n_pairs``; ``contexts`` where written): the row ``a`` vs ``b``, or ``b`` vs ``a`` negated; a pair
    the table lacks is an untestable claim (NaN)."""
    for first, second, sign in ((a, b, 1.0), (b, a, -1.0)):
        rows = table[(table["method"] == first) & (table["versus"] == second)]
        if len(rows):
            row = rows.iloc[0]
            delta, half, p = float(row["delta"]), float(row["delta_ci95"]), float(row["p_value"])
            known = "contexts" in table.columns and not pd.isna(row["contexts"])
            try:
                contexts = int(row["contexts"]) if known else contexts_of_test(delta, half, p)
            except VerdictError as err:
                raise VerdictError(f"{where}: {first} vs {second}: {err}") from None
            return Claim.of_interval(name, kind, sign * delta, half, contexts, int(row["n_pairs"]), margin, a, b)
    return Claim(name, kind, math.nan, math.nan, 0, 0, margin, a, b)
