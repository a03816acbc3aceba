"""`python -m cmbench calibrate`: a method's own knob found for a target PR with the real PR meter on a
calibration world, its yaml runnable as is, integer knobs at the nearest achievable PR, refusals."""

from __future__ import annotations

import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from cmbench.methods.knobs import Knob
from cmbench.calibration.matched_pr import calibration_paths, calibration_probe_key, method_knob, pr_tag
from cmbench.calibration.pruning_ratio import calibration_config
from cmbench.cli.main import main
from cmbench.errors import ConfigError
from cmbench.methods.base import Method
from cmbench.runs.records import read_all_records
from test_run_command import SMALL_SUITE
from test_tiny_backbone import random_model


@dataclass
class KeepFraction(Method):
    """Test method: keeps the first ``round(L / (1 + gamma))`` tokens of every chunk (a known function
    of its knob: larger gamma prunes more)."""

    name = "keep_fraction"
    knob = Knob("gamma", 1e-3, 1e3, increasing=True, log=True)

    gamma: float = 1.0

    def decide(self, cache, sig) -> None:
        length = sig.chunk.length
        keep = torch.zeros(length, dtype=torch.bool)
        keep[: round(length / (1.0 + self.gamma))] = True
        cache.mark(sig.chunk.index, keep=keep, priority=-torch.arange(length, dtype=torch.float32))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("calibrate")
    weights = tmp / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    configs = tmp / "configs" / "method"
    configs.mkdir(parents=True)
    (configs / "keep_fraction.yaml").write_text(f"_target_: {__name__}.KeepFraction\n")
    return tmp, weights


def common(tmp: Path, weights: Path) -> list[str]:
    return [f"data.root={tmp / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}", f"out_dir={tmp / 'runs'}",
            "progress=false"]


def calibrate(setup, monkeypatch, *args: str) -> int:
    tmp, weights = setup
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(tmp / "configs"))
    return main(["calibrate", *common(tmp, weights), "calibration.tasks=2", *args])


@pytest.mark.slow
@pytest.mark.parametrize("target", [0.85, 0.6])
def test_a_synthetic_knob_is_calibrated_within_half_a_point_and_its_yaml_runs_as_logged(setup, monkeypatch, capsys,
                                                                                         target):
    tmp, weights = setup
    assert calibrate(setup, monkeypatch, "method=keep_fraction", f"target_pr={target}") == 0
    out = capsys.readouterr().out
    yaml_path, log_path = calibration_paths(tmp / "runs", "keep_fraction", target)
    log = json.loads(log_path.read_text())
    assert abs(log["calibration_pr"] - target) <= 0.005 and log["within_tolerance"] and log["note"] == ""
    assert log["knob"] == "gamma" and [log["value"], log["calibration_pr"]] in log["probes"]
    assert log["data"]["root"] == f"{tmp / 'suite'}_calibration" and log["data"]["world_seed"] == 1
    assert len(log["data"]["task_ids"]) == 2 and set(log["code"]) >= {"cmbench", "method", "manifest"}
    # the probes follow the method's rule: PR rises with gamma
    probes = sorted(log["probes"])
    assert all(a[1] <= b[1] for a, b in zip(probes, probes[1:]))
    assert f"keep_fraction@{pr_tag(target)}: gamma=" in out and "run it:" in out

    # the yaml, run as printed (on the calibration world's tasks), realises exactly the logged PR and knob
    line = out.split("run it:\n  ")[1].strip()
    assert line.startswith(f"CMBENCH_CONFIG_PATH={yaml_path.parent.parent}:{tmp / 'configs'} {sys.executable} -m cmbench run "
                           f"method={yaml_path.stem} label=keep_fraction@{pr_tag(target)}")
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", f"{yaml_path.parent.parent}:{tmp / 'configs'}")
    runs = tmp / f"check_{pr_tag(target)}"
    code = main(["run", *common(tmp, weights), f"method={yaml_path.stem}", f"data.root={log['data']['root']}",
                 "data.world_seed=1", f"task_ids=[{','.join(log['data']['task_ids'])}]", f"out_dir={runs}",
                 "save_videos=false"])
    assert code == 0
    records = read_all_records(next((runs / "miniworld").iterdir()))
    assert {r["method_config"]["gamma"] for r in records} == {log["value"]}
    assert sum(r["pr"] for r in records) / len(records) == pytest.approx(log["calibration_pr"], abs=1e-12)

    # rerunning the same calibration reuses it: no new probe, same log
    before = log_path.read_text()
    assert calibrate(setup, monkeypatch, "method=keep_fraction", f"target_pr={target}") == 0
    assert "reused (same calibration)" in capsys.readouterr().out and log_path.read_text() == before


