"""``python -m cmbench plan`` with ``method.target_pr``: the caches sized for that PR, as
``backbone.memory.assume_pr`` sizes them, or one line naming what to give instead."""

from __future__ import annotations

import pytest

from cmbench.cli.main import main

LINGBOT = ("plan", "backbone=lingbot_world_v2_14b", "backbone.memory.context_seconds=60",
           "backbone.memory.device_gib=139", "backbone.memory.host_gib=1024")


def plan(capsys, *overrides: str) -> tuple[int, str, str]:
    code = main([*LINGBOT, *overrides])
    out, err = capsys.readouterr()
    return code, out, err


def test_target_pr_sizes_the_caches_as_assume_pr_does(capsys):
    code, out, err = plan(capsys, "method=decoprune", "method.target_pr=0.8")
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == ("method.target_pr=0.8: decoprune's caches sized for PR 0.8, as "
                                   "backbone.memory.assume_pr=0.8 sizes them (run calibrates its gamma to it first)")
    assert "method decoprune: data-dependent: PR 80.00% assumed (backbone.memory.assume_pr)" in out
    _, assumed, _ = plan(capsys, "method=decoprune", "backbone.memory.assume_pr=0.8")
    assert out.splitlines()[1:] == assumed.splitlines()


@pytest.mark.parametrize("overrides, message", [
    (("method=decoprune", "method.target_pr=0.85", "backbone.memory.assume_pr=0.8"),
     "method.target_pr=0.85 and backbone.memory.assume_pr=0.8 both give the PR the caches are sized for: give one"),
    (("method=decoprune", "method.target_pr=0.85", "method.quota_pr=0.85"),
     "method decoprune: method.target_pr runs its own rule at a calibrated knob and method.quota_pr replaces that "
     "rule by a per-chunk quota: give one of them"),
    (("method=decoprune", "method.target_pr=1.5"),
     "method.target_pr=1.5: expected a pruning ratio in [0, 1), e.g. method.target_pr=0.85"),
    (("method=streaming", "method.target_pr=0.85"),
     "method.target_pr=0.85: what streaming keeps follows its recent_chunks, not a pruning ratio: "
     "`python -m cmbench calibrate method=streaming target_pr=0.85` finds its recent_chunks; "
     "plan with method.recent_chunks=<value>"),
])
def test_what_target_pr_cannot_size_is_one_line_naming_the_key(capsys, overrides, message):
    code, out, err = plan(capsys, *overrides)
    assert (code, out, err.strip()) == (1, "", f"cmbench: error: {message}")


def test_a_method_without_a_knob_is_refused_as_calibrate_refuses_it(capsys):
    code, out, err = plan(capsys, "method=fullkv", "method.target_pr=0.85")
    assert code == 1 and out == "" and "method 'fullkv' declares no knob that sets its pruning ratio" in err


def test_without_a_gpu_the_device_planned_for_is_said_to_be_assumed(capsys, monkeypatch):
    """Where no GPU is visible, the 139 GiB the plan checks against is an H200 assumed, not this machine's;
    ``backbone.memory.device_gib`` is a device the user named, and nothing is said."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["plan", "backbone=lingbot_world_v2_1_3b", "method=decoprune", "backbone.memory.context_seconds=60",
            "backbone.memory.host_gib=1024"]
    assert main(args) == 0
    [device] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  device: ")]
    assert device.endswith(" GiB fits 139.00 GiB: an assumed H200, as no GPU is visible here "
                           "(backbone.memory.device_gib=G plans for another device)")
    assert main([*args, "backbone.memory.device_gib=139"]) == 0
    [named] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  device: ")]
    assert named == device.split(": an assumed")[0]
