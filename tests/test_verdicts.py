"""The one verdict rule (cmbench/report/verdicts.py): each kind at its boundaries, the family's correction by hand
numbers, the words every table prints, and bad input in one line.

The plants a reviewer fears each fail a test here: a reversed margin (non-inferiority or a deficit read on the
wrong side), a dropped multiplicity correction (each claim decided alone), and absence of evidence read as
"level" (an interval that includes 0 but reaches past the margin).
"""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
from scipy import stats

from cmbench.report.comparisons import comparisons
from cmbench.report.reading import ReportError
from cmbench.report.verdicts import (
    DEFICIT,
    EQUIVALENT,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    LEAD,
    MARGINS,
    NONINFERIOR,
    Claim,
    VerdictError,
    claim_of_pair,
    contexts_of_test,
    decide,
    one_precision,
    precision_of,
    rule,
    said,
    top_words,
)
from test_report import record, write_run

M = 0.05


# ------------------------------------------------------------------------------------------ the rule
@pytest.mark.parametrize(("kind", "low", "high", "expected"), [
    (NONINFERIOR, -0.04, 0.02, HOLDS),          # above -0.05: not worse by more than the margin
    (NONINFERIOR, -0.04, -0.02, HOLDS),         # worse, but by less than the margin
    (NONINFERIOR, -0.06, 0.02, INCONCLUSIVE),   # reaches past -0.05
    (NONINFERIOR, -0.09, -0.06, FAILS),         # worse by more than the margin
    (NONINFERIOR, 0.02, 0.04, HOLDS),           # better
    (DEFICIT, -0.04, -0.02, HOLDS),
    (DEFICIT, -0.04, 0.0, FAILS),               # not below 0, and any deficit is smaller than 0.05
    (DEFICIT, -0.07, 0.01, INCONCLUSIVE),
    (DEFICIT, 0.01, 0.03, FAILS),
    (LEAD, 0.01, 0.2, HOLDS),
    (LEAD, -0.04, 0.04, FAILS),                 # any lead is smaller than 0.05
    (LEAD, -0.04, 0.06, INCONCLUSIVE),
    (LEAD, -0.1, -0.06, FAILS),
])
def test_each_kind_reads_its_margin_on_its_own_side(kind, low, high, expected):
    """A reversed margin (non-inferiority against +margin, a deficit against +margin) fails these."""
    assert rule(kind, low, high, M) == expected


@pytest.mark.parametrize(("low", "high", "expected"), [
    (-0.03, 0.04, HOLDS),          # within +-0.05
    (-0.05, 0.05, HOLDS),          # touching the margin is within it
    (-0.07, 0.04, INCONCLUSIVE),   # includes 0 but reaches past -0.05: absence of evidence is not "level"
    (-0.2, 0.2, INCONCLUSIVE),
    (0.06, 0.1, FAILS),            # wholly outside
    (-0.3, -0.051, FAILS),
    (0.01, 0.04, HOLDS),           # excludes 0 yet within the margin: level within the margin
])
def test_equivalence_holds_only_when_the_interval_lies_within_the_margin(low, high, expected):
    assert rule(EQUIVALENT, low, high, M) == expected


def test_an_interval_that_includes_zero_is_never_level_by_that_alone():
    """The old families rule ("FullKV minus it has a CI that includes 0: level") made decoprune@bytes15 level at
    +0.046 ± 0.072; the rule says inconclusive, and the words say not resolved."""
    claim = Claim.of_interval("decoprune@bytes15 level with fullkv", EQUIVALENT, -0.0456, 0.0722, 8, 24)
    [decided] = decide([claim])
    assert decided.low < 0 < decided.high and decided.verdict == INCONCLUSIVE
    assert said(decided.row(), "FullKV") == "not resolved against FullKV"


def test_a_missing_interval_is_inconclusive():
    assert rule(LEAD, math.nan, math.nan, M) == INCONCLUSIVE
    untested = Claim("a ahead of b", LEAD, math.nan, math.nan, 0, 0)
    one = Claim.of_interval("c ahead of d", LEAD, 0.3, 0.1, 8, 24)
    decided = decide([untested, one])
    assert decided[0].verdict == INCONCLUSIVE and math.isnan(decided[0].low)
    assert {d.family_size for d in decided} == {1}  # an untested claim is not counted in the family


