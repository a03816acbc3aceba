"""Refilling "Score @ 85% PR" of a finished board from new curves, without its runs: the same board a full
leaderboard with those curves writes, only that column changed, and the folder's tables read as data."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from cmbench.cli.main import main
from cmbench.report import ReportError, write_reports
from cmbench.report.gate import FILE as GATE_FILE
from cmbench.report.board_folder import board_folder
from cmbench.report.leaderboard import refresh_matched_column
from test_backbone_gate import GOOD, gate_runs
from test_curves import CURVES
from test_report import record, write_run


def board_runs(tmp_path):
    """FullKV and the no-context control (a gate row) on six tasks, and two methods ``a`` and ``b``."""
    runs = gate_runs(tmp_path, "tiny", *GOOD)
    for label, score in (("a", 0.5), ("b", 0.6)):
        rows = [{**record(label, t, score, pr=0.9), "context_id": t[0], "backbone": "tiny"}
                for t in ("a1", "a2", "b1", "b2", "c1", "c2")]
        runs.append(write_run(tmp_path / label, rows))
    return runs


def test_refilling_the_column_writes_the_board_a_full_leaderboard_with_those_curves_writes(tmp_path):
    runs = board_runs(tmp_path)
    full = tmp_path / "full"
    board_folder(full, ["curves.csv"]).add("curves.csv")  # written by curves, as that command claims it
    CURVES.to_csv(full / "curves.csv", index=False)
    write_reports(runs, full, focus=["a"])  # with the curves from the start (and a comparison)
    old = tmp_path / "old"
    board_folder(old, ["curves.csv"]).add("curves.csv")
    only_a = CURVES[CURVES.method == "a"]
    only_a.to_csv(old / "curves.csv", index=False)
    write_reports(runs, old, focus=["a"])  # made before b's curve
    before = pd.read_csv(old / "leaderboard.csv").set_index("method")
    assert before.loc["a", "score_at_85pr"] == pytest.approx(0.5) and pd.isna(before.loc["b", "score_at_85pr"])
    kept = {name: (old / name).read_bytes() for name in ("leaderboard_by_type.csv", "paired_deltas.csv", "pareto.png")}
    for run in runs:  # the runs are gone: the refill reads only the folder
        shutil.rmtree(run)
    CURVES.to_csv(old / "curves.csv", index=False)

    written = refresh_matched_column(old)

    assert sorted(written) == ["leaderboard.csv", "leaderboard.json", "leaderboard.md"]
    rows = {r["method"]: r for r in json.loads((old / "leaderboard.json").read_text())["rows"]}
    assert rows["b"]["score_at_85pr"] == pytest.approx(0.8 - 0.2 * 0.5) and rows["fullkv"]["score_at_85pr"] is None
    assert rows == {r["method"]: r for r in json.loads((full / "leaderboard.json").read_text())["rows"]}
    after = pd.read_csv(old / "leaderboard.csv").set_index("method")
    assert after.loc["b", "score_at_85pr"] == pytest.approx(0.8 - 0.2 * 0.5)  # b's curve at 0.85, by hand
    assert after.loc["a", "score_at_85pr"] == pytest.approx(0.5) and pd.isna(after.loc["fullkv", "score_at_85pr"])
    assert (old / "leaderboard.md").read_text() == (full / "leaderboard.md").read_text()
    pd.testing.assert_frame_equal(after, pd.read_csv(full / "leaderboard.csv").set_index("method"))
    assert {name: (old / name).read_bytes() for name in kept} == kept  # every other file as it was


def test_a_board_made_without_curves_gains_the_column_and_explicit_curves_are_used(tmp_path):
    runs = board_runs(tmp_path)
    out = tmp_path / "board"
    write_reports(runs, out)
    assert "score_at_85pr" not in pd.read_csv(out / "leaderboard.csv").columns
    elsewhere = tmp_path / "curves_elsewhere.csv"
    CURVES.assign(score=CURVES.score + 0.1).to_csv(elsewhere, index=False)
    refresh_matched_column(out, elsewhere)
    board = pd.read_csv(out / "leaderboard.csv")
    assert list(board.columns).index("score_at_85pr") == 4  # where the leaderboard puts it
    assert board.set_index("method").loc["a", "score_at_85pr"] == pytest.approx(0.6)
    assert "| Score @ 85% PR |" in (out / "leaderboard.md").read_text()


def test_missing_torn_or_foreign_tables_are_refused_in_one_line_naming_the_file(tmp_path):
    runs = board_runs(tmp_path)
    out = tmp_path / "board"
    write_reports(runs, out)
    with pytest.raises(ReportError, match=r"board/curves.csv: no curves file"):
        refresh_matched_column(out)
    CURVES.to_csv(out / "curves.csv", index=False)
    text = (out / "leaderboard.csv").read_text()
    (out / "leaderboard.csv").write_text(text[:-5])
    with pytest.raises(ReportError, match=r"leaderboard.csv: torn: its last line is cut off"):
        refresh_matched_column(out)
    lines = text.splitlines(keepends=True)
    header = lines[0].split(",")
    row = lines[2].split(",")
    row[header.index("score")] = "high"
    (out / "leaderboard.csv").write_text("".join([lines[0], lines[1], ",".join(row), *lines[3:]]))
    with pytest.raises(ReportError, match=r"leaderboard.csv:3: column score: 'high' is not a number"):
        refresh_matched_column(out)
    (out / "leaderboard.csv").write_text("method,score\na,0.5\n")
    with pytest.raises(ReportError, match=r"leaderboard.csv: not a leaderboard table: no column\(s\) metric, score_ci95"):
        refresh_matched_column(out)
    (out / "leaderboard.csv").write_text(text)
    (out / "comparisons.csv").write_text("method,versus\na,b\n")
    with pytest.raises(ReportError, match=r"comparisons.csv: not a comparisons table: no column\(s\) delta, "):
        refresh_matched_column(out)


def test_the_gate_verdict_is_derived_from_its_numbers_and_labels_are_escaped(tmp_path):
    runs = board_runs(tmp_path)
    out = tmp_path / "board"
    write_reports(runs, out)
    CURVES.to_csv(out / "curves.csv", index=False)
    gate = pd.read_csv(out / GATE_FILE)
    # a received folder claims a pass for a flat backbone, with markup in its name and sentence
    gate.loc[0, ["backbone", "delta", "delta_ci95", "passes", "meaning"]] = [
        "<script>x</script>", 0.01, 0.02, True, "<b>all fine</b>"]
    gate.to_csv(out / GATE_FILE, index=False)
    board = pd.read_csv(out / "leaderboard.csv")
    board.loc[board.method == "a", "method"] = "a|<img>"
    board.to_csv(out / "leaderboard.csv", index=False)
    refresh_matched_column(out)
    md = (out / "leaderboard.md").read_text()
    assert "- WARN &lt;script&gt;x&lt;/script&gt;: warning: FullKV is level with the no-context control" in md
    assert "all fine" not in md and "<script>" not in md and "<img>" not in md
    assert "| a\\|&lt;img&gt; | 0.5000 ± " in md


def test_the_command_refills_the_board_without_reading_runs(tmp_path, capsys):
    runs = board_runs(tmp_path)
    out = tmp_path / "board"
    write_reports(runs, out)
    CURVES.to_csv(out / "curves.csv", index=False)
    for run in runs:
        shutil.rmtree(run)
    assert main(["leaderboard", f"leaderboard.out={out}", "leaderboard.refresh_curves=true"]) == 0
    printed = capsys.readouterr().out
    assert "| Score @ 85% PR |" in printed and "(runs not read)" in printed
    assert pd.read_csv(out / "leaderboard.csv").set_index("method").loc["b", "score_at_85pr"] == pytest.approx(0.7)
