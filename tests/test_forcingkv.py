"""ForcingKV by hand: its patch cosine, the patches' tokens, bank sizes, the scored layer and which patches it keeps.

The end-to-end runs use :class:`HandKeys`, a backbone storing keys set per token, so every patch cosine is a
number chosen here: keys are ``(1, 0)`` (first two of a head's 12 channels) unless a test turns some token
positions from some frame on to ``(0.8, 0.6)`` (cosine 0.8 with ``(1, 0)``), ``(0.6, 0.8)`` (0.6) or ``(-1, 0)``
(-1). A patch of turned positions then has cosine ``c`` in the pair (frame before the turn, turn's frame) and 1
in every other pair. Default geometry (tests/fakes.py): 4 tokens per frame, chunks of 2 frames (8 tokens),
2 layers x 2 heads, a 6-frame context and a 6-frame continuation; ``gid = frame * 4 + pos``, and with
``patches_per_frame = 2`` patch ``frame * 2 + p`` holds positions ``2p, 2p + 1``.
"""

import re

import pytest
import torch

from cmbench.errors import ConfigError
from cmbench.generation import prefill
from cmbench.methods import build_method
from cmbench.methods.forcingkv import adjacent_patch_similarity, patch_bounds, patch_tokens
from cmbench.methods.head_map import HeadMap
from fakes import ScriptedBackbone, fake_geometry, survivors, timeline
from test_methods import CTX, GEN, G, chunk_gids, run


class HandKeys(ScriptedBackbone):
    """Stores ``key(layer, head, frame, pos)`` as every token's key (and value), whatever the latents;
    predicts zero latents over the 12-frame timeline."""

    def __init__(self, geometry, key) -> None:
        zeros = timeline(geometry, CTX + GEN, lambda gid: 0.0)
        super().__init__(geometry, zeros, zeros)
        self.key = key

    def denoise(self, x_t, t, cache, frame_start, cond=None):
        g = self.geometry
        T, frames = g.tokens_per_frame, x_t.shape[2]
        for layer in range(g.num_layers):
            k = torch.zeros(1, frames * T, g.num_heads, g.head_dim)
            for i in range(frames * T):
                frame, pos = divmod(frame_start * T + i, T)
                for head in range(g.num_heads):
                    k[0, i, head, :2] = torch.tensor(self.key(layer, head, frame, pos))
            cache.attend(layer, k, k, k)
        return self.world[:, :, frame_start:frame_start + frames]


def turning(*turns):
    """A key function (every layer and head alike): ``(1, 0)``, except ``key`` at the token ``positions`` of a
    turn ``(first_frame, positions, key)`` from ``first_frame`` on."""

    def key(layer, head, frame, pos):
        for first, positions, value in turns:
            if frame >= first and pos in positions:
                return value
        return (1.0, 0.0)

    return key


def forcingkv(**knobs):
    """Every head of every layer dynamic (``layer_zero="map"``, no head map); as many history chunks as the
    run has frames, so candidates lie anywhere in the run."""
    return build_method({"name": "forcingkv", "layer_zero": "map", "history_chunks": CTX + GEN, **knobs})


def test_patch_similarity_is_the_mean_token_cosine_whatever_the_key_norms():
    """Three frames of 3 tokens, two heads of one channel side by side (a token's key is a 2-vector), in
    patches of 2 + 1 tokens. Token cosines, frame 0 -> 1: (0.5, 0).(0.3, 0.4) / (0.5 * 0.5) = 0.6,
    (0, 0.5).(0, 2) / (0.5 * 2) = 1, (0.3, 0.4).(0.4, -0.3) = 0; frame 1 -> 2: -0.25 / 0.25 = -1,
    1.2 / (2 * 1) = 0.6, 0.1 / (0.5 * 0.25) = 0.8. Patch means: [(0.6 + 1) / 2, 0] and [(-1 + 0.6) / 2, 0.8].
    Norms below and above 1 on both sides of each pair: a norm left out, floored at 1 or taken over the whole
    tensor, a sum instead of a mean, or a pair other than (i, i + 1) changes the numbers."""
    keys = torch.tensor([
        [(0.5, 0.0), (0.0, 0.5), (0.3, 0.4)],
        [(0.3, 0.4), (0.0, 2.0), (0.4, -0.3)],
        [(-0.3, -0.4), (0.8, 0.6), (0.25, 0.0)],
    ]).reshape(1, 3, 3, 2, 1)
    bounds = patch_bounds(3, 2)
    assert bounds.tolist() == [0, 2, 3]
    sim = adjacent_patch_similarity(keys, bounds)
    assert sim.dtype == torch.float32
    torch.testing.assert_close(sim, torch.tensor([[0.8, 0.0], [-0.2, 0.8]]))


