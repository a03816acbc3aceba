"""Ctrl-C during a calibration: one line saying how many finished probes are kept and where (a rerun starts
from them, measuring none of them again), never a bare ``cmbench: ``. Calibrations run with the fakes of
tests/test_matched_pr_units.py (no model)."""

from __future__ import annotations

import importlib
import json

import pytest

from cmbench.calibration.matched_pr import probes_path
from test_matched_pr_units import SHARE, lab  # noqa: F401  (the fixture)

cli_main = importlib.import_module("cmbench.cli.main")  # the module (the package exports its function)


def test_an_interrupted_calibration_names_the_probes_it_kept_and_a_rerun_starts_from_them(lab):  # noqa: F811
    calls = []

    def curve(value):
        calls.append(value)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C during the third probe
        return value / 2  # PR half the knob: 0.25 -> 0.125, never on target at once

    lab.curve = curve
    with pytest.raises(KeyboardInterrupt) as caught:
        lab.run(SHARE, 0.4)
    folder = lab.folder / "keyed"
    kept = sorted(folder.glob("share_probes_*.json"))
    assert len(kept) == 1 and str(caught.value) == (
        f"interrupted; 2 finished probes kept in {kept[0]} (a rerun starts from them)")
    assert kept[0] == probes_path(lab.folder, "share", json.loads(kept[0].read_text())["probe_key"])
    assert [v for v, _ in json.loads(kept[0].read_text())["probes"]] == sorted(calls[:2])
    lab.curve = lambda value: value / 2
    measured = len(lab.measured)
    result = lab.run(SHARE, 0.4)
    assert result.reused_probes == [[v, v / 2] for v in sorted(calls[:2])]
    assert all(v not in calls[:2] for v, _ in lab.measured[measured:])  # none of them measured again


def test_ctrl_c_prints_its_message_and_a_bare_one_says_interrupted(monkeypatch, capsys):
    for raised, said in ((KeyboardInterrupt("interrupted; 2 finished probes kept in x.json"),
                          "cmbench: interrupted; 2 finished probes kept in x.json\n"),
                         (KeyboardInterrupt(), "cmbench: interrupted\n")):
        def stopped(argv, raised=raised):
            raise raised

        monkeypatch.setattr(cli_main, "_main", stopped)
        assert cli_main.main(["calibrate"]) == cli_main.INTERRUPTED
        assert capsys.readouterr().err == said