@pytest.mark.slow
def test_an_integer_knob_lands_on_the_nearest_achievable_pr_and_says_so(setup, monkeypatch, capsys):
    tmp, _ = setup
    assert calibrate(setup, monkeypatch, "method=streaming", "target_pr=0.5") == 0
    first = json.loads(calibration_paths(tmp / "runs", "streaming", 0.5)[1].read_text())
    prs = dict((int(v), p) for v, p in first["probes"])
    assert all(isinstance(v, int) for v, _ in first["probes"]) and isinstance(first["value"], int)
    # a target halfway between two neighbouring windows' PRs: no whole window reaches it
    window = min(v for v in prs if v + 1 in prs)
    target = round((prs[window] + prs[window + 1]) / 2, 6)
    assert abs(prs[window] - prs[window + 1]) > 0.02  # whole chunks: coarse steps
    assert calibrate(setup, monkeypatch, "method=streaming", f"target_pr={target}") == 0
    out = capsys.readouterr().out
    log = json.loads(calibration_paths(tmp / "runs", "streaming", target)[1].read_text())
    assert not log["within_tolerance"] and log["value"] in (window, window + 1)
    # the second target starts from the first's probes (same method, data, seed and code): none is
    # measured again, and the two neighbouring windows are already known
    assert log["reused_probes"] == sorted(first["probes"]) and log["probe_key"] == first["probe_key"]
    assert not {v for v, _ in log["probes"]} & {v for v, _ in first["probes"]}
    considered = log["probes"] + log["reused_probes"]
    assert abs(log["calibration_pr"] - target) == pytest.approx(min(abs(p - target) for _, p in considered))
    assert log["note"].startswith("recent_chunks takes whole values and none lands within 0.0050 of PR")
    assert "nearest achievable PR" in log["note"] and f"note: {log['note']}" in out
    assert {int(v) for v, _ in considered} >= {window, window + 1}
    assert not math.isnan(log["calibration_pr"])


