"""results/paper_findings.md's rows: each finding read from its experiment's outputs, numbers and verdicts."""

from __future__ import annotations

import pandas as pd
import pytest

from cmbench.paper.findings import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_RUN,
    UNTESTABLE,
    collect,
    diagnose_finding,
    markdown,
    quality_finding,
    rope_finding,
    selection_finding,
)
from cmbench.report import clustered_mean_ci
from test_report import record, write_run

TASKS = ("a1", "a2", "b1", "b2", "c1", "c2")


def run(folder, label, scores, **fields):
    rows = [{**record(label, t, s), "context_id": t[0], "backbone": "tiny", **fields} for t, s in zip(TASKS, scores)]
    return write_run(folder / "miniworld" / label, rows)


HIGH, LOW = [0.8, 0.7, 0.9, 0.75, 0.85, 0.8], [0.3, 0.35, 0.3, 0.4, 0.25, 0.3]


def rope_runs(folder, streaming_off):
    run(folder, "fullkv-reindex_True", HIGH, method="fullkv")
    run(folder, "fullkv-reindex_False", LOW, method="fullkv")
    run(folder, "streaming-reindex_True", LOW, method="streaming")
    run(folder, "streaming-reindex_False", streaming_off, method="streaming")


def test_rope_holds_when_fullkv_drops_and_streaming_stays(tmp_path):
    rope_runs(tmp_path / "rope", [s + d for s, d in zip(LOW, [0.01, -0.01, 0.02, -0.02, 0.0, 0.01])])
    found = rope_finding(tmp_path / "rope", "cmd")
    assert found.status == HOLDS and found.number == 4
    mean, half = clustered_mean_ci([h - lo for h, lo in zip(HIGH, LOW)], [t[0] for t in TASKS])
    assert f"fullkv {sum(HIGH) / 6:.4f} / {sum(LOW) / 6:.4f} (Δ {mean:.4f} ± {half:.4f})" in found.measured
    rope_runs(tmp_path / "moved", [s - 0.2 for s in LOW])  # Streaming loses score too: not the paper's finding
    assert rope_finding(tmp_path / "moved", "cmd").status == FAILS


def test_selection_needs_deco_above_random_at_its_counts_and_reverse_at_matched_pr(tmp_path):
    def arms(folder, random_scores, reverse_matched=True):
        run(folder, "decoprune", HIGH, method="decoprune", pr=0.85)
        run(folder, "random", random_scores, method="random", pr=0.85)
        run(folder, "decoprune_reverse", HIGH, method="decoprune_reverse", pr=0.2)
        run(folder, "decoprune@pr85", HIGH, method="decoprune", target_pr=0.85, pr=0.85)
        if reverse_matched:
            run(folder, "decoprune_reverse@pr85", LOW, method="decoprune_reverse", target_pr=0.85, pr=0.85)
        return selection_finding(folder, "cmd")

    found = arms(tmp_path / "selection", [s - 0.2 for s in HIGH])
    assert found.status == HOLDS
    assert "Reverse 0.8000 ± 0.1076 @ 20.0%" in found.measured
    assert "DeCoPrune − Random (its per-chunk counts, default threshold) 0.2000 ± 0.0000 (6 pairs)" in found.measured
    assert arms(tmp_path / "tied", HIGH).status == FAILS  # Random as good as DeCoPrune: selection does not matter
    noisy = [h + d for h, d in zip(HIGH, [-0.3, -0.2, 0.1, 0.05, -0.05, 0.0])]  # a CI far wider than the effect
    assert arms(tmp_path / "noisy", noisy).status == INCONCLUSIVE
    partial = arms(tmp_path / "partial", [s - 0.2 for s in HIGH], reverse_matched=False)
    assert partial.status == UNTESTABLE and "not run here: DeCoPrune − Reverse at PR 0.85" in partial.reason


def test_diagnosis_and_quality_rows(tmp_path):
    rows = pd.DataFrame([{"context_id": f"c{c}", "arm": "method", "step": s, "group": g, "error": e + 0.001 * c}
                         for c in range(3) for s in range(4)
                         for g, e in (("seen_cached", 0.01), ("seen_pruned", 0.05), ("new", 0.06))])
    folder = tmp_path / "miniworld" / "diagnose" / "decoprune"
    folder.mkdir(parents=True)
    rows.to_csv(folder / "diagnose.csv", index=False)
    found = diagnose_finding(tmp_path, "cmd")
    assert found.status == HOLDS and "seen_cached 0.0110" in found.measured and "3 contexts" in found.reason

    table = tmp_path / "quality" / "miniworld" / "leaderboard"
    table.mkdir(parents=True)
    pd.DataFrame([("light", "memory", 0.75, 0.95, 3, 0.15, 0.9, 0.75),
                  ("temporal_flickering", "quality", 0.75, 0.95, 3, 0.98, 1.02, 0.04)],
                 columns=["metric", "kind", "pr_low", "pr_high", "points", "min_vs_fullkv", "max_vs_fullkv",
                          "range_vs_fullkv"]).to_csv(table / "quality_vs_memory.csv", index=False)
    found = quality_finding(tmp_path / "quality", "cmd")
    assert found.status == HOLDS and found.reason.endswith("memory falls; outside the band: none")
    pd.read_csv(table / "quality_vs_memory.csv").assign(max_vs_fullkv=[0.9, 1.3]).to_csv(
        table / "quality_vs_memory.csv", index=False)
    found = quality_finding(tmp_path / "quality", "cmd")  # quality moved by 30%: the metric is named
    assert found.status == FAILS and found.reason.endswith("memory falls; outside the band: temporal_flickering")
    pd.read_csv(table / "quality_vs_memory.csv").assign(min_vs_fullkv=[0.95, 0.98], max_vs_fullkv=[1.0, 1.02]).to_csv(
        table / "quality_vs_memory.csv", index=False)
    found = quality_finding(tmp_path / "quality", "cmd")  # flat quality, but memory never fell: nothing shown
    assert found.status == FAILS and found.reason.endswith("memory does not fall; outside the band: none")


def test_every_finding_has_a_row_and_absent_outputs_say_not_run(tmp_path):
    rope_runs(tmp_path / "rope", LOW)
    findings = collect(tmp_path, "limit=2")
    assert [f.number for f in findings] == [1, 2, 3, 4, 5, 6, 7]
    assert [f.status for f in findings] == [NOT_RUN, NOT_RUN, NOT_RUN, HOLDS, NOT_RUN, NOT_RUN, NOT_RUN]
    assert findings[3].command == "python -m cmbench run -m experiment=paper_rope limit=2"
    gate = findings[5].command.split("; ")  # the overrides go with each run, not after the leaderboard
    assert [c.endswith("limit=2") for c in gate] == [True, True, False] and "{o}" not in findings[5].command
    text = markdown(findings, title="T", preamble="p")
    assert text.count("\n| ") == 1 + 7 and "**not run**" in text and "| 4 | RoPE re-index ablation |" in text
    assert UNTESTABLE not in text


@pytest.mark.parametrize("missing", ["streaming"])
def test_a_finding_missing_an_arm_cannot_be_tested(tmp_path, missing):
    run(tmp_path / "rope", "fullkv-reindex_True", HIGH, method="fullkv")
    run(tmp_path / "rope", "fullkv-reindex_False", LOW, method="fullkv")
    assert rope_finding(tmp_path / "rope", "cmd").status == UNTESTABLE