# ------------------------------------------------------------------------------------------ the family
def test_bonferroni_by_hand_numbers():
    """Eight contexts (7 degrees of freedom), se 0.04: alone the 95% interval is 0.1 +- 2.365 * 0.04 (t table) and
    the lead holds; in a family of two each interval is at 97.5%, 0.1 +- 2.841 * 0.04, and it is inconclusive."""
    claim = Claim("a ahead of b", LEAD, 0.1, 0.04, 8, 24)
    [alone] = decide([claim])
    assert alone.level == pytest.approx(0.95) and alone.high - 0.1 == pytest.approx(2.365 * 0.04, abs=1e-4)
    assert alone.verdict == HOLDS
    other = Claim("c level with d", EQUIVALENT, 0.0, 0.01, 8, 24)
    first, second = decide([claim, other])
    assert first.level == pytest.approx(0.975) and first.family_size == 2
    assert first.high - 0.1 == pytest.approx(2.841 * 0.04, abs=1e-4) and first.low < 0
    assert first.verdict == INCONCLUSIVE  # a dropped correction would keep it "holds"
    # t = 0.1 / 0.04 = 2.5 on 7 degrees of freedom: two-sided p 0.0410; adjusted over two tests 0.0820
    assert first.p == pytest.approx(0.0410, abs=5e-4) and first.p_adjusted == pytest.approx(0.0820, abs=1e-3)
    assert second.high == pytest.approx(2.841 * 0.01, abs=1e-4) and second.verdict == HOLDS


def test_the_adjusted_p_is_below_005_exactly_when_the_simultaneous_interval_excludes_0():
    claims = [Claim(f"c{i}", LEAD, d, 0.04, 8, 24) for i, d in enumerate((0.05, 0.1, 0.15, 0.2, 0.3))]
    for d in decide(claims):
        assert (d.p_adjusted < 0.05) == (d.low > 0), d.claim.name
        assert d.level == pytest.approx(1 - 0.05 / 5)
        assert d.high - d.claim.estimate == pytest.approx(stats.t.ppf(1 - 0.05 / 10, 7) * 0.04)


def test_a_claim_from_a_95_interval_keeps_its_standard_error():
    claim = Claim.of_interval("x", LEAD, 0.2, 2.365 * 0.05, 8, 24)
    assert claim.se == pytest.approx(0.05, rel=1e-3) and claim.margin is None and claim.the_margin == M


# ------------------------------------------------------------------------------------------ the words
def row(kind, verdict, estimate, low, high):
    return {"kind": kind, "verdict": verdict, "estimate": estimate, "low": low, "high": high, "margin": M}


def test_the_words_agree_in_sign_with_the_interval():
    assert said(row(EQUIVALENT, FAILS, -0.3, -0.4, -0.2), "FullKV") == "below FullKV by more than 0.05"
    assert said(row(EQUIVALENT, FAILS, 0.3, 0.2, 0.4), "FullKV") == "above FullKV by more than 0.05"
    assert said(row(EQUIVALENT, INCONCLUSIVE, -0.3, -0.6, -0.01), "FullKV") == \
        "below FullKV (whether by more than 0.05 is not resolved)"
    assert said(row(EQUIVALENT, INCONCLUSIVE, 0.2, 0.01, 0.4), "FullKV") == \
        "above FullKV (whether by more than 0.05 is not resolved)"
    assert said(row(EQUIVALENT, HOLDS, 0.01, -0.02, 0.04), "FullKV") == "level with FullKV (within ±0.05)"
    assert said(row(DEFICIT, HOLDS, -0.1, -0.2, -0.05), "DeCoPrune") == "below DeCoPrune"
    assert said(row(NONINFERIOR, FAILS, -0.1, -0.2, -0.06), "FullKV") == "worse than FullKV by more than 0.05"


def test_best_only_where_the_lead_over_the_runner_up_holds():
    assert top_words("a", "b", HOLDS) == "best a"
    assert top_words("a", "b", INCONCLUSIVE) == "top group (not resolved): a, b"
    assert top_words("a", "b", FAILS) == "top group (not resolved): a, b"
    assert top_words("a", "b", None) == "top group (not resolved): a, b"  # never compared
    assert top_words("a", None, None) == "best a (alone)"


