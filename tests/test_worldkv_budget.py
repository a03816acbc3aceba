"""``worldkv`` fills a fixed device budget as WorldKV's code does, counted by hand through the real loop.

Geometry (tests/fakes.py): 4 tokens per latent frame, chunks of 2 frames (8 tokens), 2 layers x 2 heads;
a random attention backbone whose camera turns in place (one yaw per chunk). ``keep_ratio`` 0.5 stores
``4 + 1 * ceil(0.5 * 4) = 6`` tokens of a chunk. The budget, the chunk being denoised included, is
``sink + retrieval_frames + (recent_chunks + 1) chunks`` of frames (WorldKV: ``sink_size + retrieval_frames
+ recent_size``, its recent window reading the current chunk and the one before):

- while no chunk can be retrieved, the whole budget is a rolling window (the sink, then the newest frames);
- once one can, the device holds the sink, the retrieved chunks and ``recent_chunks`` chunks before the
  current one; unfilled slots stay free; the chunk just before the recent window is not seen.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from cmbench.errors import ConfigError
from cmbench.generation import continue_task, prefill
from cmbench.methods import build_method
from cmbench.methods.worldkv import WorldKV
from fakes import AttentionBackbone, fake_geometry

G = fake_geometry()
F, T, L = G.chunk_frames, G.tokens_per_frame, G.tokens_per_chunk  # 2 frames, 4 tokens, 8 tokens
STORED = 6  # a compressed chunk: the anchor frame (4) and ceil(0.5 * 4) = 2 tokens of the other frame
YAW = [0.0, 1.0, 2.0, 0.5, 3.0, 0.1, 1.9, 0.9, 2.1]  # per chunk (context 0-5, continuation 6-8)


class TurningBackbone(AttentionBackbone):
    """The fake attention model with a camera that turns in place by ``YAW[chunk]``."""

    def camera_poses(self, cond) -> torch.Tensor:
        yaw = torch.tensor(YAW, dtype=torch.float64).repeat_interleave(F)
        poses = torch.eye(4, dtype=torch.float64).repeat(len(yaw), 1, 1)
        poses[:, 0, 0], poses[:, 0, 2], poses[:, 2, 0], poses[:, 2, 2] = yaw.cos(), yaw.sin(), -yaw.sin(), yaw.cos()
        return poses


def run(method: WorldKV, context_chunks: int = 6, generated_chunks: int = 3):
    """Per chunk, what the device holds before its first model call (after retrieval): ``chunk ->
    Counter(source chunk -> tokens)`` and ``chunk -> source frames`` of layer 0; every bank holds as many
    tokens of each chunk (which ones a compressed chunk keeps is each layer's own choice)."""
    backbone = TurningBackbone(G)
    latents = torch.rand(1, G.latent_channels, (context_chunks + generated_chunks) * F, G.latent_height,
                         G.latent_width, generator=torch.Generator().manual_seed(0))
    held: dict[int, Counter] = {}
    frames: dict[int, list[int]] = {}

    def look(cache, chunk) -> None:
        banks = list(cache.all_banks())
        counts = [Counter(b.field("chunk").tolist()) for b in banks]
        assert all(c == counts[0] for c in counts)
        held[chunk.index] = counts[0]
        frames[chunk.index] = sorted(set(banks[0].field("frame").tolist()))

    pre = prefill(backbone, method, latents[:, :, : context_chunks * F], "plan", 0, on_before_denoise=look)
    cont = continue_task(backbone, pre, "plan", generated_chunks * F, 1, on_before_denoise=look)
    return held, frames, cont


def test_the_budget_counts_the_chunk_being_generated_and_defaults_to_worldkvs_nine_chunks():
    method = build_method({"name": "worldkv"})
    assert (method.sink_chunks, method.recent_chunks, method.retrieval_frames, method.keep_ratio) == (1, 1, 24, 0.5)
    tiny = fake_geometry(chunk_frames=4)  # CMBench's chunks: 4 latent frames
    # WorldKV: sink 3 + retrieval 18 + recent 6 = 27 frames = 9 of its 3-frame chunks; here 9 chunks of 4
    assert method.budget_frames(tiny) == 36 and method.retrieved_chunks(tiny) == 6
    small = WorldKV(retrieval_frames=4)
    assert small.budget_frames(G) == 2 + 4 + 2 * 2  # sink, retrieval, recent window and the current chunk
    assert [g.max_tokens for g in small.layout(G)[0]] == [10 * T - L]  # history: the budget less the current chunk


def test_retrieval_fills_the_budget_beside_a_one_chunk_recent_window_by_hand():
    """Sink 1, recent 1, retrieval_frames 4 (2 slots): budget 10 frames (40 tokens). Chunks 0-3 see every
    earlier chunk (candidates start at chunk 4: index 4 - 1 - 1 = 2 > sink); from chunk 4 on, the device
    holds the sink, the chunk before and up to 2 stored chunks nearest in yaw, never the chunk two back."""
    held, _, cont = run(WorldKV(retrieval_frames=4))
    expect = {
        0: {}, 1: {0: L}, 2: {0: L, 1: L}, 3: {0: L, 1: L, 2: L},  # rolling: everything fits
        4: {0: L, 1: STORED, 3: L},  # candidates [1, 2): one of two slots filled; chunk 2 is not seen
        5: {0: L, 1: STORED, 2: STORED, 4: L},  # candidates 1, 2
        6: {0: L, 1: STORED, 2: STORED, 5: L},  # yaw 1.9: chunks 2 (2.0) and 1 (1.0) of 1, 2, 3 (0.5)
        7: {0: L, 1: STORED, 3: STORED, 6: L},  # yaw 0.9: chunks 1 (1.0) and 3 (0.5) of 1-4
        8: {0: L, 2: STORED, 4: STORED, 7: L},  # yaw 2.1: chunks 2 (2.0) and 4 (3.0) of 1-5
    }
    assert {c: dict(h) for c, h in held.items()} == expect
    budget = 10 * T
    assert all(sum(h.values()) + L <= budget for h in held.values())
    # the ledger counts the history each generated chunk saw (28 of 48, 56 and 64 tokens per head)
    assert [int(e.visible[0, 0]) for e in cont.ledger.entries] == [28, 28, 28]


def test_with_nothing_to_retrieve_the_recent_window_takes_the_whole_budget():
    """retrieval_frames 1: no whole chunk fits a slot, so nothing is ever retrieved and the budget
    (2 + 1 + 4 = 7 frames, 28 tokens) is a rolling window: the sink and the newest 3 frames, chunks cut
    mid-way (chunk 1 loses its frame 2 first)."""
    method = WorldKV(retrieval_frames=1)
    held, frames, cont = run(method)
    assert frames[2] == [0, 1, 2, 3]
    assert frames[3] == [0, 1, 3, 4, 5]
    assert frames[8] == [0, 1, 13, 14, 15]
    for c in range(3, 9):
        assert sum(held[c].values()) + L == method.budget_frames(G) * T  # full: history 20 + the chunk's 8
    store = cont.cache.store
    assert store is not None and store.bytes_in == 0  # nothing comes back
    assert store.stored_chunks() == list(range(1, 8))  # each stored once, whole, when its first frame left
    assert all(len(seg) == STORED for seg in store.chunks((0, cont.cache.banks[0][0].group)).values())


def test_when_retrieval_starts_the_rolling_window_shrinks_to_the_recent_window():
    """Recent 2, retrieval_frames 2 (1 slot): budget 2 + 2 + 3 * 2 = 10 frames (32 history tokens).
    Chunk 4 still rolls (its candidates would end at 4 - 2 - 1 = 1): the sink and chunks 1-3 fill the
    budget; chunk 5 retrieves: the sink, chunks 3-4 and one stored chunk (chunk 2 is not seen)."""
    held, _, _ = run(WorldKV(recent_chunks=2, retrieval_frames=2))
    assert dict(held[4]) == {0: L, 1: L, 2: L, 3: L} and sum(held[4].values()) == 32
    assert dict(held[5]) == {0: L, 1: STORED, 3: L, 4: L}
    for c in range(5, 9):
        assert sum(held[c].values()) == L + STORED + 2 * L


@pytest.mark.parametrize("knobs", [{}, {"retrieval_frames": 7}, {"recent_chunks": 0, "retrieval_frames": 5},
                                   {"sink_chunks": 2, "retrieval_frames": 6, "keep_ratio": 1.0}])
def test_the_device_never_holds_more_than_the_budget(knobs):
    method = WorldKV(**knobs)
    held, _, _ = run(method, context_chunks=7, generated_chunks=4)
    budget = method.budget_frames(G) * T
    assert max(sum(h.values()) + L for h in held.values()) <= budget
    layout_cap = method.layout(G)[0][0].max_tokens
    assert layout_cap == budget - L


def test_the_fixed_window_reading_keeps_its_knobs_under_its_own_name():
    fixed = build_method({"name": "worldkv_fixed_window"})
    assert fixed.knobs() == {"sink_chunks": 1, "recent_chunks": 2, "max_history_tokens": None, "retrieval_frames": 18,
                             "keep_ratio": 0.5, "store_max_bytes": None, "bank_on_device": False}
    assert build_method({"name": "key_retrieval"}).knobs() == fixed.knobs()
    # its banks are sized for the sink, the recent window and the retrieved chunks, whole chunks each
    chunks = fixed.sink_chunks + fixed.recent_chunks + fixed.retrieved_chunks(G)
    assert {g.max_tokens for layer in fixed.layout(G) for g in layer} == {chunks * G.tokens_per_chunk}


@pytest.mark.parametrize("keep_ratio", [0.0, 1.5, 2.0])  # a negative one: the knob check names it first
def test_a_keep_ratio_outside_zero_to_one_is_refused_naming_it(keep_ratio):
    """``keep_ratio`` is a share of a frame's tokens: 1.0 keeps every token, and anything not in (0, 1] is
    refused in one line."""
    with pytest.raises(ConfigError, match=rf"^worldkv: keep_ratio must be in \(0, 1\], got {keep_ratio}$"):
        WorldKV(keep_ratio=keep_ratio)


def _memory(method: WorldKV):
    backbone = TurningBackbone(G)
    latents = torch.rand(1, G.latent_channels, 9 * F, G.latent_height, G.latent_width,
                         generator=torch.Generator().manual_seed(0))
    pre = prefill(backbone, method, latents[:, :, : 6 * F], "plan", 0)
    return pre, continue_task(backbone, pre, "plan", 3 * F, seed=1)


def test_the_bank_on_the_device_is_the_same_run_holding_the_same_store_and_nothing_moves():
    """WorldKV's own script keeps its bank on the GPU (``--kv_bank_on_gpu``): the same rows attend, so the same
    latents and the same bytes in the banks; the store holds what it held in host memory (its bytes are then device
    memory beside the banks': the board's total memory); no byte crosses the host link."""
    pre, host = _memory(WorldKV(retrieval_frames=4))
    _, device = _memory(WorldKV(retrieval_frames=4, bank_on_device=True))
    torch.testing.assert_close(device.latents, host.latents, rtol=0, atol=0)
    assert host.ledger.moved_bytes > 0 and device.ledger.moved_bytes == 0
    assert device.cache.store.bytes_in == device.cache.store.bytes_out == 0
    assert device.ledger.peak_store_bytes == host.ledger.peak_store_bytes > 0
    assert [e.stored_bytes for e in device.ledger.entries] == [e.stored_bytes for e in host.ledger.entries]
    # what the prefill left in the store: compressed chunks of STORED tokens in every layer-head, float32 K and V
    held = pre.cache.store.stored_bytes
    assert held > 0 and held % (STORED * G.num_layers * G.num_heads * 2 * G.head_dim * 4) == 0
