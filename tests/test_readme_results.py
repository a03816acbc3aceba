"""The findings table (results/paper_findings.md) and the README's findings and quality paragraphs say
exactly what the committed records and CSVs give: the table is rebuilt from results/paper/ and compared
cell by cell, the README's blocks are regenerated and compared (scripts/paper_findings.py and
scripts/update_readme_results.py write them)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from cmbench.paper.criteria import BY_NUMBER, FAILS, HOLDS, INCONCLUSIVE
from cmbench.paper.findings import Finding, summary_lines
from cmbench.paper.readme import (FINDINGS, QUALITY, REFERENCE, RESULT_TABLES, TABLE, blocks, committed_page,
                                  quality_block, with_blocks, with_table)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def committed():
    here = os.getcwd()
    os.chdir(REPO)
    try:
        return committed_page()
    finally:
        os.chdir(here)


def cells(text: str) -> dict[tuple[str, str], str]:
    """The table's cells by (row number, column name)."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    out = {}
    for line in lines[2:]:
        row = [c.strip() for c in line[2:-2].split(" | ")]
        out.update({(row[0], name): value for name, value in zip(header, row)})
    return out


def test_the_evidence_is_committed():
    for folder in FINDINGS:
        records = list((REPO / folder).rglob("records*.jsonl"))
        assert records, f"{folder}: no committed records"
        assert not list((REPO / folder).rglob("*.mp4")) and not list((REPO / folder).rglob("*.mkv"))


def test_every_cell_of_the_committed_table_is_what_the_committed_records_give(committed):
    rebuilt, findings, second = committed
    want = (REPO / TABLE).read_text()
    have, expected = cells(rebuilt), cells(want)
    assert sorted(have) == sorted(expected)
    wrong = [f"row {row}, {column}: the records give {have[row, column]!r}, the table says {value!r}"
             for (row, column), value in expected.items() if have[row, column] != value]
    assert not wrong, "\n".join(wrong)
    assert rebuilt == want  # the preamble and criteria too
    assert [f.number for f in findings] == sorted(BY_NUMBER) and second is not None


def test_the_readme_paragraphs_are_generated_from_the_committed_files(committed):
    _, findings, second = committed
    readme = (REPO / "README.md").read_text()
    assert with_blocks(readme, blocks(REPO, findings, second), "README.md") == readme, \
        "README.md is stale: run python scripts/update_readme_results.py"


def test_quality_block_reads_lowest_highest_and_range_per_metric(tmp_path):
    (tmp_path / QUALITY).parent.mkdir(parents=True)
    pd.DataFrame([
        ("light", "memory", 0.75, 0.95, 7, 0.20, 0.95, 0.75),
        ("temporal_flickering", "quality", 0.75, 0.95, 7, 0.99, 1.01, 0.02),
        ("background_consistency_light", "quality", 0.75, 0.95, 7, 0.80, 1.30, 0.50),
        ("subject_consistency_light", "quality", 0.75, 0.95, 7, 0.97, 1.00, 0.03),
    ], columns=["metric", "kind", "pr_low", "pr_high", "points", "min_vs_fullkv", "max_vs_fullkv",
                "range_vs_fullkv"]).to_csv(tmp_path / QUALITY, index=False)
    pd.DataFrame([("fullkv", 0.91, 0.94, 0.73, 0.57), ("random", 0.5, 0.9, 0.7, 0.6)],
                 columns=["method", "score", "temporal_flickering", "subject_consistency_light",
                          "background_consistency_light"]).to_csv(tmp_path / REFERENCE, index=False)
    text = quality_block(tmp_path)
    assert "| memory (light) | 0.200 / 0.950 | **0.750** |" in text
    assert "| background consistency (light) | 0.800 / 1.300 | 0.500 |" in text
    assert "FullKV: memory 0.910, flickering 0.940, subject 0.730, background 0.570" in text
    assert "Over PR 0.75-0.95 (7 calibrated points" in text
    # the widest quality metric is named on its own, the others by their largest range
    assert text.endswith("move by at most 0.030 and background consistency (light) by 0.500.")


