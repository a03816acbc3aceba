"""Score-vs-PR curves: interpolation and area by hand, the leaderboard's "Score @ 85% PR" from a synthetic
curves.csv, and `python -m cmbench curves` end to end on a few tasks."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd
import pytest

from cmbench.report import write_reports
from cmbench.report.board_folder import board_folder
from cmbench.report.curves import CURVE_COLUMNS, area_table, curve_area, score_at
from test_report import record, write_run

# method a: (0.7, 0.7), (0.8, 0.6), (0.9, 0.4) given out of order; method b: (0.75, 0.8), (0.95, 0.6)
CURVES = pd.DataFrame({"method": ["a", "a", "a", "b", "b"], "test_pr": [0.8, 0.9, 0.7, 0.75, 0.95],
                       "score": [0.6, 0.4, 0.7, 0.8, 0.6]})


def test_score_at_a_pr_is_linear_between_neighbours_and_blank_outside():
    a = CURVES[CURVES.method == "a"]
    assert score_at(a.test_pr, a.score, 0.85) == pytest.approx(0.5)
    assert score_at(a.test_pr, a.score, 0.75) == pytest.approx(0.65)
    assert score_at(a.test_pr, a.score, 0.7) == pytest.approx(0.7)  # an end is inside
    assert math.isnan(score_at(a.test_pr, a.score, 0.95)) and math.isnan(score_at(a.test_pr, a.score, 0.69))
    # points of one PR are averaged: (0.8, 0.5) and (0.8, 0.7) -> 0.6
    assert score_at([0.8, 0.8, 0.9], [0.5, 0.7, 0.4], 0.85) == pytest.approx(0.5)


def test_the_area_is_the_trapezoid_rule_over_the_range_every_method_covers():
    a = CURVES[CURVES.method == "a"]
    # a on [0.75, 0.9]: 0.05 * (0.65 + 0.6) / 2 + 0.1 * (0.6 + 0.4) / 2 = 0.03125 + 0.05
    assert curve_area(a.test_pr, a.score, 0.75, 0.9) == pytest.approx(0.08125)
    assert math.isnan(curve_area(a.test_pr, a.score, 0.75, 0.95))  # beyond the curve
    table = area_table(CURVES).set_index("method")
    assert table.loc["a", "pr_low"] == 0.75 and table.loc["a", "pr_high"] == 0.9  # max of lows, min of highs
    assert table.loc["a", "auc"] == pytest.approx(0.08125) and table.loc["a", "mean_score"] == pytest.approx(0.08125 / 0.15)
    # b on [0.75, 0.9]: 0.8 at 0.75, 0.65 at 0.9: 0.15 * (0.8 + 0.65) / 2
    assert table.loc["b", "auc"] == pytest.approx(0.10875) and table.loc["b", "mean_score"] == pytest.approx(0.725)
    assert table.loc["a", "points"] == 3 and table.loc["b", "points"] == 2
    # no common range: every area is blank
    apart = pd.DataFrame({"method": ["a", "a", "b", "b"], "test_pr": [0.7, 0.75, 0.8, 0.9], "score": [1, 1, 1, 1]})
    assert area_table(apart)["auc"].isna().all()
    assert area_table(apart)[["pr_low", "pr_high"]].isna().all().all()  # not an inverted range (0.8, 0.75)
    single = pd.DataFrame({"method": ["a", "b"], "test_pr": [0.87, 0.83], "score": [0.9, 0.1]})  # one point each
    assert area_table(single)[["pr_low", "pr_high", "auc", "mean_score"]].isna().all().all()


def test_the_leaderboard_gains_score_at_85_pr_from_curves_beside_it(tmp_path):
    full = write_run(tmp_path / "fullkv", [record("fullkv", t, s) for t, s in [("a1", 0.8), ("b1", 0.7)]])
    a = write_run(tmp_path / "a", [record("a", t, s, pr=0.9) for t, s in [("a1", 0.5), ("b1", 0.4)]])
    b = write_run(tmp_path / "b", [record("b", t, s, pr=0.9) for t, s in [("a1", 0.6), ("b1", 0.5)]])
    out = tmp_path / "board"
    board_folder(out, ["curves.csv"]).add("curves.csv")  # written by curves, as that command claims it
    CURVES.to_csv(out / "curves.csv", index=False)
    write_reports([full, a, b], out)
    board = pd.read_csv(out / "leaderboard.csv").set_index("method")
    assert board.loc["a", "score_at_85pr"] == pytest.approx(0.5)
    assert board.loc["b", "score_at_85pr"] == pytest.approx(0.8 - 0.2 * 0.5)
    assert math.isnan(board.loc["fullkv", "score_at_85pr"])  # no curve
    md = (out / "leaderboard.md").read_text()
    assert "| Score @ 85% PR |" in md and "| a | 0.4500 ± " in md and " | 0.5000 | 90.00% |" in md
    assert "interpolated linearly at realised PR 85%" in md and "| fullkv | 0.7500 ± 0.6353 | — | 0.00% |" in md

    # given explicitly; without curves the column is not there
    elsewhere = tmp_path / "elsewhere.csv"
    CURVES.assign(score=CURVES.score + 0.1).to_csv(elsewhere, index=False)
    write_reports([full, a, b], out, curves=elsewhere)
    assert pd.read_csv(out / "leaderboard.csv").set_index("method").loc["a", "score_at_85pr"] == pytest.approx(0.6)
    (out / "curves.csv").unlink()
    write_reports([full, a, b], out)
    assert "score_at_85pr" not in pd.read_csv(out / "leaderboard.csv").columns
    assert "Score @ 85% PR" not in (out / "leaderboard.md").read_text()


def test_a_curves_file_without_its_columns_is_named(tmp_path):
    from cmbench.report import ReportError

    bad = tmp_path / "curves.csv"
    pd.DataFrame({"method": ["a"], "score": [0.5]}).to_csv(bad, index=False)
    with pytest.raises(ReportError, match=r"curves.csv: not a curves table: no column\(s\) test_pr"):
        write_reports([write_run(tmp_path / "a", [record("a", "a1", 0.5)])], tmp_path / "out", curves=bad)


@pytest.mark.slow
def test_the_curves_command_calibrates_runs_and_writes_csv_area_and_plot(tmp_path, monkeypatch, capsys):
    from cmbench.cli.main import main
    from cmbench.report.leaderboard import leaderboard, load_runs
    from test_run_command import SMALL_SUITE
    from test_tiny_backbone import random_model

    weights = tmp_path / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    args = [f"data.root={tmp_path / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}", f"out_dir={tmp_path / 'runs'}",
            "progress=false", "save_videos=false", "calibration.tasks=2", "limit=2"]
    assert main(["curves", *args, "methods=[streaming]", "target_prs=[0.6,0.5,0.999]"]) == 0
    assert "streaming: no point at PR 0.9990: target PR 0.9990 is outside what recent_chunks" in capsys.readouterr().err
    out = tmp_path / "runs" / "miniworld" / "leaderboard"
    curves = first = pd.read_csv(out / "curves.csv")
    quality = ["temporal_flickering", "subject_consistency_light", "background_consistency_light"]  # scorer=light
    assert list(curves.columns) == CURVE_COLUMNS + [f"{q}{s}" for q in quality for s in ("", "_ci_low", "_ci_high")]
    gap = curves[curves.target_pr == 0.999]
    assert gap.test_pr.isna().all() and gap.score.isna().all() and "is outside what recent_chunks" in gap.note.iloc[0]
    curves = curves[curves.target_pr < 0.999]
    assert list(curves.target_pr) == [0.5, 0.6] and list(curves.label) == ["streaming@pr50", "streaming@pr60"]
    assert (curves.knob == "recent_chunks").all() and (curves.n_tasks == 2).all()
    for row in curves.itertuples():  # each point is its run's leaderboard row, at the calibrated knob
        (board,) = leaderboard(load_runs([row.run_dir])).to_dict("records")
        assert row.test_pr == pytest.approx(board["pr"]) and row.score == pytest.approx(board["score"])
        assert row.ci_low == pytest.approx(board["score"] - board["score_ci95"])
        assert "/curves/miniworld/streaming__" in row.run_dir
        for q in quality:  # the quality columns beside the memory score, from the same leaderboard row
            assert getattr(row, q) == pytest.approx(board[q], rel=1e-5)  # curves.csv keeps 6 significant digits
            assert getattr(row, f"{q}_ci_high") == pytest.approx(board[q] + board[f"{q}_ci95"], rel=1e-5)
    # FullKV's row, and every point's metrics normalised to it
    (reference,) = pd.read_csv(out / "curves_reference.csv").to_dict("records")
    (full,) = leaderboard(load_runs([reference["run_dir"]])).to_dict("records")
    assert reference["method"] == "fullkv" and reference["score"] == pytest.approx(full["score"], rel=1e-5)
    table = pd.read_csv(out / "quality_vs_memory.csv").set_index("metric")
    assert list(table.index) == ["light", *quality] and list(table.kind) == ["memory"] + ["quality"] * 3
    in_window = curves[(curves.test_pr >= 0.75) & (curves.test_pr <= 0.95)]
    for column, metric in [("score", "light"), *((q, q) for q in quality)]:
        values = in_window[column] / reference[column]
        assert table.loc[metric, "points"] == len(values)
        if len(values):
            assert table.loc[metric, "range_vs_fullkv"] == pytest.approx(values.max() - values.min(), rel=1e-4, abs=1e-5)
    assert (out / "quality_vs_memory.png").stat().st_size > 10_000
    areas = pd.read_csv(out / "auc.csv")
    assert areas.loc[0, "auc"] == pytest.approx(area_table(curves).loc[0, "auc"], nan_ok=True)
    assert (out / "curves.png").stat().st_size > 10_000
    assert (tmp_path / "runs" / "calibration" / "method" / "streaming_pr60.yaml").is_file()
    capsys.readouterr()
    # a rerun reuses calibrations and runs: nothing is computed again
    assert main(["curves", *args, "methods=[streaming]", "target_prs=[0.6,0.5,0.999]"]) == 0
    text = capsys.readouterr().out
    assert text.count("reused (same calibration)") == 2 and "probe" not in text.split("reused")[0]
    assert pd.read_csv(out / "curves.csv").equals(first)
    # another process writing a run the curves share (FullKV's, while a second curves lane runs it): the
    # curves wait for it and then reuse its records, instead of failing after every point was made
    import threading

    import cmbench.cli.curves as curves_command
    from cmbench.lock import RunLock
    from cmbench.runs.records import records_path

    held, waiting = threading.Event(), threading.Event()
    announce = curves_command.say_waiting

    def announce_and_signal(run_dir, holder):
        announce(run_dir, holder)
        waiting.set()

    monkeypatch.setattr(curves_command, "say_waiting", announce_and_signal)

    def other_writer() -> None:
        with RunLock(records_path(Path(reference["run_dir"]), 1, 0)):
            held.set()
            waiting.wait(300)  # released once the curves wait for it

    writer = threading.Thread(target=other_writer)
    writer.start()
    assert held.wait(30), "the other writer could not take the run's lock"
    try:
        assert main(["curves", *args, "methods=[streaming]", "target_prs=[0.6,0.5,0.999]"]) == 0
    finally:
        waiting.set()
        writer.join()
    waited = capsys.readouterr()
    assert f"curves: waiting for process {os.getpid()}, which is writing {Path(reference['run_dir']).name}" in waited.err
    assert pd.read_csv(out / "curves.csv").equals(first)
    # a method without a knob is refused before any work
    assert main(["curves", *args, "methods=[streaming,fullkv]"]) == 1


def test_an_empty_or_torn_curves_file_is_a_one_line_error(tmp_path):
    from cmbench.report import ReportError
    from cmbench.report.curves import read_curves

    path = tmp_path / "curves.csv"
    path.write_text("")  # a full disk left it empty
    with pytest.raises(ReportError, match=rf"^{path}: empty \(a curves run stopped while writing it\?\)"):
        read_curves(path)
    whole = CURVES.to_csv(index=False)
    path.write_text(whole[: whole.rindex("0.95") + 3])  # cut inside its last row: 0.9 instead of 0.95
    with pytest.raises(ReportError, match=rf"^{path}: torn: its last line is cut off"):
        read_curves(path)
    path.write_text(whole.replace("b,0.75,0.8\n", "b,0.75\n"))
    with pytest.raises(ReportError, match=rf"^{path}:5: 2 fields where the header has 3"):
        read_curves(path)
    path.write_text(whole)
    assert read_curves(path).equals(CURVES)


def test_curves_files_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    from cmbench.report.curves import write_curves
    from cmbench.runs.atomic import OutputError

    curves = CURVES.assign(ci_low=CURVES.score - 0.05, ci_high=CURVES.score + 0.05)
    write_curves(curves, tmp_path, reference=(0.7, 0.05), metric="light")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["auc.csv", "curves.csv", "curves.png"]
    real = pd.DataFrame.to_csv

    def disk_full(self, path, *args, **kwargs):
        real(self.head(1), path, *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", disk_full)
    with pytest.raises(OutputError, match=r"cannot write .*curves\.csv: No space left on device"):
        write_curves(curves.iloc[:2], tmp_path, reference=(0.7, 0.05), metric="light")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
