"""The findings table: each criterion's rule, each finding read from its experiment's outputs, the table.

The rules are tested at their boundaries (a planted ``<=`` for ``<``, a rule that ignores the CI, a reversed
pairing each fail here; the family and its correction in tests/test_verdicts.py), the readers on small
hand-made run folders whose paired differences are known, each decided as a family of its own claims.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from cmbench.paper import criteria
from cmbench.paper.criteria import BY_NUMBER, CRITERIA, NOT_RUN, PAPER_PR, UNTESTABLE, flat
from cmbench.paper.findings import (
    Reading,
    changes,
    collect,
    decide_table,
    criteria_section,
    diagnose_finding,
    markdown,
    probe_step_finding,
    quality_finding,
    realised_pr,
    rope_finding,
    selection_finding,
    short_context_finding,
    entries,
)
from cmbench.report import clustered_mean_ci
from cmbench.report.verdicts import DEFICIT, EQUIVALENT, FAILS, HOLDS, INCONCLUSIVE, LEAD, combined, rule
from test_report import record, write_run

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("a1", "a2", "b1", "b2", "c1", "c2")
HIGH, LOW = [0.8, 0.7, 0.9, 0.75, 0.85, 0.8], [0.3, 0.35, 0.3, 0.4, 0.25, 0.3]


def run(folder, label, scores, **fields):
    """One run folder of six tasks over three contexts, named ``label``, with these scores."""
    rows = [{**record(label, t, s), "context_id": t[0], "backbone": "tiny", **fields} for t, s in zip(TASKS, scores)]
    return write_run(folder / "miniworld" / label, rows)


def shifted(scores, by):
    return [s + by for s in scores]


def alone(number, reading: Reading):
    """(measured, verdict, outcome) of finding ``number``'s reading, its claims decided as a family of their own."""
    [[found]] = decide_table([(BY_NUMBER[number], "", reading)])
    return found.measured, found.verdict, found.outcome


def lead(d, ci, margin=0.05):
    return rule(LEAD, d - ci, d + ci, margin)


def similar(d, ci, margin=0.05):
    return rule(EQUIVALENT, d - ci, d + ci, margin)


def deficit(d, ci, margin=0.05):
    return rule(DEFICIT, d - ci, d + ci, margin)


# ------------------------------------------------------------------------------------------ the rules
@pytest.mark.parametrize(("d", "ci", "expected"), [
    (0.2, 0.1, HOLDS),           # CI [0.1, 0.3] above 0
    (0.1, 0.1, INCONCLUSIVE),    # touches 0: not above it
    (0.0, 0.04, FAILS),          # CI [-0.04, 0.04] below the 0.05 margin: any lead is smaller than meaningful
    (0.0, 0.05, INCONCLUSIVE),   # reaches the margin
    (-0.3, 0.1, FAILS),
    (0.2, math.nan, INCONCLUSIVE),
])
def test_lead_needs_the_ci_above_zero_and_is_ruled_out_below_the_margin(d, ci, expected):
    assert lead(d, ci) == expected


@pytest.mark.parametrize(("d", "ci", "expected"), [
    (0.01, 0.03, HOLDS),         # CI [-0.02, 0.04] within +-0.05
    (0.01, 0.045, INCONCLUSIVE),  # the mean is within the margin, the CI is not: not "similar"
    (-0.02, 0.2, INCONCLUSIVE),
    (0.2, 0.1, FAILS),           # CI [0.1, 0.3] outside
    (-0.2, 0.1, FAILS),
    (0.0, math.nan, INCONCLUSIVE),
])
def test_similar_is_decided_by_the_ci_not_the_mean(d, ci, expected):
    assert similar(d, ci) == expected


def test_similar_is_ruled_out_only_when_the_ci_clears_the_margin():
    # exact binary fractions: |d| - ci equals the margin, so the CI touches it and nothing is ruled out
    assert similar(0.25, 0.125, margin=0.125) == INCONCLUSIVE
    assert similar(-0.25, 0.0625, margin=0.125) == FAILS


