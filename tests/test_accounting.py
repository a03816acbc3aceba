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


def test_flops_and_keys_use_the_given_chunk_lengths_and_batch():
    """Per call ``4 B L D (n + L * layer-heads)``; the lengths given replace the full-chunk default."""
    # G: 4 layer-heads, head_dim 12, 8 tokens per chunk; calls see 10 and 20 history keys (summed)
    # call 1: 4 * 3 * 2 * 12 * (10 + 2 * 4) = 288 * 18 = 5184; call 2: 4 * 3 * 5 * 12 * (20 + 5 * 4) = 28800
    assert attention_flops([10, 20], G, 3, [2, 5]) == 5184.0 + 28800.0
    # default lengths are full chunks of 8: 4 * 3 * 8 * 12 * ((10 + 32) + (20 + 32)) = 1152 * 94
    assert attention_flops([10, 20], G, 3) == 1152.0 * 94
    # keys: (2 * (10 + 8) + 5 * (20 + 20)) / 7 = 236 / 7
    assert keys_per_token([10, 20], G, 7, [2, 5]) == pytest.approx(236 / 7)
    # full chunks: (8 * (10 + 32) + 8 * (20 + 32)) / 4 = (336 + 416) / 4 = 188
    assert keys_per_token([10, 20], G, 4) == 188.0


def test_one_generated_token_is_allowed():
    """Only a non-positive token count is refused: one token divides by one."""
    assert keys_per_token([10], G, 1, [2]) == 2 * (10 + 2 * 4)
    with pytest.raises(ValueError, match=r"^generated_tokens must be positive, got -1$"):
        keys_per_token([10], G, -1, [2])


def test_mismatched_lengths_are_refused_with_both_counts():
    with pytest.raises(ValueError, match=r"^2 calls but 1 chunk lengths$"):
        attention_flops([10, 20], G, 1, [8])
    with pytest.raises(ValueError, match=r"^2 calls but 3 chunk lengths$"):
        keys_per_token([10, 20], G, 4, [8, 8, 8])


class _Bank:
    def __init__(self, num_heads, history):
        self.num_heads, self.history = num_heads, history


class _Cache:
    """Just what CallRecorder reads of a KVCache: its banks, each bank's visible history, the open chunk."""

    def __init__(self, banks, current=None):
        self.banks, self.current = banks, current

    def all_banks(self):
        return iter(self.banks)

    def visible_history(self, bank):
        return list(range(bank.history))


class _Inner:
    geometry = G
    label = "inner backbone"

    def denoise(self, x_t, t, cache, frame_start, cond):
        return ("denoised", x_t, t, cache, frame_start, cond)


def test_recorder_passes_every_argument_through_and_logs_the_call():
    """The wrapped backbone gets the call unchanged (the condition included); the recorder logs the
    visible history keys times heads per bank, and the open chunk's length (0 when none is open)."""
    recorder = CallRecorder(_Inner())
    cache = _Cache([_Bank(2, 5), _Bank(3, 1)])
    cond = object()
    assert recorder.denoise("x", 0.5, cache, 4, cond) == ("denoised", "x", 0.5, cache, 4, cond)
    assert recorder.calls == [2 * 5 + 3 * 1] and recorder.lengths == [0]

    class Chunk:
        length = 6

    recorder.denoise("x", 0.0, _Cache([_Bank(2, 5)], Chunk()), 4, cond)
    assert recorder.calls == [13, 10] and recorder.lengths == [0, 6]


def test_recorder_exposes_the_backbone_attributes():
    """Every attribute the recorder does not define is the wrapped backbone's; a missing one stays missing."""
    inner = _Inner()
    recorder = CallRecorder(inner)
    assert recorder.label == "inner backbone" and recorder.inner is inner and recorder.geometry is G
    assert CallRecorder(BACKBONE).w_in is BACKBONE.w_in
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = recorder.no_such_attribute
