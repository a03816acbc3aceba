"""The mutation-testing bookkeeping (scripts/mutation_summary.py): a sampled module's draw is uniform and
repeatable, its score carries a 95% Wilson interval, and the baseline table says which rows are samples."""

import csv
import json
from pathlib import Path

import pytest

@pytest.fixture(scope="module")
def summary():
    """The bookkeeping module (tests/devtools/, outside the ``cmbench`` package)."""
    from devtools import mutation_summary
    return mutation_summary


def test_a_sample_is_repeatable_sorted_without_repeats_and_capped_at_the_population(summary):
    names = [f"m__mutmut_{i}" for i in range(50)]
    drawn = summary.draw_sample(names, 10, seed=3)
    assert drawn == summary.draw_sample(list(reversed(names)), 10, seed=3)  # input order does not matter
    assert drawn == sorted(drawn) and len(set(drawn)) == 10 and set(drawn) <= set(names)
    assert drawn != summary.draw_sample(names, 10, seed=4)
    assert summary.draw_sample(names, 80, seed=0) == sorted(names)
    with pytest.raises(SystemExit, match="at least one mutant, got 0"):
        summary.draw_sample(names, 0, seed=0)


def test_a_sample_draws_every_mutant_equally_often(summary):
    names = [f"m{i}" for i in range(8)]
    counts = dict.fromkeys(names, 0)
    for seed in range(2000):
        for name in summary.draw_sample(names, 2, seed):
            counts[name] += 1
    # each name is expected in 2000 * 2 / 8 = 500 draws; a binomial sd is ~19, so 420-580 is over 4 sd
    assert all(420 <= c <= 580 for c in counts.values()), counts


def test_wilson_interval_by_hand(summary):
    # 190 of 200: p = 0.95, z = 1.96, z^2 = 3.8416; centre = (0.95 + 3.8416/400) / (1 + 3.8416/200)
    # = 0.959604 / 1.019208 = 0.941524; half = 1.96 * sqrt(0.0475/200 + 3.8416/160000) / 1.019208
    # = 1.96 * sqrt(0.0002375 + 0.00002401) / 1.019208 = 1.96 * 0.0161713 / 1.019208 = 0.0311005
    low, high = summary.wilson_interval(190, 200)
    assert low == pytest.approx(0.910424, abs=1e-5) and high == pytest.approx(0.972625, abs=1e-5)
    # all killed: the interval ends at 1 and its low end is n / (n + z^2) = 200 / 203.8416 = 0.981154
    assert summary.wilson_interval(200, 200) == pytest.approx((0.981154, 1.0), abs=1e-5)
    assert summary.wilson_interval(0, 0) == (0.0, 1.0)


def _copy_with(tmp_path: Path, exit_codes: dict[str, int | None], sample: list[str] | None) -> Path:
    """A kept mutmut copy of module ``pkg/mod.py`` holding these exit codes (1 killed, 0 survived, 33 no tests)."""
    meta = tmp_path / "mutants" / "pkg" / "mod.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": exit_codes}))
    if sample is not None:
        (tmp_path / "sample.txt").write_text("\n".join(sample) + "\n")
    return tmp_path


def test_a_sampled_copy_is_scored_on_its_sample_only(summary, tmp_path, capsys):
    pytest.importorskip("mutmut.stats", reason="scoring a copy reads mutmut's status names (the dev extra)")
    codes = {"pkg.mod.f__mutmut_1": 1, "pkg.mod.f__mutmut_2": 0, "pkg.mod.f__mutmut_3": 1, "pkg.mod.f__mutmut_4": 0,
             "pkg.mod.f__mutmut_5": None}
    copy = _copy_with(tmp_path, codes, ["pkg.mod.f__mutmut_1", "pkg.mod.f__mutmut_3", "pkg.mod.f__mutmut_4"])
    assert summary.SAMPLE_FILE == "sample.txt"
    out_csv = tmp_path / "rows.csv"
    equivalent = {"pkg.mod.f__mutmut_4": "listed"}  # the sample's one survivor is equivalent: 2 of 2 counted
    assert summary.summarize(copy, "pkg/mod.py", equivalent, out_csv, 7, ["tests/t.py"], "abc") == 0
    printed = capsys.readouterr().out
    assert "pkg/mod.py: 3 mutants, 2 killed, 1 survived (0 run by no test), 1 equivalent: score 100.0%" in printed
    low, _ = summary.wilson_interval(2, 2)
    assert f"a uniform sample of 3 of 5 mutants; 95% interval {low:.1%}-100.0%" in printed
    row = next(csv.DictReader(out_csv.open()))
    assert (row["mutants"], row["killed"], row["survived"], row["equivalent"], row["population"]) == ("3", "2", "0",
                                                                                                       "1", "5")