@pytest.mark.slow
def test_two_calibrations_of_one_target_at_once_measure_it_once(setup):
    """A second calibration of the same method and target while the first runs (another rank of a split
    model, another sweep lane) waits for it and reuses its result instead of measuring the probes again."""
    import os
    import subprocess

    tmp, weights = setup
    env = {**os.environ, "CMBENCH_CONFIG_PATH": str(tmp / "configs"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "cmbench", "calibrate", f"data.root={tmp / 'suite'}", *SMALL_SUITE,
               f"backbone.path={weights}", f"out_dir={tmp / 'concurrent'}", "progress=false", "calibration.tasks=2",
               "method=keep_fraction", "target_pr=0.7"]
    lanes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [lane.communicate(timeout=900) for lane in lanes]
    assert [lane.returncode for lane in lanes] == [0, 0], outputs
    reused = [out for out, _ in outputs if "reused (same calibration)" in out]
    waited = [err for _, err in outputs if "calibrate: waiting for process" in err]
    assert len(reused) == 1 and len(waited) == 1, outputs
    assert "which is calibrating keep_fraction to PR 0.7" in waited[0]
    log = json.loads(calibration_paths(tmp / "concurrent", "keep_fraction", 0.7)[1].read_text())
    assert log["probes"] and abs(log["calibration_pr"] - 0.7) <= 0.005


@pytest.mark.slow
def test_calibrations_of_two_settings_to_one_target_in_one_folder_are_both_kept(setup, monkeypatch, capsys):
    """A sweep over a method setting at one target (probe steps 0, 1, 2 at PR 0.85) calibrates each
    setting once: a resumed sweep reuses every setting's calibration, not only the last one written,
    and the yaml named after the method and target is the calibration last found or reused."""
    tmp, _ = setup
    yaml_path, log_path = calibration_paths(tmp / "runs", "keep_fraction", 0.65)
    assert calibrate(setup, monkeypatch, "method=keep_fraction", "target_pr=0.65") == 0
    first = json.loads(log_path.read_text())
    capsys.readouterr()
    # another calibration setting (one calibration task instead of two): calibrated, then named latest
    assert calibrate(setup, monkeypatch, "method=keep_fraction", "target_pr=0.65", "calibration.tasks=1") == 0
    assert "found" in capsys.readouterr().out
    second = json.loads(log_path.read_text())
    assert second["key"] != first["key"] and len(second["data"]["task_ids"]) == 1
    # the first setting again: reused, no probe measured, and the files named after the target say so
    assert calibrate(setup, monkeypatch, "method=keep_fraction", "target_pr=0.65") == 0
    assert "reused (same calibration)" in capsys.readouterr().out
    assert json.loads(log_path.read_text()) == first
    assert f"gamma: {first['value']}" in yaml_path.read_text()
    # and the second setting too
    assert calibrate(setup, monkeypatch, "method=keep_fraction", "target_pr=0.65", "calibration.tasks=1") == 0
    assert "reused (same calibration)" in capsys.readouterr().out
    assert json.loads(log_path.read_text()) == second


@pytest.mark.slow
def test_a_target_out_of_reach_is_refused_again_without_measuring_its_probes_again(setup, monkeypatch, capsys):
    """The probes of a calibration that finds its target out of the knob's reach are kept, so asking again
    (a rerun of the curves, whose last target no knob value reaches) refuses at once."""
    assert calibrate(setup, monkeypatch, "method=streaming", "target_pr=0.999", "calibration.tasks=1") == 1
    first = capsys.readouterr()
    assert "target PR 0.9990 is outside what recent_chunks" in first.err and "probe recent_chunks=" in first.out
    assert calibrate(setup, monkeypatch, "method=streaming", "target_pr=0.999", "calibration.tasks=1") == 1
    again = capsys.readouterr()
    assert "probe recent_chunks=" not in again.out and "probe 1: task" not in again.out
    assert again.err.splitlines()[-1] == first.err.splitlines()[-1]


@pytest.mark.parametrize("method, message", [
    ("fullkv", "method 'fullkv' declares no knob that sets its pruning ratio"),
    ("dummyforcing", "method 'dummyforcing' declares no knob that sets its pruning ratio"),
])
def test_a_method_without_a_knob_is_refused_in_one_line(setup, monkeypatch, capsys, method, message):
    assert calibrate(setup, monkeypatch, f"method={method}", "target_pr=0.85") == 1
    err = capsys.readouterr().err
    assert message in err and "methods with one: decoprune" in err and len(err.strip().splitlines()) == 1


def test_quota_mode_and_bad_targets_are_refused(setup, monkeypatch, capsys):
    assert calibrate(setup, monkeypatch, "method=decoprune", "method.quota_pr=0.8", "target_pr=0.85") == 1
    assert "method.quota_pr=0.8 puts it in quota mode" in capsys.readouterr().err
    assert calibrate(setup, monkeypatch, "method=decoprune", "method.target_pr=0.8", "target_pr=0.85") == 1
    assert "method.target_pr=0.8 asks for the calibration this command makes: give the target as target_pr=0.8" in \
        capsys.readouterr().err
    assert calibrate(setup, monkeypatch, "method=decoprune") == 1
    assert "target_pr is required" in capsys.readouterr().err
    assert calibrate(setup, monkeypatch, "method=decoprune", "target_pr=1.5") == 1
    assert "target_pr=1.5: expected a pruning ratio in [0, 1)" in capsys.readouterr().err
    assert calibrate(setup, monkeypatch, "method=decoprune", "target_pr=0.8", "calibration.tasks=0") == 1
    assert "calibration.tasks=0: expected a positive number" in capsys.readouterr().err


def run_dir_of(out_dir: Path) -> Path:
    (run_dir,) = [p for p in (out_dir / "miniworld").iterdir() if p.is_dir() and p.name != "leaderboard"]
    return run_dir


CALIBRATED = ("label", "target_pr", "calibration_pr", "recorded_ns", "prefill_seconds", "continuation_seconds",
              "continuation_fps", "machine")


@pytest.mark.slow
def test_method_target_pr_runs_the_calibrated_knob_exactly_as_that_knob_value_does(setup, monkeypatch, capsys, tmp_path):
    tmp, weights = setup
    args = ["run", *common(tmp, weights), "method=decoprune", "calibration.tasks=1", "calibration.tolerance=0.02",
            "limit=2", "save_videos=false", f"out_dir={tmp_path / 'target'}"]
    assert main([*args, "method.target_pr=0.5"]) == 0
    err = capsys.readouterr().err
    log = json.loads(calibration_paths(tmp_path / "target", "decoprune", 0.5)[1].read_text())
    assert "decoprune: method.target_pr=0.5: calibrating its gamma" in err and f"gamma={log['value']} (found)" in err
    assert log["within_tolerance"] and abs(log["calibration_pr"] - 0.5) <= 0.02
    calibrated = read_all_records(run_dir_of(tmp_path / "target"))
    assert len(calibrated) == 2 and {r["label"] for r in calibrated} == {"decoprune@pr50"}
    for r in calibrated:
        assert r["target_pr"] == 0.5 and r["calibration_pr"] == log["calibration_pr"]
        assert r["method_config"]["gamma"] == log["value"] and "target_pr" not in r["method_config"]
        assert r["method_config"]["quota_pr"] is None  # its own rule, no quota
    # the same records as the knob value given directly (another folder: really recomputed)
    assert main([*args[:-1], f"out_dir={tmp_path / 'direct'}", f"method.gamma={log['value']!r}"]) == 0
    direct = read_all_records(run_dir_of(tmp_path / "direct"))
    assert run_dir_of(tmp_path / "direct").name == run_dir_of(tmp_path / "target").name

    def same(records):
        return sorted(json.dumps({k: v for k, v in r.items() if k not in CALIBRATED}, sort_keys=True) for r in records)

    assert same(calibrated) == same(direct)
    assert {r["target_pr"] for r in direct} == {None} and {r["label"] for r in direct} == {f"decoprune@gamma={log['value']!r}"}
    # a second run reuses the calibration (no probe) and the records
    capsys.readouterr()
    assert main([*args, "method.target_pr=0.5"]) == 0
    out = capsys.readouterr()
    assert "probe" not in out.err and f"gamma={log['value']} (reused)" in out.err and "(0 run now, 2 cached)" in out.out


@pytest.mark.slow
def test_a_target_pr_sweep_ends_with_one_leaderboard_row_per_method_and_target(setup, monkeypatch, capsys, tmp_path):
    tmp, weights = setup
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(tmp / "configs"))
    assert main(["run", "-m", *common(tmp, weights), "method=keep_fraction,streaming", "method.target_pr=0.4,0.6",
                 "calibration.tasks=1", "calibration.tolerance=0.05", "limit=1", "save_videos=false",
                 f"out_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    cells = {line.split("|")[1].strip() for line in out.splitlines() if line.startswith(("| keep", "| stream"))}
    rows = sorted({cell.removesuffix(" §") for cell in cells})
    assert rows == ["keep_fraction@pr40", "keep_fraction@pr60", "streaming@pr40", "streaming@pr60"]
    # the board marks every entry suspect (§): the random-weight model's frames are noise, which does not continue
    # the context (continuity about 0.22, threshold 0.07), whatever the method
    assert all(f"| {row} § |" in out for row in rows)


def test_method_target_pr_refusals_are_one_line_before_any_work(setup, monkeypatch, capsys, tmp_path):
    tmp, weights = setup
    for extra, message in [
        (["method=decoprune", "method.target_pr=0.8", "method.quota_pr=0.5"],
         "method decoprune: method.target_pr runs its own rule at a calibrated knob and method.quota_pr replaces"),
        (["method=fullkv", "method.target_pr=0.8"], "method 'fullkv' declares no knob that sets its pruning ratio"),
        (["method=decoprune", "method.target_pr=0.8", "calibration.max_probes=1"], "calibration.max_probes=1"),
    ]:
        assert main(["run", *common(tmp, weights), *extra, f"out_dir={tmp_path}"]) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not tmp_path.joinpath("miniworld").exists() and not tmp_path.joinpath("calibration").exists()


def test_an_unresolved_target_pr_is_refused_where_a_method_is_built():
    from cmbench.methods.registry import build_method

    with pytest.raises(ConfigError, match="method.target_pr=0.8 runs the method's own rule at the knob calibrated"):
        build_method({"name": "decoprune", "target_pr": 0.8})


def test_calibrate_honours_threads(setup, monkeypatch, capsys):
    before = torch.get_num_threads()
    try:
        assert calibrate(setup, monkeypatch, "threads=3", "method=fullkv", "target_pr=0.85") == 1  # refused after setup
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_the_printed_run_line_uses_the_interpreter_that_ran_calibrate(tmp_path, monkeypatch):
    from cmbench.calibration.matched_pr import Calibration
    from cmbench.cli.calibrate import run_line

    monkeypatch.setattr(sys, "executable", "/opt/my env/bin/python3")
    monkeypatch.delenv("CMBENCH_CONFIG_PATH", raising=False)
    yaml = tmp_path / "calibration" / "method" / "decoprune_pr85.yaml"
    cal = Calibration(method="decoprune", label="decoprune@pr85", knob="gamma", value=0.1, calibration_pr=0.85,
                      target_pr=0.85, tolerance=0.005, within_tolerance=True, note="", probes=[], data={}, code={},
                      key="", yaml=str(yaml), log="")
    assert run_line(cal, ["limit=8"]) == (f"CMBENCH_CONFIG_PATH={tmp_path / 'calibration'} '/opt/my env/bin/python3' -m "
                                          "cmbench run method=decoprune_pr85 label=decoprune@pr85 limit=8")


def test_a_calibration_shows_each_task_of_a_probe_with_the_time_left_and_each_probe_with_what_is_left():
    from cmbench.calibration.progress import CalibrationProgress

    now = [0.0]
    out = io.StringIO()
    shown = CalibrationProgress("gamma", 6, stream=out, clock=lambda: now[0], header="calibrating decoprune")
    for seconds, done in ((10, 1), (20, 2), (40, 4)):
        now[0] = seconds
        shown.task(done, 4)
    shown.probe(0.031, 0.8473)
    now[0] = 70
    shown.task(1, 4)
    assert out.getvalue().splitlines() == [
        "calibrating decoprune",
        "    probe 1: task 1/4, 10s, ~30s left in this probe",
        "    probe 1: task 2/4, 20s, ~20s left in this probe",
        "    probe 1: task 4/4, 40s",
        "  probe gamma=0.031: PR 0.8473 (40s; at most 5 more probe(s), ~40s each)",
        "    probe 2: task 1/4, 30s, ~1m30s left in this probe",
    ]


def test_every_declared_knob_is_a_field_of_its_method_and_the_documented_directions_hold():
    from dataclasses import fields

    from cmbench.methods.registry import method_class, method_names

    knobs = {n: method_class(n).knob for n in method_names()}
    assert knobs["fullkv"] is None and knobs["dummyforcing"] is None
    for name, knob in knobs.items():
        if knob is not None:
            assert knob.name in {f.name for f in fields(method_class(name))}, name
    assert knobs["decoprune"].increasing and knobs["random"] == knobs["decoprune"] == knobs["decoprune_hs"]
    assert not knobs["decoprune_reverse"].increasing and knobs["decoprune_reverse"].log
    for name in ("tempdiff", "forcingkv", "streaming", "worldkv", "key_retrieval"):
        assert knobs[name].integer and not knobs[name].increasing, name
    assert method_knob({"name": "tempdiff"}).name == "k"


def test_the_calibration_world_is_never_the_test_suite():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"data": {"name": "miniworld", "adapter": "miniworld", "root": "data/miniworld",
                                     "world_seed": 0, "check_counts": True}, "calibration": {"root": None}})
    cal = calibration_config(cfg)
    assert cal.data.root == "data/miniworld_calibration" and cal.data.world_seed == 1 and not cal.data.check_counts
    official = OmegaConf.create({"data": {"name": "cmbench", "adapter": "cmbench", "root": "/x/CMBench"},
                                 "calibration": {"root": None}})
    with pytest.raises(ConfigError, match="calibration.root is not set: data=cmbench has no built-in calibration"):
        calibration_config(official)
    official.calibration.root = "/x/CMBench/"
    with pytest.raises(ConfigError, match="is the test suite's folder"):
        calibration_config(official)
    official.calibration.root = "/x/CMBench_calibration"
    assert calibration_config(official).data.root == "/x/CMBench_calibration"