def test_deficit_flat_and_combined():
    assert deficit(-0.3, 0.1) == HOLDS and deficit(0.3, 0.1) == FAILS and deficit(-0.05, 0.1) == INCONCLUSIVE
    assert deficit(-0.01, 0.005) == HOLDS  # resolved below 0, however small
    assert deficit(-0.03, 0.04) == INCONCLUSIVE and deficit(-0.01, 0.01) == FAILS  # [-0.02, 0]: above -margin
    assert flat(0.5, 0.95, 1.05, 0.10) == HOLDS
    assert flat(0.5, 0.85, 1.05, 0.10) == FAILS          # a quality metric left the band while memory fell
    assert flat(0.95, 0.99, 1.0, 0.10) == INCONCLUSIVE   # memory never fell: nothing to show
    assert combined([HOLDS, HOLDS]) == HOLDS and combined([HOLDS, FAILS]) == FAILS
    assert combined([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE and combined([]) == INCONCLUSIVE


def test_every_criterion_states_metric_comparison_place_and_rule_once():
    assert [c.number for c in CRITERIA] == [1, 2, 3, 4, 5, 6, 7]
    for c in CRITERIA:
        text = c.statement()
        assert text.startswith("Metric: ") and "Compared: " in text and "Where: " in text and "Verdict: " in text
        assert c.rule in criteria.RULE_TEXT or c.the_margin > 0


def test_the_paper_cells_quote_the_reference_numbers():
    """Every number a Paper cell gives is in the paper's reference text (shared/reference/paper.md)."""
    reference = (ROOT.parent / "shared" / "reference" / "paper.md")
    if not reference.is_file():
        pytest.skip("the reference text is not beside this checkout")
    text = reference.read_text()
    for c in CRITERIA:
        for number in re.findall(r"\d+\.\d+", c.paper):
            assert number in text, f"finding {c.number}'s Paper cell gives {number}, not in paper.md"


# ------------------------------------------------------------------------------------------ the readers
def test_probe_steps_decide_below_pr_0_9_only(tmp_path):
    """Steps 1, 2, 3 within a hair of each other at 0.75 and 0.85, far apart at 0.9 (where the paper sees the
    curves part): the finding holds; counting 0.9 in (``<=``) would make it fail."""
    folder = tmp_path / "probe_step"
    for target in (0.75, 0.85, 0.9):
        for step in (1, 2, 3):
            scores = shifted(LOW, 0.3 * (step - 1)) if target == 0.9 else shifted(HIGH, 0.001 * step)
            run(folder, f"s{step}@{target}", scores, method="decoprune", target_pr=target,
                method_config={"probe_step": step}, pr=target)
    measured, said, outcome = alone(2, probe_step_finding(folder))
    assert said == HOLDS and outcome == "6 parts: 6 holds"
    assert "step 1 − step 3 at PR 0.75 -0.0020 ± 0.0000 (6 pairs)" in measured
    assert "PR 0.9: step 1" in measured  # shown, not decided


def test_probe_steps_with_a_wide_ci_are_not_similar(tmp_path):
    folder = tmp_path / "probe_step"
    noise = [0.06, 0.06, -0.06, -0.06, 0.0, 0.0]  # per context +0.06, -0.06, 0: mean 0, CI far wider than the margin
    for step in (1, 2):
        scores = HIGH if step == 1 else [h + n for h, n in zip(HIGH, noise)]
        run(folder, f"s{step}", scores, method="decoprune", target_pr=0.85, method_config={"probe_step": step})
    assert alone(2, probe_step_finding(folder))[1] == INCONCLUSIVE


def selection_arms(folder, random85, *, reverse85=None, reverse_target=0.9):
    """The paper's operating point (every arm calibrated to PR 0.85) and, beside, the default-threshold run whose
    Random is 0.3 below DeCoPrune."""
    run(folder, "decoprune", HIGH, method="decoprune", pr=0.9)
    run(folder, "random", shifted(HIGH, -0.3), method="random", pr=0.9)
    run(folder, "decoprune_reverse", HIGH, method="decoprune_reverse", pr=0.2)
    run(folder, "decoprune_reverse@pr90", LOW, method="decoprune_reverse", target_pr=reverse_target, pr=0.88)
    run(folder, "decoprune@pr85", HIGH, method="decoprune", target_pr=0.85, pr=0.85)
    run(folder, "random@pr85", random85, method="random", target_pr=0.85, pr=0.85)
    if reverse85 is not None:
        run(folder, "decoprune_reverse@pr85", reverse85, method="decoprune_reverse", target_pr=0.85, pr=0.85)
    return alone(3, selection_finding(folder))


def test_selection_is_decided_at_the_papers_operating_point_with_the_default_run_beside(tmp_path):
    measured, said, outcome = selection_arms(tmp_path / "s", shifted(HIGH, -0.2), reverse85=LOW)
    assert said == HOLDS and outcome == "2 parts: 2 holds"
    assert measured.startswith("DeCoPrune @ PR 0.85 0.8000 ± 0.1076 @ 85.0%; Random @ PR 0.85 0.6000 ± 0.1076 @ 85.0%")
    assert "DeCoPrune − Random @ PR 0.85 0.2000 ± 0.0000 (6 pairs)" in measured
    mean, half = clustered_mean_ci([h - lo for h, lo in zip(HIGH, LOW)], [t[0] for t in TASKS])
    assert f"DeCoPrune − Reverse @ PR 0.85 {mean:.4f} ± {half:.4f} (6 pairs)" in measured
    assert "(beside, the default-threshold run: DeCoPrune at its default threshold 0.8000" in measured
    assert "DeCoPrune − Random 0.3000 ± 0.0000 (6 pairs)" in measured and "Reverse at DeCoPrune's PR" in measured
    # Random level with DeCoPrune at 85%: the lead does not hold, whatever the default-threshold run shows
    assert selection_arms(tmp_path / "tied", HIGH, reverse85=LOW)[1] == FAILS


def test_selection_needs_every_arm_at_the_operating_point(tmp_path):
    """Without Reverse calibrated to PR 0.85 the row is not run (a Reverse at DeCoPrune's default PR is beside)."""
    measured, said, outcome = selection_arms(tmp_path / "s", shifted(HIGH, -0.2))
    assert said == NOT_RUN and "DeCoPrune − Reverse @ PR 0.85" in outcome
    assert realised_pr(entries(tmp_path / "s"), "decoprune") == pytest.approx(0.9)
    assert "Reverse at DeCoPrune's PR" not in selection_arms(tmp_path / "far", HIGH, reverse_target=0.5)[0]


def test_short_context_decoprune_must_be_close_to_fullkv(tmp_path):
    """The Paper column's claim: DeCoPrune not worse than FullKV by more than the margin (DeCoPrune minus FullKV, not
    the reverse); whether it leads the other methods is shown beside and decides nothing."""
    folder = tmp_path / "short"
    run(folder, "fullkv", shifted(HIGH, 0.01), method="fullkv")
    run(folder, "decoprune@pr57", HIGH, method="decoprune", target_pr=PAPER_PR)
    run(folder, "streaming@pr57", LOW, method="streaming", target_pr=PAPER_PR)
    run(folder, "tempdiff@pr57", shifted(HIGH, -0.1), method="tempdiff", target_pr=PAPER_PR)
    run(folder, "random@pr57", shifted(HIGH, 0.09), method="random", target_pr=PAPER_PR)  # Random ahead: beside only
    run(folder, "tempdiff@pr85", shifted(LOW, 0.5), method="tempdiff", target_pr=0.85)  # another PR: not compared
    measured, said, outcome = alone(5, short_context_finding(folder))
    assert said == HOLDS and outcome == "1 part: 1 holds"
    assert "DeCoPrune − FullKV -0.0100 ± 0.0000 (6 pairs)" in measured
    assert "(beside, whether DeCoPrune leads the others: " in measured and "DeCoPrune − tempdiff 0.1000" in measured
    assert "tempdiff@pr85" not in measured and "0.5" not in outcome
    far = tmp_path / "far"
    run(far, "fullkv", shifted(HIGH, 0.1), method="fullkv")  # FullKV 0.1 ahead: DeCoPrune is not close
    run(far, "decoprune@pr57", HIGH, method="decoprune", target_pr=PAPER_PR)
    assert alone(5, short_context_finding(far))[1] == FAILS


def rope_runs(folder, fullkv_off, streaming_off, backbone="tiny_short"):
    run(folder, "fullkv-reindex_True", HIGH, method="fullkv", backbone=backbone)
    run(folder, "fullkv-reindex_False", fullkv_off, method="fullkv", backbone=backbone)
    run(folder, "streaming-reindex_True", LOW, method="streaming", backbone=backbone)
    run(folder, "streaming-reindex_False", streaming_off, method="streaming", backbone=backbone)


def test_rope_is_decided_only_where_the_backbone_shows_the_effect(tmp_path):
    flat_streaming = [s + d for s, d in zip(LOW, [0.01, -0.01, 0.02, -0.02, 0.0, 0.01])]
    rope_runs(tmp_path / "shows", LOW, flat_streaming)
    measured, said, outcome = alone(4, rope_finding(tmp_path / "shows"))
    assert said == HOLDS and outcome == "tiny_short, 6 pairs; 2 parts: 2 holds"
    mean, half = clustered_mean_ci([h - lo for h, lo in zip(HIGH, LOW)], [t[0] for t in TASKS])
    assert f"fullkv {sum(HIGH) / 6:.4f} / {sum(LOW) / 6:.4f} (with − without {mean:.4f} ± {half:.4f})" in measured
    rope_runs(tmp_path / "moved", LOW, shifted(LOW, -0.2))  # Streaming loses too: not the paper's finding
    assert alone(4, rope_finding(tmp_path / "moved"))[1] == FAILS
    rope_runs(tmp_path / "blind", shifted(HIGH, -0.05), LOW, backbone="tiny")  # FullKV loses 0.05 < 0.10
    measured, said, outcome = alone(4, rope_finding(tmp_path / "blind"))
    assert said == UNTESTABLE and "on tiny, FullKV loses 0.0500 without" in outcome


def test_rope_words_agree_in_sign_with_the_difference(tmp_path):
    """FullKV scoring higher without the re-index (with − without < 0) gains without it: "loses -0.0122" was wrong."""
    rope_runs(tmp_path / "gains", shifted(HIGH, 0.0125), LOW)
    outcome = alone(4, rope_finding(tmp_path / "gains"))[2]
    assert "FullKV gains 0.0125 without the re-index" in outcome and "-0.0125" not in outcome
    assert changes(0.25) == "loses 0.2500" and changes(-0.25) == "gains 0.2500" and changes(0.0) == "loses 0.0000"


def test_diagnosis_row(tmp_path):
    rows = pd.DataFrame([{"context_id": f"c{c}", "arm": "method", "step": s, "group": g, "error": e + 0.001 * c}
                         for c in range(3) for s in range(4)
                         for g, e in (("seen_cached", 0.01), ("seen_pruned", 0.05), ("new", 0.06))])
    folder = tmp_path / "miniworld" / "diagnose" / "decoprune"
    folder.mkdir(parents=True)
    rows.to_csv(folder / "diagnose.csv", index=False)
    measured, said, outcome = alone(1, diagnose_finding(tmp_path))
    assert said == HOLDS and "seen_cached 0.0110" in measured and outcome == "3 contexts; 2 parts: 2 holds"


def quality_table(folder, rows):
    table = folder / "miniworld" / "leaderboard"
    table.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=["metric", "kind", "pr_low", "pr_high", "points", "min_vs_fullkv", "max_vs_fullkv",
                                "range_vs_fullkv"]).to_csv(table / "quality_vs_memory.csv", index=False)


def test_quality_is_never_decided_by_a_stand_in(tmp_path):
    """MiniWorld's quality columns are stand-ins and flickering of a panning camera: "cannot be tested here",
    their numbers labelled; with the paper's four metrics the flat rule decides."""
    memory = ("light", "memory", 0.75, 0.95, 3, 0.15, 0.9, 0.75)
    quality_table(tmp_path / "q", [memory, ("temporal_flickering", "quality", 0.75, 0.95, 3, 0.98, 1.02, 0.04),
                                   ("background_consistency_light", "quality", 0.75, 0.95, 3, 0.5, 1.2, 0.7)])
    measured, said, outcome = alone(7, quality_finding(tmp_path / "q"))
    assert said == UNTESTABLE and "motion_smoothness, aesthetic_quality, imaging_quality" in outcome
    assert "stand-in: temporal_flickering (camera motion) 0.980–1.020; background_consistency_light" in measured
    paper = [(m, "quality", 0.75, 0.95, 3, 0.97, 1.03, 0.06) for m in
             ("temporal_flickering", "motion_smoothness", "aesthetic_quality", "imaging_quality")]
    quality_table(tmp_path / "gpu", [memory, *paper])
    assert alone(7, quality_finding(tmp_path / "gpu"))[1:] == (HOLDS, "outside the band: none")
    quality_table(tmp_path / "moved", [memory, *paper[:3], ("imaging_quality", "quality", 0.75, 0.95, 3, 0.7, 1.0, 0.3)])
    assert alone(7, quality_finding(tmp_path / "moved"))[1:] == (FAILS, "outside the band: imaging_quality")


def test_every_finding_has_a_row_and_absent_outputs_say_not_run(tmp_path):
    rope_runs(tmp_path / "rope", LOW, LOW)
    findings = collect(tmp_path, "limit=2")
    assert [f.number for f in findings] == [1, 2, 3, 4, 5, 6, 7]
    assert [f.verdict for f in findings] == [NOT_RUN, NOT_RUN, NOT_RUN, HOLDS, NOT_RUN, NOT_RUN, NOT_RUN]
    assert findings[3].command == "python -m cmbench run -m experiment=paper_rope limit=2"
    gate = findings[5].command.split("; ")  # the overrides go with each run, not after the leaderboard
    assert [c.endswith("limit=2") for c in gate] == [True, True, False] and "{o}" not in findings[5].command
    text = markdown(findings, title="T", preamble="p", second=findings[:4], second_name="world 2")
    rows = [line for line in text.splitlines() if re.match(r"^\| \d ", line)]
    assert len(rows) == 7 and "| 4 | RoPE re-index ablation |" in rows[3]
    assert "| **holds** | **holds**: tiny_short, 6 pairs" in rows[3] and "| **not run** | — |" in rows[6]
    assert text.endswith(criteria_section() + "\n")


def test_docs_state_each_criterion_as_the_code_does():
    """docs/findings.md carries the criteria section generated from the code (scripts/paper_findings.py --docs)."""
    docs = (ROOT / "docs" / "findings.md").read_text()
    block = docs.split("<!-- criteria -->", 1)[1].split("<!-- /criteria -->", 1)[0].strip()
    assert block == criteria_section("###").strip(), \
        "docs/findings.md's criteria differ from cmbench/paper/criteria.py: run python scripts/paper_findings.py --docs"
