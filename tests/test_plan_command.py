"""``python -m cmbench plan``: the memory plan of the run ``run`` would make, resolved as ``run`` resolves it."""

from __future__ import annotations

import pytest

from cmbench.cli.main import main

LINGBOT = ("plan", "backbone=lingbot_world_v2_1_3b", "method=decoprune", "method.quota_pr=0.85",
           "backbone.memory.context_seconds=60", "backbone.memory.device_gib=139")


@pytest.mark.parametrize("override, message", [
    ("generation.continuation_frames=0", "generation.continuation_frames=0: expected a whole number >= 1, at most 4096"),
    ("parallel.sequence=0", "parallel.sequence=0: expected a whole number of ranks per model >= 1"),
    ("method.gamma=nan", "method.gamma=nan: expected a finite number"),
    ("data.fps=0", "data.fps=0: expected a finite number > 0"),
])
def test_a_bad_knob_of_any_group_is_refused_in_one_line_before_anything_is_planned(capsys, override, message):
    assert main([*LINGBOT, override]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"cmbench: error: {message}"


def test_the_plan_is_of_the_resolved_run(capsys):
    """The continuation length and the ranks per model come from the resolved run."""
    assert main([*LINGBOT, "generation.continuation_frames=8", "parallel.sequence=2"]) == 0
    out = capsys.readouterr().out
    assert "244 context + 8 continuation latent frames" in out and "one rank of 2 per GPU" in out


def test_a_real_backbone_planned_on_miniworld_says_which_context_and_how_to_plan_the_papers(tmp_path, capsys):
    """Without ``data=``, a real backbone's plan is of MiniWorld's 12 s contexts: the first line names the
    data it planned and the one-minute alternative, so "fits" is not read as the paper's setup."""
    from omegaconf import OmegaConf

    from cmbench.miniworld import build_suite
    from cmbench.shipped import shipped_dir

    data = OmegaConf.load(shipped_dir("configs") / "data" / "miniworld.yaml")
    data.root = str(tmp_path / "mw")
    data.sources = {"synthetic": {"videos": 1, "reappear": 1, "revisit": 0}, "real": {"videos": 1, "reappear": 1, "revisit": 0}}
    build_suite(data)
    assert main(["plan", "backbone=lingbot_world_v2_14b", "method=decoprune", f"data.root={data.root}",
                 "data.sources.synthetic.videos=1", "data.sources.synthetic.revisit=0", "data.sources.real.videos=1",
                 "data.sources.real.revisit=0", "data.check_counts=false"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "(the longest context of data=miniworld (" in first and ", 12.0 s)" in first
    assert "MiniWorld's length, not the paper's: data=cmbench plans its 60 s contexts" in first


def test_a_host_store_too_large_for_the_host_names_the_device_plan_without_offloads(capsys):
    """WorldKV's host store on a one-minute context needs more host memory than this host has, while the
    device would hold the run with no offload at all: the fix says so in words, not with an empty list."""
    assert main(["plan", "backbone=lingbot_world_v2_14b", "method=worldkv", "backbone.memory.context_seconds=60",
                 "backbone.memory.host_gib=64", "backbone.memory.device_gib=139"]) == 1
    printed = capsys.readouterr()
    assert "Fix: it fits the device with no offload given 187.5 GiB of host memory" in printed.out + printed.err