def test_a_calibration_is_keyed_by_what_files_hold_not_where_cmbench_is_installed(monkeypatch):
    import cmbench.identity.code as identity

    def key(root: Path, weights: str = "backbones/weights/tiny_miniworld.safetensors") -> str:
        return calibration_probe_key({"method": {"name": "decoprune"}, "backbone": {"path": str(root / weights)},
                                      "data": {"root": "data/miniworld_calibration"}, "seed": 2})

    here = key(identity.PACKAGE_ROOT)
    monkeypatch.setattr(identity, "PACKAGE_ROOT", Path("/another/checkout/cmbench"))
    assert key(Path("/another/checkout/cmbench")) == here  # the same weights of another checkout
    assert key(Path("/another/checkout/cmbench"), "backbones/weights/other.safetensors") != here
    assert key(Path("/elsewhere")) != here  # weights outside the package stay absolute


@pytest.mark.parametrize("budget", [{"quota_pr": 0.8}, {"quota_tokens": 1000}])
def test_a_method_in_quota_mode_has_no_knob_to_calibrate(budget):
    """``quota_pr`` and ``quota_tokens`` both replace the method's own rule: calibrate refuses either."""
    ((key, value),) = budget.items()
    with pytest.raises(ConfigError, match=rf"method\.{key}={value} puts it in quota mode.*drop method\.{key}$"):
        method_knob({"name": "decoprune", **budget})
    assert method_knob({"name": "decoprune"}).name == "gamma"