def test_a_whole_run_says_nothing_of_samples(summary, tmp_path, capsys):
    pytest.importorskip("mutmut.stats", reason="scoring a copy reads mutmut's status names (the dev extra)")
    copy = _copy_with(tmp_path, {"pkg.mod.f__mutmut_1": 1, "pkg.mod.f__mutmut_2": 33}, None)
    assert summary.summarize(copy, "pkg/mod.py", {}, None, 1, [], "") == 1  # an unexplained survivor
    printed = capsys.readouterr().out
    assert "2 mutants, 1 killed, 1 survived (1 run by no test), 0 equivalent: score 50.0% in 1 s" in printed
    assert "sample" not in printed


def test_the_table_marks_sampled_rows_with_their_interval(summary, tmp_path):
    path = tmp_path / "baseline.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, summary.CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerow({"module": "a.py", "mutants": 10, "killed": 9, "survived": 0, "equivalent": 1,
                         "score": "1.000", "seconds": 5, "population": 10})
        writer.writerow({"module": "b.py", "mutants": 200, "killed": 190, "survived": 10, "equivalent": 0,
                         "score": "0.950", "seconds": 60, "population": 900})
    lines = summary.table(path).splitlines()
    assert lines[2] == "| a.py | 10 | 9 | 0 | 1 | 100.0% | 5 |"
    assert lines[3] == "| b.py | 200 of 900 (sample) | 190 | 10 | 0 | 95.0% (91.0%-97.3%) | 60 |"
    assert lines[4] == "| **all measured** | 210 | 199 | 10 | 1 | 95.2% | 65 |"


def test_a_rerun_skips_the_killed_and_the_listed_equivalents(summary, tmp_path, capsys):
    pytest.importorskip("mutmut.stats", reason="reading a copy's statuses uses mutmut's status names (the dev extra)")
    copy = _copy_with(tmp_path, {"pkg.mod.f__mutmut_1": 1, "pkg.mod.f__mutmut_2": 0, "pkg.mod.f__mutmut_3": 0,
                                 "pkg.mod.f__mutmut_4": None, "pkg.mod.f__mutmut_5": -24}, None)
    listed = tmp_path / "equivalent.txt"
    listed.write_text("pkg.mod.f__mutmut_3 a reason\n")
    assert summary.main(["survivors", str(copy), "pkg/mod.py", "--equivalent", str(listed)]) == 0
    assert capsys.readouterr().out.split() == ["pkg.mod.f__mutmut_2", "pkg.mod.f__mutmut_4"]


def test_an_equivalent_entry_whose_mutant_was_killed_is_reported(summary, tmp_path, capsys):
    """An entry of the equivalent list naming a killed mutant (its function was edited, so the number now names
    another mutant) fails the summary and is named; an entry of another module is not this run's concern."""
    pytest.importorskip("mutmut.stats", reason="scoring a copy reads mutmut's status names (the dev extra)")
    copy = _copy_with(tmp_path, {"pkg.mod.f__mutmut_1": 1, "pkg.mod.f__mutmut_2": 0}, None)
    listed = {"pkg.mod.f__mutmut_1": "stale", "pkg.mod.f__mutmut_2": "a reason", "pkg.other.g__mutmut_1": "elsewhere"}
    assert summary.summarize(copy, "pkg/mod.py", listed, None, 1, [], "") == 1
    printed = capsys.readouterr().out
    assert "2 mutants, 1 killed, 1 survived (0 run by no test), 1 equivalent: score 100.0%" in printed
    assert printed.count("listed as equivalent but killed") == 1 and "pkg.mod.f__mutmut_1 (is the entry" in printed
    assert summary.summarize(copy, "pkg/mod.py", {"pkg.mod.f__mutmut_2": "a reason"}, None, 1, [], "") == 0
