"""Quota mode (`quota_pr`, `quota_tokens`) keeps its promise: each chunk is decided once, so more budget never loses a kept token.

The scripted backbone (tests/fakes.py) predicts the same ``x0`` whatever the cache holds, so every
method's priorities are the same under every budget: what a run keeps depends on the budget alone.
Geometry: 4 tokens per latent frame, chunks of 2 frames (8 tokens), 2 layers x 2 heads; a 40-frame
context (chunks 0-19: long enough for the sink and DeCoPrune's two dense chunks at PR 0.8) and an
8-frame continuation (chunks 20-23).
"""

import pytest
import torch

from cmbench.generation import continue_task, prefill
from cmbench.methods import build_method
from fakes import ScriptedBackbone, fake_geometry, timeline

G = fake_geometry()
CTX, GEN = 40, 8
PR_TOLERANCE = 0.01  # the realised PR is the target within one point once the window fits the allowance


def backbone() -> ScriptedBackbone:
    """World and discrepancy drawn once (distinct scores and key similarities for every token)."""
    gen = torch.Generator().manual_seed(7)
    world = torch.randn(CTX + GEN, 4, generator=gen)
    d = torch.rand(CTX + GEN, 4, generator=gen)
    return ScriptedBackbone(G, timeline(G, CTX + GEN, lambda gid: world[gid // 4, gid % 4] + 0.1 * gid),
                            timeline(G, CTX + GEN, lambda gid: d[gid // 4, gid % 4]))


def run_recording(cfg: dict) -> tuple[float, list[dict[tuple[int, int], set[int]]]]:
    """Realised PR and, after every chunk, each bank's stored token ids (``(layer, bank) -> gids``)."""
    method, model = build_method(cfg), backbone()
    states: list[dict[tuple[int, int], set[int]]] = []

    def snapshot(cache, sig) -> None:
        states.append({(b.layer, i): set(b.field("gid").tolist())
                       for layer in cache.banks for i, b in enumerate(layer)})

    pre = prefill(model, method, model.world[:, :, :CTX], None, 0, on_chunk_end=snapshot)
    cont = continue_task(model, pre, None, GEN, 1, on_chunk_end=snapshot)
    return cont.ledger.pruning_ratio(), states


def chunk_of(gid: int) -> int:
    return gid // G.tokens_per_chunk


METHODS = [{"name": "decoprune"}, {"name": "random"}, {"name": "tempdiff", "sink_chunks": 1, "recent_chunks": 1}]
IDS = ["decoprune", "random", "tempdiff"]


@pytest.mark.parametrize("cfg", METHODS, ids=IDS)
@pytest.mark.parametrize("budgets", [("quota_pr", 0.8, 0.6), ("quota_tokens", 40, 64)], ids=["quota_pr", "quota_tokens"])
def test_more_budget_never_loses_a_token_less_budget_kept(cfg, budgets):
    knob, small, large = budgets
    _, less = run_recording({**cfg, knob: small})
    _, more = run_recording({**cfg, knob: large})
    assert len(less) == len(more) == (CTX + GEN) // G.chunk_frames
    for step, (a, b) in enumerate(zip(less, more)):
        for bank, kept in a.items():
            lost = kept - b[bank]
            assert not lost, f"{cfg['name']} {knob}: after chunk {step}, bank {bank} keeps {sorted(lost)} " \
                             f"under {small} but not under {large}"
    final_less, final_more = less[-1], more[-1]
    assert any(final_more[k] > final_less[k] for k in final_less), "the larger budget kept nothing more"


@pytest.mark.parametrize("cfg", METHODS, ids=IDS)
def test_a_budget_decides_each_chunk_once(cfg):
    """Between two chunks, only the chunk leaving the window loses tokens; a decided chunk never does."""
    _, states = run_recording({**cfg, "quota_pr": 0.7})
    for step in range(1, len(states)):
        for bank, before in states[step - 1].items():
            dropped = {chunk_of(g) for g in before - states[step][bank]}
            assert len(dropped) <= 1, f"after chunk {step}, bank {bank} dropped tokens of chunks {sorted(dropped)}"
            for chunk in dropped:  # the first time that chunk is pruned; never again afterwards
                for later in states[step + 1:]:
                    assert {g for g in states[step][bank] if chunk_of(g) == chunk} <= later[bank]


@pytest.mark.parametrize("cfg", METHODS, ids=IDS)
@pytest.mark.parametrize("target", [0.5, 0.8])
def test_quota_pr_is_realised_within_tolerance(cfg, target):
    pr, _ = run_recording({**cfg, "quota_pr": target})
    assert abs(pr - target) <= PR_TOLERANCE, (cfg, target, pr)


def dropped_chunks(states: list[dict], bank: tuple[int, int]) -> list[set[int]]:
    """Per step after the first, the chunks that lost tokens in ``bank``."""
    return [{chunk_of(g) for g in states[i - 1][bank] - states[i][bank]} for i in range(1, len(states))]


def test_max_history_tokens_re_evicts_kept_tokens():
    """The hard memory cap is the one mode that takes back tokens of a chunk pruned before."""
    cap = 40
    _, states = run_recording({"name": "decoprune", "gamma": 0.0, "max_history_tokens": cap})
    pruned: set[int] = set()
    again = []
    for step, chunks in enumerate(dropped_chunks(states, (0, 0)), start=1):
        again += [(step, c) for c in chunks & pruned]
        pruned |= chunks
    assert again, "a full cap evicts tokens of chunks it pruned before"
    assert max(len(s[(0, 0)]) for s in states) <= cap