@pytest.mark.parametrize("probes, why", [
    ([["0.5", 0.8]], 'probe 0 is ["0.5", 0.8], not a [value, PR] pair of numbers'),
    ([[0.5, 0.8, 1]], "probe 0 is [0.5, 0.8, 1], not a [value, PR] pair"),
    ([[0.5, 0.8], [0.7, 1.5]], "probe 1 is [0.7, 1.5]: the value must be finite and the PR within [0, 1]"),
    ([[float("nan"), 0.8]], "probe 0 is [nan, 0.8]: the value must be finite"),
    ([[True, 0.8]], "not a [value, PR] pair of numbers"),
    ({"0.5": 0.8}, "'probes' is dict, not a list of [value, PR] pairs"),
])
def test_a_damaged_probes_file_is_ignored_with_its_name_and_fault_and_measured_again(tmp_path, capsys, probes, why):
    """Calibration folders are shared like run folders: a probes file whose entries are not [value, PR]
    pairs of finite numbers (PR in [0, 1]) is a cache miss named on stderr, never a crash or a PR trusted,
    while the sound files beside it still count; the next probe kept rewrites it whole."""
    from cmbench.calibration.matched_pr import keep_probe, probes_path, shared_probes

    damaged = probes_path(tmp_path, "decoprune", "k1")
    damaged.parent.mkdir(parents=True)
    damaged.write_text(json.dumps({"method": "decoprune", "probe_key": "k1", "probes": probes}))
    (tmp_path / "decoprune_pr85.json").write_text(
        json.dumps({"method": "decoprune", "probe_key": "k1", "probes": [[0.01, 0.84], [0.02, 0.9]]}))
    assert shared_probes(tmp_path, "decoprune", "k1") == {0.01: 0.84, 0.02: 0.9}
    err = capsys.readouterr().err
    assert f"calibrate: ignoring the probes in {damaged}: " in err and why in err
    keep_probe(tmp_path, "decoprune", "k1", 0.03, 0.95)
    assert json.loads(damaged.read_text())["probes"] == [[0.03, 0.95]]
    capsys.readouterr()
    assert shared_probes(tmp_path, "decoprune", "k1") == {0.01: 0.84, 0.02: 0.9, 0.03: 0.95}
    assert capsys.readouterr().err == ""