def test_an_entry_that_scores_as_the_top_does_is_not_its_runner_up():
    """WorldKV with its store on the device attends the same rows as with it on the host: the two score the same on
    every (task, seed). The top's lead is claimed over the next entry that differs, never over its own second
    reading (a lead of 0 ± 0 that "does not hold"); the second reading is named beside the top."""
    from cmbench.report.board_claims import families_claims, top_and_runner_up

    def pair(a, b, delta, half, p=0.5):
        return {"method": a, "versus": b, "delta": delta, "delta_ci95": half, "p_value": p, "n_pairs": 8, "contexts": 8}

    board = pd.DataFrame({"method": ["fullkv", "worldkv@bytes25", "worldkv-on-device@bytes25", "tempcache@bytes25"],
                          "score": [0.96, 0.95, 0.95, 0.90], "kv_bytes_ratio": [1.0, 0.25, 0.25, 0.25]})
    pairs = pd.DataFrame([pair("fullkv", m, d, 0.02) for m, d in zip(board["method"][1:], (0.01, 0.01, 0.06))]
                         + [pair("worldkv@bytes25", "worldkv-on-device@bytes25", 0.0, 0.0, 1.0),
                            pair("worldkv@bytes25", "tempcache@bytes25", 0.05, 0.01, 1e-5),
                            pair("worldkv-on-device@bytes25", "tempcache@bytes25", 0.05, 0.01, 1e-5)])
    assert top_and_runner_up(list(board["method"][1:]), pairs) == (
        "worldkv@bytes25", "tempcache@bytes25", ["worldkv-on-device@bytes25"])
    leads = [c for c in families_claims(board, pairs, "t.csv") if c.kind == LEAD]
    assert [(c.a, c.b) for c in leads] == [("worldkv@bytes25", "tempcache@bytes25")]
    # a difference of 0 on average with a spread is not one setup read twice: that entry is the runner-up
    spread = pairs.copy()
    spread.loc[spread["versus"] == "worldkv-on-device@bytes25", "delta_ci95"] = 0.03
    assert top_and_runner_up(list(board["method"][1:]), spread)[1:] == ("worldkv-on-device@bytes25", [])
    assert top_and_runner_up(["a"], pairs) == ("a", None, [])


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(("margin", "message"), [
    (0.0, "margin 0.0 is outside (0, 1)"), (1.0, "margin 1.0 is outside (0, 1)"),
    (-0.05, "margin -0.05 is outside (0, 1)"), (math.nan, "declares no margin"),
])
def test_a_margin_outside_0_1_or_none_is_refused_naming_the_claim(margin, message):
    with pytest.raises(VerdictError, match=r"claim 'x ahead of y': .*" + re.escape(message)):
        Claim("x ahead of y", LEAD, 0.1, 0.01, 8, 24, margin)


def test_an_unknown_kind_is_refused():
    with pytest.raises(VerdictError, match="claim 'x': kind 'better' is not one of lead, equivalent"):
        Claim("x", "better", 0.1, 0.01, 8, 24)


def test_every_kind_states_its_margin_and_why():
    assert set(MARGINS) == {LEAD, EQUIVALENT, NONINFERIOR, DEFICIT}
    assert all(0 < m.value < 1 and len(m.why) > 20 for m in MARGINS.values())


def test_entries_of_different_cache_precision_are_not_compared(tmp_path):
    assert precision_of(pd.DataFrame({"score": [1.0]}), "x") == "float32"  # records from before the field
    assert precision_of(pd.DataFrame({"cache_dtype": [None, "float32"]}), "x") == "float32"
    with pytest.raises(VerdictError, match="runs/a: its records differ in cache precision"):
        precision_of(pd.DataFrame({"cache_dtype": ["bfloat16", "float32"]}), "runs/a")
    with pytest.raises(VerdictError, match=r"board.csv: entries differ in cache precision \(cache_dtype\): "
                                           r"fullkv \(float32\), kivi \(bfloat16\)"):
        one_precision({"fullkv": "float32", "kivi": "bfloat16"}, "board.csv")
    from cmbench.report.reading import load_runs

    tasks = ("a1", "b1")
    write_run(tmp_path / "half", [{**record("m", t, 0.5), "cache_dtype": "bfloat16"} for t in tasks])
    write_run(tmp_path / "full", [record("fullkv", t, 0.6) for t in tasks])  # no field: float32
    runs = [*load_runs([tmp_path / "half"]), *load_runs([tmp_path / "full"])]  # each entry read alone
    with pytest.raises(ReportError, match=r"comparing m with fullkv: entries differ in cache precision \(cache_dtype\): "
                                          r"m \(bfloat16\), fullkv \(float32\)"):
        comparisons(runs, [("m", "fullkv")])