def test_summary_pairs_the_two_worlds_by_finding_number():
    def finding(number: int, verdict: str) -> Finding:
        return Finding(BY_NUMBER[number], "m", "c", verdict, f"why {number}")

    text = summary_lines([finding(1, HOLDS), finding(2, INCONCLUSIVE)], [finding(2, FAILS), finding(1, HOLDS)])
    first, second = text.splitlines()
    assert first.startswith("1. ") and first.endswith(f"**{HOLDS}**; second world: **{HOLDS}**. why 1.")
    assert second == f"2. {BY_NUMBER[2].name}: **{INCONCLUSIVE}**; second world: **{FAILS}**. why 2."


@pytest.mark.parametrize("marker", sorted(RESULT_TABLES))
def test_each_results_table_in_the_readme_is_its_committed_file(marker):
    """The reference leaderboard, the PR at scale and the speed table are the files their scripts wrote (put there
    by ``scripts/update_readme_results.py FILE --marker NAME``)."""
    readme = (REPO / "README.md").read_text()
    assert with_table(readme, marker, (REPO / RESULT_TABLES[marker]).read_text(), "README.md") == readme, \
        f"README.md is stale: run python scripts/update_readme_results.py {RESULT_TABLES[marker]} --marker {marker}"


def test_a_table_goes_into_its_results_block_and_nothing_else_changes():
    text = "a\n<!-- results:speed -->\nold\n<!-- /results:speed -->\nb\n"
    assert with_table(text, "speed", "| new |\n", "README.md") == \
        "a\n<!-- results:speed -->\n| new |\n<!-- /results:speed -->\nb\n"
    with pytest.raises(ValueError, match="README.md: no <!-- results:miniworld --> .* the miniworld results"):
        with_table(text, "miniworld", "| new |\n", "README.md")


def test_a_missing_marker_names_the_file_and_block():
    with pytest.raises(ValueError, match="README.md: no <!-- quality --> .* quality paragraph"):
        with_blocks("no markers here", {"quality": "x"}, "README.md")


