"""The method contract check: every registered method passes it, and broken methods fail the right check."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from cmbench.backbones.tiny import DEFAULT_WEIGHTS
from cmbench.cache import KVCache
from cmbench.method_check import check_method, format_results
from cmbench.methods import ChunkSignals, Method, ScoredMethod, method_class, method_names
from optional_methods import method_params

HEAD_MAP = DEFAULT_WEIGHTS.with_name("tiny_miniworld_dynamic_head_map.json")


def config_for(name: str, **knobs) -> dict:
    """A registered method's config as the CLI builds it for the tiny backbone (head maps from the backbone)."""
    cfg = {"name": name, **knobs}
    if "head_map" in {f for f in method_class(name).__dataclass_fields__}:
        cfg.setdefault("head_map", str(HEAD_MAP))
    return cfg


def passed(results) -> dict[str, bool]:
    return {r.name: r.passed for r in results}


@pytest.mark.parametrize("name", method_params())
def test_every_registered_method_meets_the_contract(name):
    results = check_method(config_for(name), context_chunks=4, continuation_chunks=4)
    assert all(r.passed for r in results), format_results(results)
    assert [r.name for r in results] == ["builds", "runs", "provenance", "deterministic", "decisions only",
                                         "PR accounted", "budget"]


@pytest.mark.parametrize("name", method_params(n for n in method_names() if issubclass(method_class(n), ScoredMethod)))
def test_every_scored_method_honours_a_budget(name):
    # 8 context chunks: DeCoPrune keeps the sink and the two newest chunks dense, so 4 could not reach 0.5
    results = check_method(config_for(name, quota_pr=0.5), context_chunks=8, continuation_chunks=3)
    assert all(r.passed for r in results), format_results(results)
    budget = next(r for r in results if r.name == "budget")
    assert "quota_pr 0.500: realised" in budget.detail


@dataclass
class LeavesATrace(Method):
    """Keeps everything, but nudges the newest chunk's stored values: not a keep decision."""

    name = "leaves_a_trace"

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        for bank in cache.all_banks():
            bank.unshare()  # own every row (a fork reads the prefill in place), then write into them
            rows = bank.field("chunk") == sig.chunk.index
            bank.v[:, : bank.n][:, rows] += 0.5


@dataclass
class Nondeterministic(Method):
    """Drops a token chosen by the global random state."""

    name = "nondeterministic"

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        keep = torch.ones(sig.chunk.length, dtype=torch.bool)
        keep[int(torch.randint(sig.chunk.length, ()))] = False
        cache.mark(sig.chunk.index, keep=keep)


@dataclass
class IgnoresItsBudget(ScoredMethod):
    """Declares a target PR but keeps everything."""

    name = "ignores_its_budget"

    def budget_keep(self, bank, newest, allowance, incoming=0):
        return torch.ones(bank.n, dtype=torch.bool)


def test_broken_methods_fail_the_check_that_names_their_fault():
    assert passed(check_method(LeavesATrace(), context_chunks=3, continuation_chunks=2))["decisions only"] is False
    assert passed(check_method(Nondeterministic(), context_chunks=3, continuation_chunks=2))["deterministic"] is False
    results = passed(check_method(IgnoresItsBudget(quota_pr=0.5), context_chunks=3, continuation_chunks=2))
    assert results["budget"] is False and results["decisions only"] is True


def test_a_target_a_short_run_cannot_reach_fails_with_the_longer_run_that_meets_it():
    short = next(r for r in check_method(config_for("decoprune", quota_pr=0.85), continuation_chunks=2)
                 if r.name == "budget")
    assert not short.passed and "BELOW the target" in short.detail and "check.context_chunks=30" in short.detail
    longer = next(r for r in check_method(config_for("decoprune", quota_pr=0.85), context_chunks=30,
                                          continuation_chunks=2) if r.name == "budget")
    assert longer.passed and longer.detail.startswith("quota_pr 0.850: realised 0.8")


def test_a_config_error_is_reported_as_the_failed_build():
    results = check_method({"name": "decoprune", "gamma": "abc", "probe_step": 7})
    assert [(r.name, r.passed) for r in results] == [("builds", False)]