# ------------------------------------------------------------------------------------------ tables
def test_the_contexts_of_an_older_comparison_row_are_recovered_from_its_ci_and_p():
    for g in (3, 8, 15, 40):
        se, d = 0.02, 0.05
        half = stats.t.ppf(0.975, g - 1) * se
        p = 2 * stats.t.sf(d / se, g - 1)
        assert contexts_of_test(float(f"{d:.6g}"), float(f"{half:.6g}"), float(f"{p:.6g}")) == g
    with pytest.raises(VerdictError, match="does not say how many contexts"):
        contexts_of_test(0.0, 0.1, 1.0)


def test_a_pair_is_read_either_way_and_a_missing_pair_is_untested():
    table = pd.DataFrame([{"method": "fullkv", "versus": "x", "delta": 0.1, "delta_ci95": 0.05, "p_value": 0.001,
                           "n_pairs": 20, "contexts": 10}])
    forward = claim_of_pair(table, "fullkv", "x", EQUIVALENT, "fullkv level with x", "t.csv")
    backward = claim_of_pair(table, "x", "fullkv", EQUIVALENT, "x level with fullkv", "t.csv")
    assert forward.estimate == pytest.approx(0.1) and backward.estimate == pytest.approx(-0.1)
    assert backward.se == pytest.approx(forward.se) and (backward.a, backward.b, backward.n_pairs) == ("x", "fullkv", 20)
    missing = claim_of_pair(table, "x", "y", LEAD, "x ahead of y", "t.csv")
    assert not missing.testable and decide([missing])[0].verdict == INCONCLUSIVE


def test_docs_state_the_rule_as_the_code_does():
    """docs/verdicts.md carries the rules section generated from the code (scripts/board_verdicts.py --docs)."""
    from pathlib import Path

    from cmbench.report.verdicts import rules_section

    docs = (Path(__file__).resolve().parents[1] / "docs" / "verdicts.md").read_text()
    block = docs.split("<!-- rules -->", 1)[1].split("<!-- /rules -->", 1)[0].strip()
    assert block == rules_section().strip(), "docs/verdicts.md differs from the code: run scripts/board_verdicts.py --docs"


def test_the_retrieval_comparison_states_its_claims_from_the_run_folders(tmp_path):
    """Each retrieval point level with FullKV and ahead of DeCoPrune at its target, one family of four claims
    (random@0.85 is neither: no claim), paired on the tasks both ran."""
    from cmbench.report.board_claims import retrieval_verdicts

    tasks = ("a1", "a2", "b1", "b2", "c1", "c2")
    full = [0.9, 0.8, 0.85, 0.75, 0.95, 0.9]

    def folder(name, scores, keep=tasks):
        return write_run(tmp_path / name, [record(name, t, s) for t, s in zip(tasks, scores) if t in keep])

    fullkv = folder("fullkv", full)
    points = [("worldkv", 0.85, folder("w", [s - 0.01 for s in full])),
              ("decoprune", 0.85, folder("d", [s - 0.3 for s in full], keep=tasks[:4])),  # ran 4 of the 6 tasks
              ("random", 0.85, folder("r", [s - 0.4 for s in full])),
              ("key_retrieval", 0.85, folder("k", [s - 0.2 + 0.05 * (i % 2) for i, s in enumerate(full)]))]
    decided = retrieval_verdicts(points, fullkv)
    got = {(d.claim.a, d.claim.b): d for d in decided}
    assert list(got) == [("worldkv@0.85", "fullkv"), ("worldkv@0.85", "decoprune@0.85"),
                         ("key_retrieval@0.85", "fullkv"), ("key_retrieval@0.85", "decoprune@0.85")]
    assert {d.family_size for d in decided} == {4}
    assert got["worldkv@0.85", "fullkv"].verdict == HOLDS  # 0.01 below, no spread: level within 0.05
    assert got["worldkv@0.85", "decoprune@0.85"].verdict == HOLDS and got["worldkv@0.85", "decoprune@0.85"].claim.n_pairs == 4
    assert got["key_retrieval@0.85", "fullkv"].verdict == FAILS  # 0.175 below on average: not level

