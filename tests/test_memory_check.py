"""The memory check's verdicts from hand-built per-task outcomes."""

from __future__ import annotations

import dataclasses

import pytest

from cmbench.benchmarks.memory_check import Outcome, check_configs, no_context_lowest, paired_difference


def outcomes(*values: float) -> dict[str, Outcome]:
    return {f"t{i}": Outcome(similarity=v, pr=0.0, kept_tokens={}) for i, v in enumerate(values)}


def results(none: list[float], streaming: list[float], full: float = 0.95, decoprune: float = 0.8) -> dict:
    n = len(none)
    return {"No context (sink)": outcomes(*none), "Streaming": outcomes(*streaming),
            "FullKV": outcomes(*[full] * n), "DeCoPrune (default)": outcomes(*[decoprune] * n)}


def test_paired_difference_by_hand():
    mean, se = paired_difference(outcomes(0.3, 0.5, 0.4), outcomes(0.1, 0.2, 0.3))
    # differences .2 .3 .1: mean .2, sample sd .1, s.e. .1 / sqrt(3)
    assert mean == pytest.approx(0.2) and se == pytest.approx(0.1 / 3 ** 0.5)


def test_no_context_may_tie_streaming_within_noise_but_not_exceed_it():
    # differences to Streaming +.02 -.01 +.01 -.02 +.01: mean +.002, s.e. .0073: noise, passes
    assert no_context_lowest(results([0.07, 0.04, 0.06, 0.03, 0.06], [0.05, 0.05, 0.05, 0.05, 0.05]))
    # clearly above Streaming on every task (+.10 +- .0): fails
    assert not no_context_lowest(results([0.15, 0.16, 0.14, 0.15, 0.15], [0.05, 0.06, 0.04, 0.05, 0.05]))
    # below Streaming but not below DeCoPrune: fails
    assert not no_context_lowest(results([0.05] * 5, [0.06] * 5, decoprune=0.04))


def test_paired_interval_by_hand():
    from cmbench.benchmarks.memory_check import paired_interval

    mean, low, high = paired_interval(outcomes(0.3, 0.5, 0.4), outcomes(0.1, 0.2, 0.3))
    se = 0.1 / 3 ** 0.5
    assert mean == pytest.approx(0.2) and low == pytest.approx(0.2 - 1.96 * se) and high == pytest.approx(0.2 + 1.96 * se)


def test_the_ablation_settings_are_the_run_settings_without_the_re_index():
    """The RoPE re-index ablation of ``scripts/check_memory.py --rope-ablation`` composes its settings from
    the same config as the run's, only the re-index off (it once read them from the root config, where
    the timesteps are not, and stopped before any task)."""
    cfg, settings, ablation = check_configs("miniworld", ["data.world_seed=3"])
    assert cfg.data.world_seed == 3
    assert settings.reindex and not ablation.reindex
    assert ablation == dataclasses.replace(settings, reindex=False)
    assert settings.sampler.timesteps == tuple(cfg.generation.timesteps)
