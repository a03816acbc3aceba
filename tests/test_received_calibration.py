"""A received calibration folder is data: it never chooses the code folder of the next run, and a forged
knob value is not trusted.

- the printed run line's ``CMBENCH_CONFIG_PATH``, the label and the files named come from what CMBench
  computes for the calibration, never from the log's ``yaml``, ``log`` or ``label`` fields;
- the method yaml is kept only when it is exactly what CMBench writes for the log (else rewritten), and
  "wrote ..." names only the files really written;
- a logged value must be one of the log's own probes, the one nearest the target, with the calibration PR
  that probe measured: otherwise the calibration is made again.

Calibrations run with the fakes of tests/test_matched_pr_units.py (no model).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from cmbench.calibration.matched_pr import Calibration, keyed_log_path, log_problem
from cmbench.cli.calibrate import describe, run_line
from cmbench.methods.knobs import Knob
from test_matched_pr_units import SHARE, Window, lab, target  # noqa: F401  (the fixture)


def forge(path: Path, **change) -> None:
    """Rewrite the calibration log at ``path`` with ``change``d fields (its key kept: it is reused)."""
    logged = json.loads(path.read_text())
    path.write_text(json.dumps({**logged, **change}, indent=2) + "\n")


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A folder outside the calibration folder holding a method yaml that imports a payload."""
    folder = tmp_path / "elsewhere"
    (folder / "method").mkdir(parents=True)
    (folder / "method" / "share_pr25.yaml").write_text("_target_: payload.Evil\nname: share\n")
    return folder


def test_a_forged_yaml_field_never_chooses_the_config_path_of_the_run_line(lab, elsewhere, monkeypatch):  # noqa: F811
    monkeypatch.delenv("CMBENCH_CONFIG_PATH", raising=False)
    first = lab.run(SHARE, 0.25)
    for log in (Path(first.log), keyed_log_path(Path(first.log), first.key)):
        forge(log, yaml=str(elsewhere / "method" / "share_pr25.yaml"), log=str(elsewhere / "x.json"),
              label="fullkv")
    again = lab.run(SHARE, 0.25)
    assert again.cached and again.yaml == first.yaml and again.log == first.log and again.label == "share@pr25"
    line = run_line(again, ["limit=8"])
    assert str(elsewhere) not in line and f"CMBENCH_CONFIG_PATH={lab.folder}" in line and "label=share@pr25" in line
    # the logs are rewritten as this calibration's: the forged fields are gone from the folder
    assert Path(first.log).read_text() == first.to_json()
    assert keyed_log_path(Path(first.log), first.key).read_text() == first.to_json()


def test_a_method_yaml_that_is_not_what_cmbench_writes_is_rewritten_and_named(lab):  # noqa: F811
    first = lab.run(SHARE, 0.25)
    yaml_path = Path(first.yaml)
    written = yaml_path.read_text()
    assert describe(first)[-1] == f"wrote {first.yaml}, {first.log} and {keyed_log_path(Path(first.log), first.key)}"
    yaml_path.write_text("_target_: payload.Evil\nname: share\n")
    again = lab.run(SHARE, 0.25)
    assert again.cached and yaml_path.read_text() == written
    assert describe(again)[-1] == f"wrote {first.yaml}"


def test_a_reused_calibration_whose_files_are_its_own_writes_nothing_and_says_so(lab):  # noqa: F811
    first = lab.run(SHARE, 0.25)
    files = [Path(first.yaml), Path(first.log), keyed_log_path(Path(first.log), first.key)]
    stamps = [p.stat().st_mtime_ns for p in files]
    again = lab.run(SHARE, 0.25)
    assert again.cached and again.written == [] and [p.stat().st_mtime_ns for p in files] == stamps
    assert describe(again)[-1] == f"kept {first.yaml} and {first.log} (already this calibration's)"


def test_a_forged_value_inside_the_range_is_not_trusted_and_is_calibrated_again(lab, capsys):  # noqa: F811
    first = lab.run(SHARE, 0.25)
    measured = len(lab.measured)
    keyed = keyed_log_path(Path(first.log), first.key)
    forge(keyed, value=0.0)
    forge(Path(first.log), value=0.0)
    again = lab.run(SHARE, 0.25)
    assert not again.cached and again.value == first.value == 0.25
    assert len(lab.measured) == measured  # its probe is in the probe cache: nothing measured again
    err = capsys.readouterr().err
    assert f"calibrate: calibration log {keyed}: value: share=0.0 is none of the log's 1 probe" in err
    assert keyed.read_text() == again.to_json() and json.loads(Path(first.log).read_text())["value"] == 0.25


KNOB = Knob("gamma", 0.0, 4.0)


def logged(**change) -> Calibration:
    good = Calibration(method="decoprune", label="decoprune@pr90", knob="gamma", value=1.5, calibration_pr=0.9,
                       target_pr=0.9, tolerance=0.005, within_tolerance=True, note="", probes=[[1.0, 0.8], [1.5, 0.9]],
                       data={"root": "suite", "task_ids": ["t0"]}, code={}, key="k1", yaml="m.yaml", log="l.json",
                       reused_probes=[[3.0, 0.97]])
    return Calibration(**{**asdict(good), **change})


@pytest.mark.parametrize("change, said", [
    ({"value": 0.0}, "value: gamma=0.0 is none of the log's 3 probes"),
    ({"value": 1.0, "calibration_pr": 0.8, "within_tolerance": False},
     "value: gamma=1.0 measured PR 0.8000, but the log's probe gamma=1.5 measured PR 0.9000, nearer the target"),
    ({"value": 3.0, "calibration_pr": 0.97, "within_tolerance": False},
     "value: gamma=3.0 measured PR 0.9700, but the log's probe gamma=1.5"),
    ({"calibration_pr": 0.91}, "calibration_pr: is 0.91, but the log's probe gamma=1.5 measured PR 0.9000"),
    ({"within_tolerance": False}, "within_tolerance: is false, but PR 0.9000 is within 0.005 of the target PR 0.9000"),
    ({"quantity": "joules"}, 'quantity: is "joules", expected one of pr, bytes'),
])
def test_a_logged_value_must_be_the_probe_nearest_the_target_with_the_pr_it_measured(change, said):
    assert log_problem(logged(), KNOB) is None
    problem = log_problem(logged(**change), KNOB)
    assert problem is not None and problem.startswith(said), problem


def test_a_bytes_calibration_is_checked_in_its_own_terms():
    """A bytes log's probes are shares saved (searched terms), its target and calibration value bytes kept."""
    good = logged(quantity="bytes", target_pr=0.1, calibration_pr=0.1, probes=[[1.0, 0.8], [1.5, 0.9]])
    assert log_problem(good, KNOB) is None
    assert log_problem(logged(quantity="bytes", target_pr=0.1, calibration_pr=0.9), KNOB).startswith(
        "calibration_pr: is 0.9, but the log's probe gamma=1.5 measured KV bytes / FullKV's 0.1000")


def test_a_whole_valued_knob_off_the_tolerance_is_trusted_at_its_nearest_probe(lab):  # noqa: F811
    """Window PR = 1 - window / 10: the target 0.55 between windows 4 and 5 lands at the nearer one, off the
    tolerance; that honest log is reused, not redone."""
    lab.curve = lambda w: 1 - w / 10
    window = {"_target_": target(Window), "name": "window", "window": 2}
    first = lab.run(window, 0.56)
    assert not first.within_tolerance and first.value == 4
    measured = len(lab.measured)
    assert lab.run(window, 0.56).cached and len(lab.measured) == measured