def test_patch_tokens_of_patches_larger_than_one_token():
    """5 tokens per frame in patches of 3 + 2 tokens (offsets 0, 3, 5). Patch 4 is frame 2's first patch
    (tokens 10-12), patch 1 frame 0's second (tokens 3-4): sorted by token id, each token names its patch's
    place in ``ids`` (patch 1 is at place 1). Both are long tensors (they index and mark the cache)."""
    gids, index = patch_tokens(torch.tensor([4, 1]), patch_bounds(5, 2), 5)
    assert gids.tolist() == [3, 4, 10, 11, 12]
    assert index.tolist() == [1, 1, 0, 0, 0]
    assert gids.dtype == index.dtype == torch.long


def test_refuses_no_recent_window_saying_why():
    """Without a recent window the previous frame's keys, half of the newest pair, would be gone."""
    with pytest.raises(ConfigError, match=re.escape(
            "forcingkv: needs recent_chunks >= 1 (the previous frame's keys must still be stored)")):
        build_method({"name": "forcingkv", "recent_chunks": 0})


@pytest.mark.parametrize("knobs, dynamic_size", [
    ({}, 22),  # the sink and recent window (2 chunks of 8 tokens) + k = 3 patches of the largest size, 2
    ({"max_history_tokens": 20}, 20),  # the cap binds
    ({"max_history_tokens": 30}, 22),  # the cap does not bind
    ({"quota_pr": 0.5}, None),  # quota mode: the budget sizes the dynamic bank
    ({"quota_tokens": 40}, None),
    ({"quota_pr": 0.5, "max_history_tokens": 20}, 20),  # quota mode under a cap: the cap
])
def test_bank_sizes_of_dynamic_and_static_heads(knobs, dynamic_size):
    """4 tokens in 3 patches (2, 1, 1 tokens): a dynamic head holds the sink + recent window (16 tokens) and
    k = 3 patches of 2 tokens; a static head the sink + recent window. Layer 0 streams (one static bank)."""
    method = build_method({"name": "forcingkv", "k": 3, "patches_per_frame": 3, **knobs})
    assert [[(g.role, g.heads, g.max_tokens) for g in layer] for layer in method.layout(G)] == [
        [("static", (0, 1), 16)],
        [("dynamic", (0, 1), dynamic_size)],
    ]


@pytest.mark.parametrize("num_layers, static, expected", [
    (2, None, 1),  # layer 0 streams (static), layer 1 is dynamic
    (2, ((), (0, 1)), 0),  # layer 1 all static: the next layer with dynamic heads, wrapping to layer 0
    (3, ((), (0, 1), ()), 2),
    (1, None, 0),  # a one-layer model keeps its layer dynamic
    (1, ((0, 1),), 0),  # one layer without dynamic heads: still layer 0, never a layer the model lacks
])
def test_reference_layer_is_layer_one_or_the_next_with_dynamic_heads(num_layers, static, expected, tmp_path):
    knobs = {"name": "forcingkv"}
    if static is not None:
        path = tmp_path / "map.json"
        HeadMap(num_layers, 2, static).save(path)
        knobs.update(head_map=str(path), layer_zero="map")
    assert build_method(knobs).reference_layer(fake_geometry(num_layers=num_layers)) == expected


def test_a_less_similar_new_patch_displaces_the_selection():
    """k = 1. Frame 2's second patch (gids 10, 11) turns to cosine 0.8 in pair (2, 3), frame 4's first
    (gids 16, 17) to 0.6 in pair (4, 5); every other patch has cosine 1. After chunk 1 the selection is frame
    2's patch (0.8 < 1); chunk 2's new pairs bring frame 4's patch, less similar (0.6 < 0.8), which replaces
    it: chunk 1 leaves the window with nothing kept, chunk 2 keeps gids 16, 17 for good."""
    backbone = HandKeys(G, turning((3, (2, 3), (0.8, 0.6)), (5, (0, 1), (0.6, 0.8))))
    pre, cont = run(forcingkv(k=1, patches_per_frame=2), backbone)
    assert survivors(pre.cache, 1) == chunk_gids(0) + chunk_gids(2)
    assert survivors(cont.cache, 1) == chunk_gids(0) + [16, 17] + chunk_gids(5)


