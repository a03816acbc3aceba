"""The paper's findings as named experiments: each composes and resolves, job by job of its sweep, on
MiniWorld with the tiny model and on the real path's configs (official data, LingBot World v2 14B)."""

from __future__ import annotations

import itertools

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from cmbench.calibration.target_pr import resolve_target_pr
from cmbench.cli.curves import curve_methods, curve_targets
from cmbench.config_paths import CONFIG_DIR, knob_overrides
from cmbench.data.subsets import load_subset
from cmbench.spec import resolve_run

PATHS = {"miniworld": [], "real": ["data=cmbench", "backbone=lingbot_world_v2_14b"]}
EXPERIMENTS = ("paper_diagnose", "paper_probe_step", "paper_selection", "paper_rope", "paper_short_context",
               "paper_backbone_gate",
               "paper_quality_memory")


def jobs(experiment: str, path: str) -> list:
    """The configs of every job ``run -m experiment=<experiment>`` makes (the sweeper's grid expanded)."""
    base = [f"experiment={experiment}", *PATHS[path]]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        params = compose(config_name="config", overrides=base, return_hydra_config=True).hydra.sweeper.params or {}
        grid = [[f"{key}={value}" for value in str(values).split(",")] for key, values in params.items()]
        return [compose(config_name="config", overrides=knob_overrides([*base, *combo]))
                for combo in itertools.product(*grid)]


def resolved(cfg):
    """``resolve_run`` after what ``method.target_pr`` resolves to: ``null`` as ``run`` resolves it (no
    target), a PR as its calibrated knob would (the calibration is not run)."""
    if cfg.method.get("target_pr") is None:
        return resolve_run(resolve_target_pr(cfg).cfg)
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(cfg):
        cfg.method.pop("target_pr")
    return resolve_run(cfg)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_job_resolves(experiment, path):
    configs = jobs(experiment, path)
    specs = [resolved(c) for c in configs]
    assert all(c.experiment.name == experiment for c in configs)
    real = path == "real"
    for spec in specs:
        tiny = "tiny_short" if experiment == "paper_rope" else "tiny"  # the ablation's short-window weights
        assert (spec.data.name, spec.backbone["name"]) == (("cmbench", "lingbot_world_v2_14b") if real else
                                                            (spec.data.name, tiny))
    subset = {"paper_diagnose": "miniworld_diagnostic8", "paper_rope": "miniworld_diagnostic8",
              "paper_backbone_gate": "miniworld_diagnostic8",
              "paper_probe_step": "miniworld_quick16", "paper_selection": "miniworld_quick16",
              "paper_quality_memory": "miniworld_quick16"}.get(experiment)
    want = None if real or subset is None else load_subset(subset).task_ids
    assert {s.selection.task_ids for s in specs} == {want}


def test_the_sweeps_are_the_papers_arms():
    probe = [(c.method.probe_step, c.method.target_pr) for c in jobs("paper_probe_step", "miniworld")]
    assert sorted(probe) == [(s, t) for s in (1, 2, 3) for t in (0.75, 0.85, 0.9)]
    selection = [(c.method.name, c.method.get("target_pr")) for c in jobs("paper_selection", "real")]
    assert sorted(selection, key=str) == sorted([(m, t) for m in ("decoprune", "random", "decoprune_reverse")
                                                 for t in (None, 0.85)], key=str)
    rope = jobs("paper_rope", "miniworld")
    arms = {(c.method.name, c.generation.rope_reindex, c.label) for c in rope}
    assert arms == {(m, r, f"{m}-reindex_{r}") for m in ("fullkv", "decoprune_hs", "random", "tempdiff",
                                                                      "streaming") for r in (True, False)}
    assert {resolved(c).generation.settings.reindex for c in rope} == {True, False}
    short = jobs("paper_short_context", "miniworld")
    assert {c.method.name for c in short} == {"decoprune", "tempdiff", "forcingkv", "streaming", "random"}
    assert {c.method.target_pr for c in short} == {0.5725}  # the paper's PR, each method at its own knob
    assert {(c.data.name, c.data.clip_frames, c.data.fps) for c in short} == {("miniworld_short", 26, 16)}
    sources = OmegaConf.to_container(short[0].data.sources)
    assert sum(s["reappear"] + s["revisit"] for s in sources.values()) == 18
    assert 6 * 26 / 16 == pytest.approx(10, abs=0.25) and 6 * 26 % 4 == 0  # 10-second contexts, whole chunks
    (quality,) = jobs("paper_quality_memory", "miniworld")
    assert curve_methods(quality) == ["decoprune", "random", "tempdiff", "streaming"]
    assert curve_targets(quality) == [0.75, 0.85, 0.95]
    assert resolved(jobs("paper_diagnose", "miniworld")[0]).method.name == "decoprune"