def test_the_families_block_states_the_verdict_rule_not_absence_of_evidence(tmp_path):
    """Entries grouped by their bytes target (largest first, the formats alone last); against FullKV each says what
    its equivalence claim gives in the board's family (a CI that includes 0 is *not* level: it is not resolved),
    and a target's top entry is "best" only where its lead over the runner-up holds."""
    from cmbench.paper.readme import FAMILIES_BOARD, FAMILIES_PAIRS, FAMILIES_SUBSET, FAMILIES_VERDICTS, families_block
    from cmbench.report import verdicts
    from cmbench.report.board_claims import board_verdicts

    row = {"metric": "light", "score_ci95": 0.05, "n_tasks": 24, "seeds": 3, "psnr_vs_fullkv": 30.0}
    board = pd.DataFrame([
        {**row, "method": "fullkv", "score": 0.95, "kv_bytes_ratio": 1.0},
        {**row, "method": "decoprune@bytes8", "score": 0.80, "kv_bytes_ratio": 0.081},
        {**row, "method": "worldkv@bytes8+kivi4-g32-r128", "score": 0.94, "kv_bytes_ratio": 0.079},
        {**row, "method": "streaming@bytes25", "score": 0.60, "kv_bytes_ratio": 0.25},
        {**row, "method": "random@bytes25", "score": 0.50, "kv_bytes_ratio": 0.25},  # not compared with FullKV
        {**row, "method": "fullkv+kivi2-g32-r128", "score": 0.90, "kv_bytes_ratio": 0.104},
        {**row, "method": "fullkv+kivi4-g32-r128", "score": 0.97, "kv_bytes_ratio": 0.166},
    ])
    pair = {"method": "fullkv", "p_value": 0.01, "n_pairs": 24, "contexts": 8}
    pairs = pd.DataFrame([
        {**pair, "method": "decoprune@bytes8", "versus": "fullkv", "delta": -0.40, "delta_ci95": 0.10},  # read back
        {**pair, "versus": "worldkv@bytes8+kivi4-g32-r128", "delta": 0.01, "delta_ci95": 0.01},
        {**pair, "versus": "streaming@bytes25", "delta": 0.35, "delta_ci95": 0.30},
        {**pair, "versus": "fullkv+kivi2-g32-r128", "delta": 0.01, "delta_ci95": 0.06},  # includes 0: not level
        {**pair, "versus": "fullkv+kivi4-g32-r128", "delta": -0.10, "delta_ci95": 0.06},
        {**pair, "method": "decoprune@bytes8", "versus": "worldkv@bytes8+kivi4-g32-r128", "delta": -0.14,
         "delta_ci95": 0.02},
    ])
    (tmp_path / FAMILIES_BOARD).parent.mkdir(parents=True)
    board.to_csv(tmp_path / FAMILIES_BOARD, index=False)
    pairs.to_csv(tmp_path / FAMILIES_PAIRS, index=False)
    decided = board_verdicts("families", tmp_path / FAMILIES_BOARD, tmp_path / FAMILIES_PAIRS)
    verdicts.write(decided, tmp_path / FAMILIES_VERDICTS)
    assert {d.family_size for d in decided} == {6}  # 5 entries against FullKV and one lead; untested pairs not counted
    text = families_block(tmp_path)
    assert f"24 (task, seed) pairs: the 8 tasks of {FAMILIES_SUBSET} x 3 seeds" in text
    assert "FullKV scores 0.950 ± 0.050" in text and "one family of the 6 tested claims" in text
    table = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [line.split(" | ")[1] for line in table] == [
        "streaming@bytes25", "random@bytes25", "worldkv@bytes8+kivi4-g32-r128", "decoprune@bytes8",
        "fullkv+kivi4-g32-r128", "fullkv+kivi2-g32-r128"]
    assert "| 0.25 | random@bytes25 | eviction | 0.250 | 0.500 ± 0.050 |  | not resolved against FullKV |" in text
    assert ("| 0.08 | decoprune@bytes8 | eviction | 0.081 | 0.800 ± 0.050 | +0.400 ± 0.100 (0.01) | below FullKV by "
            "more than 0.05 | 30.0 dB |") in text
    assert ("- At 0.08 of FullKV's bytes: best worldkv@bytes8+kivi4-g32-r128 (retrieval + quantization) 0.940; level "
            "with FullKV (within ±0.05): worldkv@bytes8+kivi4-g32-r128; below FullKV by more than 0.05: "
            "decoprune@bytes8.") in text
    assert ("- At 0.25 of FullKV's bytes: top group (not resolved): streaming@bytes25 (eviction) 0.600, "
            "random@bytes25 0.500; not resolved against FullKV: streaming@bytes25, random@bytes25.") in text
    assert ("- The formats alone: top group (not resolved): fullkv+kivi4-g32-r128 (quantization) 0.970, "
            "fullkv+kivi2-g32-r128 0.900; above FullKV (whether by more than 0.05 is not resolved): "
            "fullkv+kivi4-g32-r128; not resolved against FullKV: fullkv+kivi2-g32-r128.") in text
    assert "level with FullKV (within ±0.05): fullkv+kivi2" not in text


def test_the_committed_verdict_csvs_are_what_the_committed_boards_give():
    """Each committed board's verdict CSV is what its leaderboard and comparisons CSVs give under the rule now."""
    from cmbench.report import verdicts
    from cmbench.report.board_claims import COMMITTED, board_verdicts

    for kind, (board, pairs, out) in COMMITTED.items():
        fresh = pd.DataFrame([d.row() for d in board_verdicts(kind, REPO / board, REPO / pairs)])
        committed = verdicts.read(REPO / out)
        assert list(committed["claim"]) == list(fresh["claim"]), out
        assert list(committed["verdict"]) == list(fresh["verdict"]), out
        pd.testing.assert_series_equal(committed["high"].astype(float), fresh["high"].astype(float),
                                       check_names=False, rtol=1e-5)


def test_the_findings_verdict_csv_is_what_the_committed_records_give(committed):
    """results/paper_findings_verdicts.csv: every claim of the table in both worlds, decided as one family."""
    from cmbench.paper.findings import VERDICTS_NAME, verdict_rows
    from cmbench.report import verdicts

    _, findings, second = committed
    fresh = pd.DataFrame([d.row() for d in verdict_rows(findings, second)])
    committed_csv = verdicts.read(REPO / TABLE.parent / VERDICTS_NAME)
    assert list(committed_csv["claim"]) == list(fresh["claim"])
    assert list(committed_csv["verdict"]) == list(fresh["verdict"])
    assert set(committed_csv["family_size"]) == {len(fresh)}  # both worlds, one family
    pd.testing.assert_series_equal(committed_csv["low"].astype(float), fresh["low"].astype(float), check_names=False,
                                   rtol=1e-5)