def test_a_full_bank_evicts_the_most_similar_patch_first():
    """k = 2, max_history_tokens = 18: room for one 2-token patch beside the sink and recent window (16).
    Frame 3's patches turn in pair (3, 4): the first (gids 12, 13) to cosine 0.8, the second (14, 15) to 0.6.
    Chunk 2 scores that pair and selects both (every other patch has cosine 1), so when chunk 1 (frames 2-3) leaves the window right after,
    20 tokens exceed the cap by 2: the eviction priority is minus the cosine, and the more similar patch
    (12, 13) goes."""
    backbone = HandKeys(G, turning((4, (0, 1), (0.8, 0.6)), (4, (2, 3), (0.6, 0.8))))
    method = forcingkv(k=2, patches_per_frame=2, max_history_tokens=18)
    cache = prefill(backbone, method, backbone.world[:, :, :CTX], None, 0).cache
    assert survivors(cache, 1) == chunk_gids(0) + [14, 15] + chunk_gids(2)
    assert cache.banks[1][0].field("priority")[8:10].tolist() == pytest.approx([-0.6, -0.6])  # rows of gids 14, 15


def test_only_the_dynamic_heads_keys_are_scored(tmp_path):
    """Layer 1: head 0 static, head 1 dynamic; k = 1. In pair (2, 3) the dynamic head's second patch of
    frame 2 (gids 10, 11) turns to cosine 0.8, while the static head's first patch (gids 8, 9) turns around
    (-1). Scored on the dynamic head alone, the second patch is the least similar; the static head's keys
    beside it would make the first patch's cosine (1 - 1) / 2 = 0 and the second's (1 + 0.8) / 2 = 0.9."""
    path = tmp_path / "map.json"
    HeadMap(2, 2, ((), (0,))).save(path)

    def key(layer, head, frame, pos):
        if layer == 1 and frame >= 3 and head == 1 and pos in (2, 3):
            return (0.8, 0.6)
        if layer == 1 and frame >= 3 and head == 0 and pos in (0, 1):
            return (-1.0, 0.0)
        return (1.0, 0.0)

    _, cont = run(forcingkv(k=1, patches_per_frame=2, head_map=str(path)), HandKeys(G, key))
    assert [b.role for b in cont.cache.banks[1]] == ["dynamic", "static"]
    assert survivors(cont.cache, 1, 0) == chunk_gids(0) + [10, 11] + chunk_gids(5)
    assert survivors(cont.cache, 0) == chunk_gids(0) + [10, 11] + chunk_gids(5)  # shared by every dynamic bank


def test_one_frame_chunks_score_the_first_pair_after_chunk_one():
    """Chunks of one frame, no sink, k = 1: chunk 1 (frame 1) scores pair (0, 1), where frame 0's first patch
    (gids 0, 1) turns to cosine 0.6 (and stays turned: every later patch has cosine 1), so that patch stays
    selected and frame 0's gids 0, 1 are kept when chunk 0 leaves the window."""
    g = fake_geometry(chunk_frames=1)
    backbone = HandKeys(g, turning((1, (0, 1), (0.6, 0.8))))
    _, cont = run(forcingkv(k=1, patches_per_frame=2, sink_chunks=0), backbone)
    assert survivors(cont.cache, 1) == [0, 1, 44, 45, 46, 47]


def test_tied_patches_keep_the_earliest_among_32_candidates():
    """16 tokens per frame, one patch per token, every key alike (every cosine 1), no sink, k = 3. Chunk 1
    scores 32 tied candidates (frames 1 and 2): the earliest three, frame 1's gids 16-18, are kept; each later
    chunk's 32 new ties come after them, so they stay. (torch's default CPU argsort, unstable, orders 32 equal
    values 16, 31, 30, ...: the earliest patches would lose.)"""
    g = fake_geometry(height=8, width=8)
    _, cont = run(forcingkv(k=3, patches_per_frame=16, sink_chunks=0), HandKeys(g, turning()))
    assert survivors(cont.cache, 1) == [16, 17, 18, *range(160, 192)]
