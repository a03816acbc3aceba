"""A calibration that is not reused says why: which setting of the last calibration to the same target
differs (``calibration.tasks=8``, this one 4). Another setting gives another knob value, so it is
calibrated again; the message only says so. :func:`calibrate_method` runs with fakes for the calibration
tasks, the code identity and the PR meter (the PR is the knob itself), as in test_matched_pr_units.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import cmbench.calibration.matched_pr as matched_pr
from cmbench.calibration.matched_pr import calibrate_method
from cmbench.methods.base import Method
from cmbench.methods.knobs import Knob


@dataclass
class Share(Method):
    """Test method: the fake meter's PR is its knob ``share``."""

    name = "share"
    knob = Knob("share", 0.0, 0.9)

    share: float = 0.25


SHARE = {"_target_": f"{__name__}.Share", "name": "share", "share": 0.25}


@pytest.fixture
def calibrate(tmp_path, monkeypatch):
    """``calibrate(n_tasks=4, code="c0de", **root_config_overrides)``: a calibration of Share to PR 0.25."""
    code = {"hash": "c0de"}
    monkeypatch.setattr(matched_pr, "calibration_tasks",
                        lambda cal_cfg, n: [SimpleNamespace(task_id=f"t{i}") for i in range(n)])
    monkeypatch.setattr(matched_pr, "code_identity", lambda cls, backbone, manifest: SimpleNamespace(
        hash=code["hash"], parts={"cmbench": code["hash"], "manifest": "m"}))

    class Meter:
        def __init__(self, cfg, tasks, on_task=None, quantity=None):
            pass

        def __call__(self, method):
            return method.share

    monkeypatch.setattr(matched_pr, "PRMeter", Meter)

    def run(n_tasks: int = 4, code_hash: str = "c0de", **over):
        code["hash"] = code_hash
        cfg = OmegaConf.create({
            "method": SHARE, "seed": 2, "sample_seed": 2, "out_dir": str(tmp_path / "runs"),
            "calibration": {"root": None},
            "data": {"name": "miniworld", "adapter": "miniworld", "root": str(tmp_path / "suite"), "world_seed": 0,
                     "manifest": "manifest.jsonl"},
            "backbone": {"name": "tiny", "path": "w.safetensors"}, "generation": {"continuation_frames": 8}})
        for key, value in over.items():
            OmegaConf.update(cfg, key.replace("__", "."), value)
        return calibrate_method(cfg, 0.25, n_tasks=n_tasks)

    return run


def said(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("calibrate: ")]


def test_another_task_count_is_named_with_both_values(calibrate, capsys, tmp_path):
    first = calibrate(n_tasks=8)
    assert said(capsys) == []  # nothing before: nothing to explain
    assert not calibrate(n_tasks=4).cached
    log = tmp_path / "runs" / "calibration" / "share_pr25.json"
    assert said(capsys) == [f"calibrate: calibration log {log} was made with calibration.tasks=8, this one with "
                            f"calibration.tasks=4: calibrating again (another setting gives another share)"]
    assert calibrate(n_tasks=8) == first and said(capsys) == []  # the same setting again: reused, nothing said


def test_every_setting_that_differs_is_named_up_to_three(calibrate, capsys):
    calibrate()
    calibrate(seed=3, generation__continuation_frames=4, backbone__path="v.safetensors", data__world_seed=1)
    [line] = said(capsys)
    assert ("was made with backbone.path=w.safetensors, data.world_seed=0, generation.continuation_frames=8 and "
            "1 more, this one with backbone.path=v.safetensors, data.world_seed=1, generation.continuation_frames=4 "
            "and 1 more: calibrating again") in line


def test_a_knob_of_the_method_and_other_code_are_named(calibrate, capsys):
    calibrate()
    calibrate(method__sink_chunks=2)
    assert "with method.sink_chunks=unset, this one with method.sink_chunks=2:" in said(capsys)[0]
    calibrate(code_hash="beef", method__sink_chunks=2)
    assert "was made by other code (its cmbench part): calibrating again" in said(capsys)[0]


def test_a_log_from_before_settings_were_logged_names_what_it_holds(calibrate, capsys, tmp_path):
    """An earlier CMBench's log has no ``setting``: its task count, calibration folder and tolerance are
    read from the fields it has."""
    calibrate(n_tasks=8)
    log = tmp_path / "runs" / "calibration" / "share_pr25.json"
    old = json.loads(log.read_text())
    del old["setting"]
    log.write_text(json.dumps(old))
    calibrate(n_tasks=4)
    assert "made with calibration.tasks=8, this one with calibration.tasks=4:" in said(capsys)[0]
    old["tolerance"] = 0.01
    log.write_text(json.dumps({**old, "data": {**old["data"], "task_ids": ["t0", "t1", "t2", "t3"]}}))
    calibrate(n_tasks=4, seed=5)
    assert "made with calibration.tolerance=0.01, this one with calibration.tolerance=0.005:" in said(capsys)[0]
    log.write_text(json.dumps({**old, "tolerance": 0.005, "data": {**old["data"], "task_ids": ["t0", "t1", "t2", "t3"]}}))
    calibrate(n_tasks=4, seed=6)
    assert said(capsys) == [f"calibrate: calibration log {log} was made with other settings than this one (its log "
                            "predates the settings it records): calibrating again (another setting gives another "
                            "share)"]


def test_a_calibration_redone_because_its_own_files_are_gone_says_nothing(calibrate, capsys, tmp_path):
    first = calibrate()
    (tmp_path / "runs" / "calibration" / "keyed" / f"share_pr25_{first.key}.json").unlink()
    (tmp_path / "runs" / "calibration" / "method" / "share_pr25.yaml").unlink()
    assert not calibrate().cached and said(capsys) == []
