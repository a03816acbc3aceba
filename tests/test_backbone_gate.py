"""The backbone gate: the leaderboard and the report warn when FullKV is not shown above the no-context control by
more than the margin on a backbone (paired over tasks, clustered by context, decided by the verdict rule: passes,
fails or inconclusive, the backbones of one board one family)."""

from __future__ import annotations

import pandas as pd
import pytest

from cmbench.report import clustered_mean_ci, write_reports
from cmbench.report.gate import FAILS_GATE, FILE, INCONCLUSIVE_GATE, MARGIN, PASSES, backbone_gate, read_gate
from cmbench.report.reading import load_runs
from test_report import record, write_run
from test_report_html import made_runs  # noqa: F401  (a fixture)

TASKS = ("a1", "a2", "b1", "b2", "c1", "c2")


def gate_runs(tmp_path, backbone, full_scores, control_scores, control_config=None):
    def rows(label, method, config, scores):
        return [{**record(label, t, s), "context_id": t[0], "method": method, "method_config": config,
                 "backbone": backbone} for t, s in zip(TASKS, scores)]

    config = {"recent_chunks": 0} if control_config is None else control_config
    full = write_run(tmp_path / backbone / "fullkv", rows("fullkv", "fullkv", {}, full_scores))
    control = write_run(tmp_path / backbone / "sink", rows("sink_only", "streaming", config, control_scores))
    return [full, control]


GOOD = ([0.8, 0.7, 0.9, 0.6, 0.85, 0.75], [0.1, 0.2, 0.1, 0.15, 0.2, 0.1])
FLAT = ([0.26, 0.25, 0.27, 0.26, 0.24, 0.26], [0.25, 0.26, 0.25, 0.26, 0.25, 0.24])


def test_the_gate_pairs_fullkv_with_the_no_context_control_by_hand(tmp_path):
    gate = backbone_gate(load_runs(gate_runs(tmp_path, "tiny", *GOOD)))
    (row,) = gate.itertuples()
    diffs = [f - c for f, c in zip(*GOOD)]
    mean, half = clustered_mean_ci(diffs, [t[0] for t in TASKS])
    assert (row.backbone, row.fullkv, row.no_context, row.n_pairs) == ("tiny", "fullkv", "sink_only", 6)
    assert row.delta == pytest.approx(mean) and row.delta_ci95 == pytest.approx(half)
    assert row.passes and row.verdict == PASSES and mean - half >= MARGIN and "uses its context" in row.meaning
    # a family of one: its simultaneous interval is the 95% one
    assert (row.low, row.high, row.level) == (pytest.approx(mean - half), pytest.approx(mean + half), pytest.approx(0.95))


def test_a_flat_backbone_is_warned_about_on_the_board_and_in_its_files(tmp_path, capsys):
    out = tmp_path / "board"
    paths = write_reports(gate_runs(tmp_path, "self_forcing", *FLAT), out)
    gate = pd.read_csv(paths[FILE])
    assert gate["passes"].tolist() == [False] and gate["backbone"].tolist() == ["self_forcing"]
    warning = "FullKV is level with the no-context control (within ±0.05"
    assert warning in paths["leaderboard.md"].read_text() and "WARN self_forcing" in paths["leaderboard.md"].read_text()
    assert warning in capsys.readouterr().err
    # a clear margin passes, silently
    good = write_reports(gate_runs(tmp_path, "lingbot", *GOOD), tmp_path / "good")
    assert "PASS lingbot" in good["leaderboard.md"].read_text() and warning not in capsys.readouterr().err


def test_a_small_gap_whose_interval_reaches_below_the_margin_is_inconclusive_and_warned(tmp_path):
    full = [s + 0.06 for s in FLAT[1]]  # above the control by 0.06 on average, but not clearly by 0.05
    full[0] -= 0.05
    (row,) = backbone_gate(load_runs(gate_runs(tmp_path, "b", full, FLAT[1]))).itertuples()
    assert row.delta > MARGIN and row.low < MARGIN < row.high and not row.passes
    assert row.verdict == INCONCLUSIVE_GATE and row.meaning.startswith("warning: this board cannot show")


def test_fullkv_below_forgetting_by_more_than_the_margin_fails(tmp_path):
    (row,) = backbone_gate(load_runs(gate_runs(tmp_path, "b", GOOD[1], GOOD[0]))).itertuples()
    assert row.verdict == FAILS_GATE and row.high < -MARGIN and "below the no-context control" in row.meaning


def test_the_backbones_of_one_board_are_one_family(tmp_path):
    """Two backbones: each interval at level 1 - 0.05/2, wider than its 95% interval, and a file read back decides
    them again as one family; a gate file of several backbones without their contexts is refused."""
    runs = [*load_runs(gate_runs(tmp_path, "lingbot", *GOOD)), *load_runs(gate_runs(tmp_path, "self_forcing", *FLAT))]
    gate = backbone_gate(runs)
    assert list(gate["verdict"]) == [PASSES, FAILS_GATE] and list(gate["level"]) == [pytest.approx(0.975)] * 2
    assert all(r.high - r.low > 2 * r.delta_ci95 for r in gate.itertuples())
    gate.to_csv(tmp_path / FILE, index=False)
    again = read_gate(tmp_path / FILE)
    assert list(again["verdict"]) == list(gate["verdict"]) and list(again["low"]) == pytest.approx(list(gate["low"]))
    gate.drop(columns=["contexts"]).to_csv(tmp_path / FILE, index=False)
    with pytest.raises(Exception, match=f"{FILE}: gates 2 backbones without their contexts"):
        read_gate(tmp_path / FILE)
    gate.drop(columns=["contexts"]).iloc[:1].to_csv(tmp_path / FILE, index=False)  # one: its 95% interval
    assert read_gate(tmp_path / FILE)["verdict"].tolist() == [PASSES]


def test_without_the_no_context_control_there_is_no_gate(tmp_path):
    runs = gate_runs(tmp_path, "tiny", *GOOD, control_config={"recent_chunks": 2})  # plain Streaming: not the control
    assert backbone_gate(load_runs(runs)).empty
    paths = write_reports(runs, tmp_path / "board")
    assert FILE not in paths and "Backbone gate" not in paths["leaderboard.md"].read_text()


def test_the_report_shows_the_gate_first(made_runs):  # noqa: F811  (the fixture imported above)
    from cmbench.report.html import build_report
    from test_report_html import record as html_record, table_rows, write_run as html_run

    tmp, data, full, deco = made_runs
    sink = html_run(tmp / "runs", "sink", data, [  # as good as FullKV on this backbone: it fails the gate
        html_record("sink_only", t, c, s, 3, method="streaming", method_config={"recent_chunks": 0})
        for t, c, s in (("syn_a_reappear_01", "a", 0.9), ("syn_a_revisit_01", "a", 0.8), ("real_b_reappear_01", "b", 0.7))])
    text = build_report([full, deco, sink], tmp / "report").index.read_text()
    (row,) = table_rows(text, "gate")
    assert (row["fullkv"], row["no_context"], row["n_pairs"]) == ("fullkv", "sink_only", "3")
    assert "FullKV is level with the no-context control" in row["meaning"] or "cannot show" in row["meaning"]
    assert text.index('id="gate"') < text.index('id="leaderboard"')
    assert 'id="gate"' not in build_report([full, deco], tmp / "plain").index.read_text()