def test_the_retrieval_block_reads_the_tightest_budget_of_both_tables_and_their_verdicts(tmp_path):
    """The fixed-window table and WorldKV's own rule's, at their largest target PR, best score first; a row both
    tables hold is shown once, with the first table's verdicts; FullKV's score from the first table; each retrieval
    method's words against FullKV and DeCoPrune are its verdict CSV's, the others have none."""
    from cmbench.paper.readme import RETRIEVAL, RETRIEVAL_VERDICTS, retrieval_block
    from cmbench.report.verdicts import EQUIVALENT, LEAD, Claim, decide, write

    columns = ["method", "target_pr", "device_pr", "score", "n_tasks", "peak_kv_mb", "peak_store_mb",
               "moved_per_chunk_mb"]
    full = ["fullkv", 0.0, 0.0, 0.9366, 16, 54.5, None, None]
    fixed = ["worldkv_fixed_window", 0.9, 0.9015, 0.9319, 16, 6.16, 32.11, 2.62]
    (tmp_path / RETRIEVAL[0]).parent.mkdir(parents=True)
    pd.DataFrame([full, fixed, ["decoprune", 0.9, 0.9, 0.8526, 16, 5.2, None, None],
                  ["decoprune", 0.85, 0.86, 0.99, 16, 7.1, None, None]], columns=columns).to_csv(tmp_path / RETRIEVAL[0])
    pd.DataFrame([full, ["worldkv", 0.9, 0.8965, 0.9334, 16, 6.42, 32.77, 3.93], fixed],
                 columns=columns).to_csv(tmp_path / RETRIEVAL[1])

    def claim(a, b, kind, estimate, se):
        return Claim(f"{a} vs {b}", kind, estimate, se, 16, 16, a=a, b=b)

    write(decide([claim("worldkv_fixed_window@0.9", "fullkv", EQUIVALENT, -0.005, 0.005),
                  claim("worldkv_fixed_window@0.9", "decoprune@0.9", LEAD, 0.08, 0.01)]), tmp_path / RETRIEVAL_VERDICTS[0])
    write(decide([claim("worldkv@0.9", "fullkv", EQUIVALENT, -0.004, 0.03),
                  claim("worldkv_fixed_window@0.9", "fullkv", EQUIVALENT, -0.005, 0.03)]), tmp_path / RETRIEVAL_VERDICTS[1])
    text = retrieval_block(tmp_path)
    assert "At a matched 90% device PR on the 16 tasks of `miniworld_quick16` (FullKV 0.937" in text
    assert f"`{RETRIEVAL_VERDICTS[0]}`: 2 claims at level 97.50%" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == ["| worldkv | 0.896 | 0.933 | 6.4 | 32.8 | 3.93 | not resolved against FullKV | — |",
                    "| worldkv_fixed_window | 0.901 | 0.932 | 6.2 | 32.1 | 2.62 | level with FullKV (within ±0.05) | "
                    "ahead of DeCoPrune |",
                    "| decoprune | 0.900 | 0.853 | 5.2 | — | — | — | — |"]


def test_every_rows_words_agree_in_sign_with_its_numbers(committed):
    """No row says a change with a sign its word contradicts ("loses -0.0122"); the RoPE row's FullKV loses exactly
    when its with − without difference is positive, in both worlds."""
    import re

    _, findings, second = committed
    for f in [*findings, *(second or [])]:
        for text in (f.measured, f.outcome):
            assert not re.search(r"\b(loses|gains|leads|trails|ahead of|below|above) [-−]\d", text), (f.number, text)
        said = re.search(r"FullKV (loses|gains) (\d+\.\d+) without", f.outcome)
        if f.number == 4 and said:
            difference = float(re.search(r"fullkv [\d.]+ / [\d.]+ \(with − without (-?[\d.]+)", f.measured)[1])
            assert (said[1] == "loses") == (difference >= 0) and float(said[2]) == pytest.approx(abs(difference),
                                                                                               abs=1e-4)
