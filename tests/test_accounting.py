"""The attention work of a continuation, counted at every model call, against numbers by hand."""

from __future__ import annotations

import pytest
import torch

from cmbench.generation import continue_task, prefill
from cmbench.generation.accounting import CallRecorder, attention_flops, keys_per_token
from cmbench.methods import build_method
from fakes import AttentionBackbone, fake_geometry


G = fake_geometry(num_layers=2, num_heads=2, head_dim=12)  # 4 layer-heads; chunks of 2 frames x 4 tokens = 8
BACKBONE = AttentionBackbone(G, seed=1)
CONTEXT = torch.randn(1, 3, 8, 4, 4, generator=torch.Generator().manual_seed(2))  # 4 context chunks, 32 tokens


def account(method: dict) -> CallRecorder:
    recorder = CallRecorder(BACKBONE)
    continue_task(recorder, prefill(BACKBONE, build_method(method), CONTEXT, None, 0), None, 4, 3)
    return recorder


@pytest.mark.parametrize("method, history", [
    ({"name": "fullkv"}, [32, 40]),  # every token: 4 context chunks, then one more generated chunk
    ({"name": "streaming", "recent_chunks": 1}, [16, 16]),  # the sink chunk and the newest chunk
])
def test_keys_and_flops_by_hand(method, history):
    recorder = account(method)
    # 2 generated chunks x (4 sampler steps + the t = 0 pass); each call: every layer-head reads its
    # history plus the chunk's own 8 keys, for each of the chunk's 8 queries
    assert recorder.calls == [4 * n for n in history for _ in range(5)]
    assert recorder.lengths == [8] * 10
    pairs = sum(5 * 8 * 4 * (n + 8) for n in history)  # (query, key) pairs over layer-heads and calls
    assert keys_per_token(recorder.calls, G, 16, recorder.lengths) == pairs / 16
    assert attention_flops(recorder.calls, G, 1, recorder.lengths) == 4 * 12 * pairs
    assert attention_flops(recorder.calls, G, 1) == 4 * 12 * pairs  # full chunks by default


def test_the_count_is_the_same_every_time_and_falls_with_pruning():
    full, again, pruned = account({"name": "fullkv"}), account({"name": "fullkv"}), account({"name": "decoprune",
                                                                                          "quota_pr": 0.5})
    assert full.calls == again.calls
    assert sum(pruned.calls) < sum(full.calls) and len(pruned.calls) == len(full.calls)
    with pytest.raises(ValueError, match="generated_tokens must be positive"):
        keys_per_token(full.calls, G, 0)
