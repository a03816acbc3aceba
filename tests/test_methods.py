"""Methods on a scripted sequence of chunks: exactly which tokens survive, when, and the ledger, by hand.

Geometry (tests/fakes.py): 4 tokens per latent frame, chunks of 2 frames (8 tokens), 2 layers x 2 heads.
Timeline: a 6-frame context (chunks 0-2) and a 6-frame continuation (chunks 3-5); token ``gid`` =
``frame * 4 + pos``. The scripted backbone predicts ``x0 = world + t * D`` so DeCoPrune's score of a
token with discrepancy ``d`` is ``(0.899 d)^2 = 0.808 d^2`` on context chunks (re-noise probe against
the observed ``world``) and ``((0.899 - 0.702) d)^2 = 0.0388 d^2`` on generated chunks.

DeCoPrune's window (w = 1 chunk): chunk ``i`` is compacted right before chunk ``i + 2``'s ``t = 0``
pass, so chunk ``i + 2``'s denoising and probe see chunks ``i`` and ``i + 1`` dense.
"""

import math

import pytest
import torch

from cmbench.cache import ChunkInfo, KVCache
from cmbench.errors import ConfigError
from cmbench.generation import continue_task, prefill
from cmbench.methods import build_method
from cmbench.methods.base import ChunkSignals, Needs
from cmbench.methods.decoprune import token_cosine
from cmbench.methods.forcingkv import patch_bounds
from cmbench.methods.head_map import HeadMap
from cmbench.methods.tempdiff import block_index, block_similarity, split_bounds
from fakes import AttentionBackbone, ScriptedBackbone, fake_geometry, survivors, timeline


G = fake_geometry()
CTX, GEN = 6, 6


def d_pattern(gid: int) -> float:
    """2.0 for gid % 3 == 0 (kept everywhere), 1.0 for % 3 == 1 (kept in context only), 0.1 otherwise;
    gid 14 (chunk 1) is NaN: its score is non-finite and it must be kept."""
    if gid == 14:
        return float("nan")
    return {0: 2.0, 1: 1.0, 2: 0.1}[gid % 3]


def scripted(d=d_pattern, world=lambda gid: 0.0) -> ScriptedBackbone:
    return ScriptedBackbone(G, timeline(G, CTX + GEN, world), timeline(G, CTX + GEN, d))


def run(method, backbone=None, seed=0):
    backbone = backbone or scripted()
    context = backbone.world[:, :, :CTX]
    pre = prefill(backbone, method, context, None, seed)
    return pre, continue_task(backbone, pre, None, GEN, seed + 1)


def chunk_gids(c):
    return list(range(8 * c, 8 * c + 8))


def per_head_visible(cont):
    """Visible history per generated chunk (all heads equal in these cases)."""
    out = []
    for e in cont.ledger.entries:
        assert torch.all(e.visible == e.visible.flatten()[0])
        out.append((int(e.visible[0, 0]), e.full))
    return out


CHUNK1 = [9, 10, 12, 13, 14, 15]  # DeCoPrune keeps gid % 3 in {0, 1} in the context, plus the NaN token 14
CHUNK2 = [16, 18, 19, 21, 22]
CHUNK3 = [24, 27, 30]  # generated: only d = 2 (gid % 3 == 0) scores above 0.10


def test_decoprune_survivors_and_ledger_by_hand():
    pre, cont = run(build_method({"name": "decoprune"}))
    # after prefill nothing is compacted yet: chunk 1 goes right before chunk 3's t = 0 pass
    assert survivors(pre.cache) == list(range(24))
    expect = chunk_gids(0) + CHUNK1 + CHUNK2 + CHUNK3 + chunk_gids(4) + chunk_gids(5)
    for layer in range(2):
        assert survivors(cont.cache, layer) == expect
    # chunk 3 sees chunks 1-2 dense; chunk 4 sees chunk 1 compacted, 2-3 dense; chunk 5: 1-2 compacted
    assert per_head_visible(cont) == [(24, 24), (30, 32), (35, 40)]
    assert cont.ledger.pruning_ratio() == pytest.approx(1 - 89 / 96)
    assert [(int(e.visible[0, 0]), e.full) for e in pre.ledger.entries] == [(0, 0), (8, 8), (16, 16)]
    assert pre.ledger.pruning_ratio() == 0.0
    assert cont.kept_tokens == {0: 8, 1: 6, 2: 5, 3: 3, 4: 8, 5: 8}
    assert pre.cache.banks[0][0].n == 24  # the prefilled cache is untouched by the task


class Viewing(ScriptedBackbone):
    """Records, for every model call, the history gids it saw: ``(frame_start, t, probing) -> gids``."""

    def denoise(self, x_t, t, cache, frame_start, cond=None):
        self.views[(frame_start, round(float(t), 3), cache.probing)] = cache.visible_history(cache.banks[0][0]).tolist()
        return super().denoise(x_t, t, cache, frame_start, cond)


def viewing(frames: int) -> Viewing:
    backbone = Viewing(G, timeline(G, frames, lambda gid: 0.0), timeline(G, frames, d_pattern))
    backbone.views = {}
    return backbone


def test_decoprune_compacts_chunk_i_right_before_chunk_i_plus_2_clean_pass():
    """Context 8 frames (chunks 0-3), continuation 4 (chunks 4-5). Each chunk's probe and denoising calls
    see the two chunks before it dense; its t = 0 pass sees the older one compacted."""
    backbone = viewing(12)
    method = build_method({"name": "decoprune"})
    pre = prefill(backbone, method, backbone.world[:, :, :8], None, 0)
    continue_task(backbone, pre, None, 4, 1)
    v = backbone.views
    c = chunk_gids
    # context chunk 3 (frames 6-7): the re-noise probe at tau* sees chunks 1-2 dense, the t = 0 pass chunk 1 pruned
    assert v[(6, 0.899, True)] == c(0) + c(1) + c(2)
    assert v[(6, 0.0, False)] == c(0) + CHUNK1 + c(2)
    # generated chunk 4 (frames 8-9): every denoising step (the probe step 899 included) sees chunks 2-3 dense
    for t in (0.999, 0.957, 0.899, 0.702):
        assert v[(8, t, False)] == c(0) + CHUNK1 + c(2) + c(3)
    assert v[(8, 0.0, False)] == c(0) + CHUNK1 + CHUNK2 + c(3)
    # generated chunk 5 (frames 10-11): chunk 3 (context, d % 3 == 0 and 1 kept) goes before its t = 0 pass
    assert v[(10, 0.999, False)] == c(0) + CHUNK1 + CHUNK2 + c(3) + c(4)
    assert v[(10, 0.0, False)] == c(0) + CHUNK1 + CHUNK2 + [24, 25, 27, 28, 30, 31] + c(4)


def test_context_probe_runs_at_the_probe_steps_level():
    """The re-noise probe of every context chunk is one call at ``levels[probe_step]``, then the t = 0 pass."""
    for probe_step, level in ((2, 0.899), (1, 0.957)):
        backbone = scripted()
        prefill(backbone, build_method({"name": "decoprune", "probe_step": probe_step}), backbone.world[:, :, :CTX], None, 0)
        assert backbone.calls == [(0, level), (0, 0.0), (2, level), (2, 0.0), (4, level), (4, 0.0)]


def test_score_exactly_at_gamma_is_dropped():
    """The keep rule is ``score > gamma``: a token scoring exactly gamma is pruned, one just above is kept."""
    method = build_method({"name": "decoprune"})
    score = torch.tensor([0.1, 0.100001, 0.099999], dtype=torch.float32)
    assert build_method({"name": "decoprune", "gamma": float(score[0])}).keep_rule(score).tolist() == [False, True, False]
    seen = {}
    backbone = scripted()
    prefill(backbone, method, backbone.world[:, :, :CTX], None, 0,
            on_chunk_end=lambda cache, sig: seen.setdefault(sig.chunk.index, method.token_scores(sig)))
    at = float(seen[1][1])  # gid 9 (d = 2): an exact float32 score of the run
    for gamma, kept in ((at, False), (float(torch.nextafter(torch.tensor(at), torch.tensor(0.0))), True)):
        backbone = scripted()
        _, cont = run(build_method({"name": "decoprune", "gamma": gamma}), backbone)
        assert (9 in survivors(cont.cache)) is kept


def test_decoprune_reverse_keeps_low_scores():
    _, cont = run(build_method({"name": "decoprune_reverse"}))
    expect = chunk_gids(0) + [8, 11, 14] + [17, 20, 23] + [25, 26, 28, 29, 31] + chunk_gids(4) + chunk_gids(5)
    assert survivors(cont.cache) == expect


def test_gamma_moves_the_threshold():
    # gamma 0.03: generated d=1 tokens score 0.0388 > 0.03 and are kept too
    _, cont = run(build_method({"name": "decoprune", "gamma": 0.03}))
    assert [g for g in survivors(cont.cache) if 24 <= g < 40] == [24, 25, 27, 28, 30, 31, *range(32, 40)]


def test_streaming_and_fullkv():
    _, cont = run(build_method({"name": "streaming"}))  # the paper's sink 4 + recent 8: 1 + 2 chunks
    assert survivors(cont.cache) == chunk_gids(0) + chunk_gids(4) + chunk_gids(5)
    assert per_head_visible(cont) == [(24, 24), (24, 32), (24, 40)]
    _, cont = run(build_method({"name": "streaming", "recent_chunks": 1}))
    assert survivors(cont.cache) == chunk_gids(0) + chunk_gids(5)
    assert per_head_visible(cont) == [(16, 24), (16, 32), (16, 40)]
    _, cont = run(build_method({"name": "streaming", "sink_chunks": 1, "recent_chunks": 0}))
    assert survivors(cont.cache) == chunk_gids(0)
    assert per_head_visible(cont) == [(8, 24), (8, 32), (8, 40)]
    _, cont = run(build_method({"name": "fullkv"}))
    assert survivors(cont.cache) == list(range(48))
    assert cont.ledger.pruning_ratio() == 0.0


def test_random_keeps_decoprunes_count_per_chunk_at_random_seeded():
    """Per chunk, as many tokens as DeCoPrune's threshold keeps on this run's own scores (here the
    scripted scores: 6, 5, 3 for chunks 1-3), chosen by a seeded draw; same window timing."""
    a = run(build_method({"name": "random"}))[1]
    b = run(build_method({"name": "random"}))[1]
    c = run(build_method({"name": "random", "seed": 1}))[1]
    assert survivors(a.cache) == survivors(b.cache) != survivors(c.cache)
    assert a.kept_tokens == c.kept_tokens == run(build_method({"name": "decoprune"}))[1].kept_tokens
    assert a.kept_tokens == {0: 8, 1: 6, 2: 5, 3: 3, 4: 8, 5: 8}
    assert [g for g in survivors(a.cache) if 8 <= g < 16] != CHUNK1  # random, not DeCoPrune's tokens
    assert per_head_visible(a) == [(24, 24), (30, 32), (35, 40)]
    counts = {1: 5, 2: 0, 3: 7, 4: 1, 5: 3}
    _, d = run(build_method({"name": "random", "keep_counts": counts}))
    assert d.kept_tokens == {0: 8, 1: 5, 2: 0, 3: 7, 4: 8, 5: 8}
    with pytest.raises(ConfigError, match="no entry for chunk 3"):
        run(build_method({"name": "random", "keep_counts": {1: 1, 2: 1}}))


def one_hot_world(gid: int) -> torch.Tensor:
    """Token position 0 changes direction every frame; positions 1-3 never change."""
    frame, pos = divmod(gid, 4)
    v = torch.zeros(12)
    if pos == 0:
        v[frame % 12] = 1.0
    else:
        v[:] = pos
    return v


def test_tempdiff_keeps_the_k_least_similar_context_blocks_once():
    """Layer-1 keys (the scripted keys + 1): position 0 turns every frame (cosine 14/15 with the next
    frame), positions 1-3 never change (cosine 1). Candidates: frames 2-3 (between the sink, chunk 0, and
    the recent chunk 2); the earlier frame of each pair is kept; the continuation is never pruned."""
    backbone = scripted(d=lambda gid: 0.0, world=one_hot_world)
    pre, cont = run(build_method({"name": "tempdiff", "k": 2}), backbone)
    assert survivors(pre.cache) == chunk_gids(0) + [8, 12] + chunk_gids(2)  # position 0 of frames 2 and 3
    assert survivors(cont.cache) == chunk_gids(0) + [8, 12] + list(range(16, 48))
    assert per_head_visible(cont) == [(18, 24), (26, 32), (34, 40)]
    backbone = scripted(d=lambda gid: 0.0, world=one_hot_world)
    pre, _ = run(build_method({"name": "tempdiff", "k": 1}), backbone)  # a tie: the earlier block wins
    assert survivors(pre.cache) == chunk_gids(0) + [8] + chunk_gids(2)
    backbone = scripted(d=lambda gid: 0.0, world=one_hot_world)
    pre, _ = run(build_method({"name": "tempdiff", "k": 3}), backbone)  # then the lowest index among the rest
    assert survivors(pre.cache) == chunk_gids(0) + [8, 9, 12] + chunk_gids(2)


def test_block_and_patch_geometry_from_the_token_grid():
    """TempDiff's 6x13 grid on LingBot's 30x52 tokens: 78 blocks of 5x4 = 20 tokens; on the tiny model's
    8x8: 6x8 blocks of 2 or 1 rows. ForcingKV's 6 patches: 260 tokens (5 rows) on LingBot, 11/11/11/11/10/10
    on 64 tokens."""
    blocks = block_index(30, 52, 6, 13)
    assert blocks.shape == (1560,) and torch.bincount(blocks).tolist() == [20] * 78
    grid = blocks.reshape(30, 52)
    assert grid[:5, :4].unique().tolist() == [0] and grid[5, 0] == 13 and grid[29, 51] == 77
    tiny = block_index(8, 8, 6, 13).reshape(8, 8)
    assert tiny[:, 0].tolist() == [0, 0, 8, 8, 16, 24, 32, 40] and tiny[0].tolist() == list(range(8))
    assert patch_bounds(1560, 6).tolist() == [0, 260, 520, 780, 1040, 1300, 1560]
    assert patch_bounds(64, 6).diff().tolist() == [11, 11, 11, 11, 10, 10]
    assert patch_bounds(4, 6).tolist() == [0, 1, 2, 3, 4]  # at most one patch per token


class KeyedBackbone(ScriptedBackbone):
    """Layer 1's keys are the clean tokens + 1 (position 0 turns every frame); layer 0's keys put the
    turning position at 3 instead, so scoring on layer 0 would choose other patches."""

    def denoise(self, x_t, t, cache, frame_start, cond=None):
        g = self.geometry
        tok = g.tokenize(x_t)
        b, L, p = tok.shape
        width = g.num_heads * g.head_dim
        feat = tok.repeat(1, 1, width // p + 1)[..., :width].reshape(b, L, g.num_heads, g.head_dim)
        swapped = feat.reshape(b, L // 4, 4, g.num_heads, g.head_dim).flip(2).reshape(feat.shape)
        for layer in range(g.num_layers):
            cache.attend(layer, feat, (feat if layer else swapped) + 1, feat)
        sl = slice(frame_start, frame_start + x_t.shape[2])
        return self.world[:, :, sl] + t * self.discrepancy[:, :, sl]


def test_forcingkv_layer1_patches_of_the_earlier_frame_shared_by_all_layers(tmp_path):
    """k = 2 patches (one token each here), candidates within 2 chunks before the recent chunk.
    Position 0 of every frame is the least similar to the next frame (14/15). The selection runs
    (patch ids = frame * 4 + position): after chunk 1 {frame 1, frame 2}; chunk 2 adds frames 3, 4 but
    keeps the earlier {1, 2} (ties: the earlier patch); chunk 3 drops frame 1 (out of the window) for
    frame 5; chunk 4: {5, 7}; chunk 5: {7, 9}. A left-out patch is never reconsidered (frames 3, 4)."""
    path = tmp_path / "map.json"
    HeadMap(2, 2, ((), (0,))).save(path)
    backbone = KeyedBackbone(G, timeline(G, CTX + GEN, one_hot_world), timeline(G, CTX + GEN, lambda gid: 0.0))
    method = build_method({"name": "forcingkv", "k": 2, "history_chunks": 2, "head_map": str(path),
                           "layer_zero": "map"})
    pre, cont = run(method, backbone)
    assert survivors(pre.cache, 0) == chunk_gids(0) + [8] + chunk_gids(2)  # frame 1 (gid 4) is in the sink
    # every dynamic bank (layer 0's too, whose own keys would pick position 3) holds layer 1's choice
    assert survivors(cont.cache, 0) == chunk_gids(0) + [28, 36] + chunk_gids(5)
    assert [b.group.heads for b in cont.cache.banks[1]] == [(1,), (0,)]
    assert survivors(cont.cache, 1, 0) == chunk_gids(0) + [28, 36] + chunk_gids(5)
    assert survivors(cont.cache, 1, 1) == chunk_gids(0) + chunk_gids(5)  # static head: sink + recent
    assert [e.visible.tolist() for e in cont.ledger.entries] == [  # static head (layer 1, head 0): sink + chunk
        [[17, 17], [16, 17]],  # chunk 3: sink, gid 8 (frame 2; frame 1's gid 4 is in the sink), chunk 2
        [[18, 18], [16, 18]],  # chunk 4: sink, gids 8 and 20 (frame 5), chunk 3
        [[18, 18], [16, 18]],  # chunk 5: sink, gids 20 and 28 (frame 7), chunk 4
    ]


def test_forcingkv_streams_layer0_by_default():
    """The authors' ``layer_zero_policy = "streaming"``: without a head map, layer 0's heads keep only the
    sink + recent window (one static bank), every other layer's heads the sink, recent window and the
    patches; a one-layer model keeps its layer dynamic."""
    backbone = KeyedBackbone(G, timeline(G, CTX + GEN, one_hot_world), timeline(G, CTX + GEN, lambda gid: 0.0))
    _, cont = run(build_method({"name": "forcingkv", "k": 2, "history_chunks": 2}), backbone)
    assert [b.role for b in cont.cache.banks[0]] == ["static"] and cont.cache.banks[0][0].group.heads == (0, 1)
    assert survivors(cont.cache, 0) == chunk_gids(0) + chunk_gids(5)
    assert [b.role for b in cont.cache.banks[1]] == ["dynamic"]
    assert survivors(cont.cache, 1) == chunk_gids(0) + [28, 36] + chunk_gids(5)
    one_layer = build_method({"name": "forcingkv"}).layout(fake_geometry(num_layers=1))
    assert [g.role for g in one_layer[0]] == ["dynamic"]
    with pytest.raises(ConfigError, match="layer_zero"):
        build_method({"name": "forcingkv", "layer_zero": "dense"})


def test_decoprune_hs_static_heads_stream_and_layer0_is_dynamic(tmp_path):
    path = tmp_path / "map.json"
    HeadMap(2, 2, ((1,), (0,))).save(path)
    _, cont = run(build_method({"name": "decoprune_hs", "head_map": str(path)}))
    decoprune = chunk_gids(0) + CHUNK1 + CHUNK2 + CHUNK3 + chunk_gids(4) + chunk_gids(5)
    assert len(cont.cache.banks[0]) == 1 and survivors(cont.cache, 0) == decoprune
    roles = {b.role: b for b in cont.cache.banks[1]}
    assert roles["dynamic"].group.heads == (1,) and roles["static"].group.heads == (0,)
    assert roles["dynamic"].field("gid").tolist() == decoprune
    assert roles["static"].field("gid").tolist() == chunk_gids(0) + chunk_gids(5)
    # the ledger counts every head: static head 0 of layer 1 sees sink + the previous chunk only (no delay),
    # the dynamic heads DeCoPrune's delayed window
    assert [e.visible[1, 0].item() for e in cont.ledger.entries] == [16, 16, 16]
    assert [e.visible[1, 1].item() for e in cont.ledger.entries] == [24, 30, 35]
    with pytest.raises(ConfigError, match="decoprune_hs needs head_map="):
        run(build_method({"name": "decoprune_hs"}))
    sized = build_method({"name": "decoprune_hs", "head_map": str(path), "max_history_tokens": 20})
    assert [[(g.role, g.heads, g.max_tokens) for g in layer] for layer in sized.layout(G)] == [
        [("dynamic", (0, 1), 20)],  # layer 0 is all dynamic, sized by max_history_tokens
        [("dynamic", (1,), 20), ("static", (0,), 16)],  # static: the sink + recent window, 2 chunks of 8 tokens
    ]
    assert [[g.max_tokens for g in layer] for layer in build_method(
        {"name": "decoprune_hs", "head_map": str(path)}).layout(G)] == [[None], [None, 16]]


DUMMY = {"name": "dummyforcing", "first_frames": 2, "middle_frames": 2, "recent_frames": 2, "last_frames": 2}


def test_dummyforcing_classification_by_hand():
    """Regions of the packed layout at chunk 2 (frames 4-5): first = frames (0, 2), middle = (3,), last =
    (4, 5). First and middle masses are normalised over all four layer-heads (sums 1.0 and 1.0); the half
    with the lowest max(first, middle) become dummy; the rest middle where middle > first, else first."""
    method = build_method(DUMMY)
    regions = method.regions(G, ChunkInfo(2, 4, 2, 16, 8))
    assert regions == {"first": (0, 2), "middle": (3,), "last": (4, 5)}
    mass = torch.zeros(2, 2, 6)
    mass[0, 0, [0, 3, 4]] = torch.tensor([0.10, 0.05, 0.85])  # max(0.1, 0.05) = 0.10 -> dummy
    mass[0, 1, [0, 2, 3]] = torch.tensor([0.30, 0.20, 0.10])  # first 0.5 > middle 0.1 -> first
    mass[1, 0, [2, 3, 5]] = torch.tensor([0.10, 0.80, 0.10])  # middle 0.8 > first 0.1 -> middle
    mass[1, 1, [0, 3, 4]] = torch.tensor([0.30, 0.05, 0.65])  # max(0.3, 0.05) = 0.30 -> dummy
    assert method.classify(mass, regions).tolist() == [[2, 0], [1, 2]]
    mass[0, 1, 1] = 5.0  # frame 1 is outside the packed layout: it counts nowhere
    assert method.classify(mass, regions).tolist() == [[2, 0], [1, 2]]


def test_dummyforcing_classifies_during_the_context_replay_and_keeps_each_roles_frames():
    """Timeline chunk 2 (context frames 4-5) is classified at its t = 0 pass over the packed keys
    (frame 1 left out); every continuation chunk runs with the roles; after each chunk: first = frames
    0-1, middle = the centre bank (frames 2-3, placed when 6 frames existed) + the newest 2, dummy = the
    newest 2."""
    backbone = AttentionBackbone(G)
    method = build_method(DUMMY)
    recorded = {}
    pre = prefill(backbone, method, torch.randn(1, 3, 8, 4, 4), None, 0,
                  on_chunk_end=lambda cache, sig: recorded.setdefault(sig.chunk.index, sig.attention))
    assert recorded[0] is recorded[1] is recorded[3] is None
    mass = recorded[2].stacked()
    assert mass.shape == (2, 2, 6) and torch.all(mass[..., 1] == 0)
    torch.testing.assert_close(mass.sum(-1), torch.ones(2, 2))
    assert "unclassified" not in [b.role for b in pre.cache.all_banks()]
    assert sum(b.num_heads for b in pre.cache.all_banks() if b.role == "dummy") == 2  # half of 4 layer-heads
    cont = continue_task(backbone, pre, None, 6, 1)
    frames = {"first": [0, 1], "middle": [2, 3, 12, 13], "dummy": [12, 13]}
    for bank in cont.cache.all_banks():
        assert sorted(set(bank.field("frame").tolist())) == frames[bank.role]
    visible = {"first": 8, "middle": 16, "dummy": 8}
    for entry in cont.ledger.entries:  # what each head saw: its role's frames, never the unclassified cache
        for bank in cont.cache.all_banks():
            assert entry.visible[bank.layer, list(bank.group.heads)].tolist() == [visible[bank.role]] * bank.num_heads
    with pytest.raises(ConfigError, match="classify_chunk must be >= 2"):
        build_method({"name": "dummyforcing", "classify_chunk": 1})


def test_dummyforcing_normalises_each_region_by_its_own_total_and_breaks_ties_towards_first():
    """Region totals below 1 (first 0.375, middle 0.75): each mass is divided by its own region's total
    over all layer-heads (neither multiplied by it nor left as is), so head (0, 0) is middle (5/12 > 1/3)
    and head (1, 1) ties at 1/3 and stays first (``first < middle`` picks middle, a tie does not); the two
    lowest max(first, middle), 1/6 and the tie at 1/3, go to head (1, 0) and, of the tied, the lower
    layer-head (0, 1)."""
    method = build_method(DUMMY)
    regions = method.regions(G, ChunkInfo(2, 4, 2, 16, 8))
    mass = torch.zeros(2, 2, 6)
    mass[..., 0] = torch.tensor([[0.125, 0.125], [0.0, 0.125]])  # first region (frames 0, 2)
    mass[..., 3] = torch.tensor([[0.3125, 0.0625], [0.125, 0.25]])  # middle region (frame 3)
    assert method.classify(mass, regions).tolist() == [[1, 2], [2, 0]]


def test_dummyforcing_picks_the_lowest_layer_heads_among_equal_costs_at_any_size():
    """Ties in max(first, middle) go to the lower layer-head however many heads tie (a stable sort: an
    unstable one reorders ties from 32 elements on): with 4 x 8 equal layer-heads, layers 0 and 1 are
    the dummy half, and the others, first and middle tied, are first."""
    method = build_method(DUMMY)
    regions = method.regions(G, ChunkInfo(2, 4, 2, 16, 8))
    mass = torch.zeros(4, 8, 6)
    mass[..., 0], mass[..., 3] = 0.25, 0.5  # normalised over the 32 heads: 1/32 each, first and middle
    assert method.classify(mass, regions).tolist() == [[2] * 8] * 2 + [[0] * 8] * 2


@pytest.mark.parametrize("fraction, ok", [(0.0, True), (1.0, True), (-0.01, False), (1.01, False), (2.0, False)])
def test_dummyforcing_dummy_fraction_is_a_fraction(fraction, ok):
    cfg = {"name": "dummyforcing", "dummy_fraction": fraction}
    if ok:
        assert build_method(cfg).dummy_fraction == fraction
    else:
        with pytest.raises(ConfigError, match=rf"dummyforcing: dummy_fraction must be in \[0, 1\], got {fraction}"):
            build_method(cfg)


@pytest.mark.parametrize("knobs, frames_seen, chunk_frames, bank", [
    ({}, 14, 2, (6, 8)),  # a 10-frame gap (frames 2-11) around a 2-frame bank: 4 chunks of slack, 2 before it
    ({}, 6, 2, (2, 4)),  # the gap is the bank
    ({"middle_frames": 10}, 13, 2, (2, 10)),  # a 9-frame gap holds 4 whole chunks
    ({"middle_frames": 0}, 14, 2, (2, 2)),  # no bank: empty, at the first frames' end
    ({"first_frames": 4, "recent_frames": 4}, 6, 2, (4, 4)),  # nothing between first and recent
])
def test_dummyforcing_centre_bank_is_whole_chunks_centred_in_the_gap(knobs, frames_seen, chunk_frames, bank):
    begin, end = build_method({**DUMMY, **knobs}).centre_bank(frames_seen, chunk_frames)
    assert (begin, end) == bank and type(begin) is int and type(end) is int  # frame indices, never floats


def test_dummyforcing_places_the_centre_bank_when_it_classifies_and_sizes_each_roles_bank():
    """Classified at chunk 3 of an 8-frame context (8 frames seen): the 4-frame gap between the first 2 and
    the newest 2 holds the 2-frame bank at frames 2-3 (slack of one chunk, none before it), not where 10
    frames would put it (4-5); the banks are sized first 2, middle 2 + 2, dummy 2 frames of 4 tokens; an
    uncalibrated cache is one dense "unclassified" bank per layer; classifying without the attention is
    refused with the chunk named."""
    torch.manual_seed(0)  # the heads' roles follow the attention on this random context: with it, each role has a head
    backbone = AttentionBackbone(G)
    method = build_method({**DUMMY, "classify_chunk": 3})
    assert [[(g.role, g.heads) for g in layer] for layer in method.layout(G)] == [[("unclassified", (0, 1))]] * 2
    pre = prefill(backbone, method, torch.randn(1, 3, 8, 4, 4), None, 0)
    assert {b.role: b.group.max_tokens for b in pre.cache.all_banks()} == {"first": 8, "middle": 16, "dummy": 8}
    cont = continue_task(backbone, pre, None, 4, 1)
    middle = [b for b in cont.cache.all_banks() if b.role == "middle"]
    assert middle and all(sorted(set(b.field("frame").tolist())) == [2, 3, 10, 11] for b in middle)
    sig = ChunkSignals(geometry=G, chunk=ChunkInfo(3, 6, 2, 24, 8), phase="context", generated_index=None,
                       context_frames=8, seed=0, x0_final=torch.zeros(1, 3, 2, 4, 4))
    with pytest.raises(RuntimeError, match="dummyforcing needs the attention of chunk 3"):
        method.after_chunk(KVCache.from_geometry(G), sig)


def test_decoprune_reverse_keeps_scores_at_gamma_and_evicts_the_highest_first():
    """Reverse keeps ``score <= gamma`` (a score exactly at gamma too, non-finite ones always) and, in quota
    mode or under a memory bound, evicts the highest scores first (non-finite ones last)."""
    reverse = build_method({"name": "decoprune_reverse", "gamma": 0.5})
    score = torch.tensor([0.25, 0.5, 0.75, math.nan])
    assert reverse.keep_rule(score).tolist() == [True, True, False, True]
    assert reverse.priority(score).tolist() == [-0.25, -0.5, -0.75, math.inf]


def test_quota_mode_hits_quota_pr(tmp_path):
    g = fake_geometry(num_heads=4)
    backbone = AttentionBackbone(g)
    path = tmp_path / "map.json"
    HeadMap(2, 4, ((), (0, 3))).save(path)
    context = torch.randn(1, 3, 48, 4, 4)  # long enough for DeCoPrune's sink + two dense chunks at PR 0.8
    for cfg in ({"name": "decoprune"}, {"name": "decoprune_reverse"}, {"name": "random"}, {"name": "tempdiff"},
                {"name": "forcingkv", "head_map": str(path), "layer_zero": "map"},
                {"name": "decoprune_hs", "head_map": str(path)}):
        for target in (0.5, 0.8):
            method = build_method({**cfg, "quota_pr": target})
            pre = prefill(backbone, method, context, None, 0)
            cont = continue_task(backbone, pre, None, 8, 1)
            assert abs(cont.ledger.pruning_ratio() - target) < 0.01, (cfg, target, cont.ledger.pruning_ratio())
            assert cont.summary(method)["quota_pr"] == target


def test_quota_tokens_and_bounded_memory_never_exceed_their_cap():
    backbone = AttentionBackbone(G)
    context = torch.randn(1, 3, 16, 4, 4)
    for cfg in ({"name": "fullkv", "max_history_tokens": 24}, {"name": "decoprune", "gamma": 0.0, "max_history_tokens": 24},
                {"name": "tempdiff", "quota_tokens": 20}):
        method = build_method(cfg)
        pre = prefill(backbone, method, context, None, 0)
        cont = continue_task(backbone, pre, None, 8, 1)
        cap = cfg.get("max_history_tokens", cfg.get("quota_tokens"))
        for entry in pre.ledger.entries + cont.ledger.entries:
            assert int(entry.visible.max()) <= cap
        assert int(cont.ledger.entries[-1].visible.max()) == cap
        if "max_history_tokens" in cfg:
            assert all(b.capacity <= cap + G.tokens_per_chunk for b in cont.cache.all_banks())
    # FullKV under a cap evicts oldest first: sink + the newest chunks remain
    method = build_method({"name": "fullkv", "max_history_tokens": 24})
    cont = continue_task(backbone, prefill(backbone, method, context, None, 0), None, 8, 1)
    assert survivors(cont.cache) == chunk_gids(0) + chunk_gids(10) + chunk_gids(11)
    with pytest.raises(ConfigError, match="smaller than the sink and recent window"):
        prefill(backbone, build_method({"name": "fullkv", "max_history_tokens": 12}), context, None, 0)


def test_bounded_memory_evicts_lowest_scores_first():
    # context chunks' d: chunk c token i -> distinct scores; cap leaves room for 4 non-protected tokens
    backbone = scripted(d=lambda gid: 0.01 * gid * (1 if gid % 2 else -1) + 3.0 * (gid in (10, 20, 21)))
    method = build_method({"name": "decoprune", "gamma": 0.0, "max_history_tokens": 28})
    pre = prefill(backbone, method, backbone.world[:, :, :8], None, 0)
    # after chunk 3: sink (8) + the dense chunks 2-3 (16) protected; 4 of chunk 1 stay: the highest scores
    kept_chunk1 = [g for g in survivors(pre.cache) if 8 <= g < 16]
    scores = {g: (0.899 * (0.01 * g * (1 if g % 2 else -1) + 3.0 * (g in (10, 20, 21)))) ** 2 for g in range(8, 16)}
    assert kept_chunk1 == sorted(sorted(scores, key=scores.get)[-4:])


def test_non_finite_scores_and_knob_validation():
    method = build_method({"name": "decoprune"})
    score = torch.tensor([0.5, float("nan"), 0.01, float("inf")])
    assert method.keep_rule(score).tolist() == [True, True, False, True]
    assert method.priority(score).tolist() == pytest.approx([0.5, math.inf, 0.01, math.inf])
    with pytest.raises(ConfigError, match="score must be one of"):
        build_method({"name": "decoprune", "score": "l1"})
    with pytest.raises(ConfigError, match="quota_pr or quota_tokens"):
        build_method({"name": "decoprune", "quota_pr": 0.5, "quota_tokens": 3})
    with pytest.raises(ConfigError, match="probe_step=4 names no step of the 4-step schedule"):
        run(build_method({"name": "decoprune", "probe_step": 4}))


def test_score_variants():
    g = G
    x_final = timeline(g, 2, lambda gid: 0.0)
    x_probe = timeline(g, 2, lambda gid: float(gid))
    x_nc = timeline(g, 2, lambda gid: 2.0 * gid + 1.0)
    info = KVCache.from_geometry(g).begin_chunk(0, 0, 2)
    sig = ChunkSignals(geometry=g, chunk=info, phase="generation", generated_index=0, context_frames=0, seed=0,
                       x0_final=x_final, x0_probe=x_probe, x0_no_context=x_nc)
    mse = torch.arange(8, dtype=torch.float32) ** 2
    torch.testing.assert_close(build_method({"name": "decoprune"}).token_scores(sig), mse)
    ratio = build_method({"name": "decoprune", "score": "mse_over_no_context"}).token_scores(sig)
    torch.testing.assert_close(ratio, mse / (2 * torch.arange(8.0) + 1) ** 2)
    normalised = build_method({"name": "decoprune", "score": "chunk_normalised"}).token_scores(sig)
    torch.testing.assert_close(normalised, mse / mse.mean())


def test_post_prune_probe_hides_what_the_next_compaction_drops():
    """The probe of chunk c sees chunk c-2 as the compaction before c's t = 0 pass will leave it
    (post-prune), or dense (the paper's default). Context chunk 2 = frames 4-5 (nothing to drop yet);
    generated chunks 4 and 5 = frames 8-9 and 10-11."""
    views = {}
    for post_prune in (True, False):
        backbone = viewing(12)
        run(build_method({"name": "decoprune", "post_prune": post_prune}), backbone)
        views[post_prune] = {start: seen for (start, t, probing), seen in backbone.views.items() if probing}
    c = chunk_gids
    assert views[True][4] == views[False][4] == c(0) + c(1)
    assert views[True][8] == c(0) + CHUNK1 + CHUNK2 + c(3)
    assert views[True][10] == c(0) + CHUNK1 + CHUNK2 + CHUNK3 + c(4)
    assert 10 not in views[False]  # generated chunks reuse their own trajectory: no extra call


@pytest.mark.parametrize("name", ["fullkv", "streaming", "decoprune", "decoprune_reverse", "decoprune_hs", "random",
                                  "tempdiff", "forcingkv", "dummyforcing"])
def test_invariants_for_every_method(name, tmp_path):
    """After every chunk: ids strictly increasing in every bank, banks within their configured size,
    provenance consistent; attention over a real model runs end to end."""
    path = tmp_path / "map.json"
    HeadMap(2, 2, ((), (1,))).save(path)
    cfg = {"name": name, **({"head_map": str(path)} if name in ("decoprune_hs", "forcingkv") else {}),
           **({"k": 6} if name in ("forcingkv", "tempdiff") else {})}
    method = build_method(cfg)
    checks = []

    def checked(cache, sig):
        for bank in cache.all_banks():
            gid = bank.field("gid")
            assert torch.all(gid[1:] > gid[:-1])
            assert torch.equal(gid, bank.field("frame") * 4 + bank.field("pos"))
            assert torch.equal(bank.field("chunk"), bank.field("frame") // 2)
            if bank.group.max_tokens is not None:
                assert bank.n <= bank.group.max_tokens  # what the next chunk sees fits the bank
        checks.append(sig.chunk.index)

    backbone = AttentionBackbone(G)
    pre = prefill(backbone, method, torch.randn(1, 3, 8, 4, 4), None, 3, on_chunk_end=checked)
    cont = continue_task(backbone, pre, None, 8, 4, on_chunk_end=checked)
    assert checks == list(range(8))
    assert torch.isfinite(cont.latents).all()


def test_dummyforcing_normalises_over_all_layer_heads_not_per_layer():
    """Layer 0 attends to the context far less than layer 1 (masses 0.01 vs 0.6): normalised over all four
    layer-heads, both heads of layer 0 have the lowest max(first, middle) and become dummy; normalised per
    layer, each layer's masses would sum to 1 and layer 1's heads would be the dummy ones."""
    method = build_method(DUMMY)
    regions = method.regions(G, ChunkInfo(2, 4, 2, 16, 8))
    mass = torch.zeros(2, 2, 6)
    mass[0, 0, [0, 4]] = torch.tensor([0.01, 0.99])  # first 0.01, middle 0
    mass[0, 1, [3, 4]] = torch.tensor([0.01, 0.99])  # first 0, middle 0.01
    mass[1, 0, [0, 3, 4]] = torch.tensor([0.50, 0.10, 0.40])  # first 0.5 > middle 0.1 -> first
    mass[1, 1, [2, 3, 5]] = torch.tensor([0.10, 0.50, 0.40])  # middle 0.5 > first 0.1 -> middle
    assert method.classify(mass, regions).tolist() == [[2, 2], [0, 1]]


def test_random_draws_depend_on_the_run_seed_as_well_as_the_seed_knob():
    """Seeds of one setup must draw different tokens (else every seed of a sweep repeats one draw), while a
    rerun of one seed draws the same."""
    first = survivors(run(build_method({"name": "random"}), seed=0)[1].cache)
    again = survivors(run(build_method({"name": "random"}), seed=0)[1].cache)
    other = survivors(run(build_method({"name": "random"}), seed=3)[1].cache)
    assert first == again != other
    assert len(first) == len(other)  # the count is DeCoPrune's either way



def test_random_draws_each_chunk_afresh_and_the_draw_is_pinned():
    """The draw is seeded by the chunk too (else every chunk with the same count keeps the same in-chunk
    positions), and is the same in every version: published random-control numbers depend on it."""
    cache = run(build_method({"name": "random", "keep_counts": dict.fromkeys(range(1, 6), 4)}))[1].cache
    positions = {c: tuple(g - 8 * c for g in survivors(cache) if 8 * c <= g < 8 * c + 8) for c in (1, 2, 3)}
    assert all(len(p) == 4 for p in positions.values()) and len(set(positions.values())) == 3
    assert positions == PINNED_RANDOM_POSITIONS


PINNED_RANDOM_POSITIONS = {1: (3, 4, 6, 7), 2: (1, 4, 5, 7), 3: (0, 1, 3, 7)}  # seed knob 0, run(seed=0)


def test_random_budget_mode_keeps_random_tokens_too():
    """With a quota the budget keeps the highest random priorities: another seed keeps other tokens,
    as many."""
    first = survivors(run(build_method({"name": "random", "quota_pr": 0.3}), seed=0)[1].cache)
    other = survivors(run(build_method({"name": "random", "quota_pr": 0.3}), seed=3)[1].cache)
    assert len(first) == len(other) and first != other


def test_random_runs_no_probe_when_the_counts_do_not_come_from_scores():
    decoprune_needs = build_method({"name": "decoprune"}).needs()
    assert decoprune_needs != Needs() and build_method({"name": "random"}).needs() == decoprune_needs
    assert build_method({"name": "random", "keep_counts": {1: 1}}).needs() == Needs()
    assert build_method({"name": "random", "quota_pr": 0.5}).needs() == Needs()


def test_random_counts_follow_decoprunes_options_and_keep_counts_are_range_checked():
    """DeCoPrune's mask options (``context_only``) set random's counts too; a chunk may be kept whole or
    dropped, not more."""
    assert run(build_method({"name": "random", "context_only": True}))[1].kept_tokens == \
        run(build_method({"name": "decoprune", "context_only": True}))[1].kept_tokens == \
        {0: 8, 1: 6, 2: 5, 3: 8, 4: 8, 5: 8}
    whole = run(build_method({"name": "random", "keep_counts": {1: 8, 2: 0, 3: 8, 4: 1, 5: 1}}))[1]
    assert [whole.kept_tokens[c] for c in (1, 2, 3)] == [8, 0, 8]
    for count in (9, -1):
        with pytest.raises(ConfigError, match=rf"^random: keep_counts\[1\] = {count} is outside 0\.\.8$"):
            run(build_method({"name": "random", "keep_counts": {1: count, 2: 1, 3: 1, 4: 1, 5: 1}}))

def test_decoprune_context_only_keeps_the_continuation_dense():
    _, cont = run(build_method({"name": "decoprune", "context_only": True}))
    assert cont.kept_tokens == {0: 8, 1: 6, 2: 5, 3: 8, 4: 8, 5: 8}  # the context as DeCoPrune's, chunk 3 dense


def test_decoprune_spatial_floor_tops_up_each_block_by_hand():
    """Blocks of 2 x 2 tokens are whole frames here; at least 3 kept per frame, highest scores first,
    ties to the lower index: frame 2 gains 8 (8 and 11 tie), frame 5 gains 20, frame 6 gains 25
    (d = 1.0 beats 26's 0.1), frame 7 gains 28 and 31."""
    _, cont = run(build_method({"name": "decoprune", "min_keep_per_block": 3, "block_tokens": 2}))
    assert [g for g in survivors(cont.cache) if g < 32] == (chunk_gids(0) + [8, *CHUNK1] + sorted([*CHUNK2, 20])
                                          + [24, 25, 27, 28, 30, 31])
    _, off = run(build_method({"name": "decoprune", "min_keep_per_block": 3, "block_tokens": 2,
                               "floor_threshold": 10.0}))
    assert off.kept_tokens == {0: 8, 1: 6, 2: 5, 3: 3, 4: 8, 5: 8}  # no block's best score is above 10


def test_decoprune_normalized_mse_and_cosine_scores_by_hand():
    from cmbench.methods.decoprune import DeCoPrune

    final = torch.zeros(1, 3, 1, 4, 4)  # 2 x 2 tokens of 2 x 2 x 3 values
    final[:, :, :, :2, :2] = 2.0  # token 0: energy 4
    final[:, :, :, :2, 2:] = 1.0  # token 1: energy 1
    probe = final.clone()
    probe[:, 0, :, :, :] += 1.0  # one channel in three off by 1: mse 1/3 everywhere
    sig = ChunkSignals(chunk=ChunkInfo(3, 6, 1, 24, 4), phase="generation", generated_index=0, context_frames=6, seed=0,
                       x0_final=final, x0_probe=probe, geometry=G)
    normalized = DeCoPrune(score="normalized_mse").token_scores(sig)
    assert normalized[:2].tolist() == pytest.approx([1 / 12, 1 / 3])
    assert normalized[2:].tolist() == pytest.approx([1 / 3e-8] * 2)  # zero energy: divided by 1e-8
    cosine = DeCoPrune(score="cosine", gamma=0.9).token_scores(sig)
    # token 0: (2, 2, 2) vs (3, 2, 2) per position; token 2: (0, 0, 0) vs (1, 0, 0): cosine 0 (eps)
    assert cosine[0].item() == pytest.approx(14 / math.sqrt(12 * 17))
    assert cosine[2].item() == pytest.approx(0.0)
    keep = DeCoPrune(score="cosine", gamma=0.9).keep_rule(cosine)
    assert keep.tolist() == [False, False, True, True]  # low agreement is kept
    assert DeCoPrune(score="cosine").priority(cosine).argmax().item() in (2, 3)


def test_tempdiff_update_each_chunk_chooses_again_after_every_generated_chunk():
    """As above, k = 2; after each generated chunk the candidates are every stored frame between the
    sink and the recent chunk, generated ones included: the earliest two turning blocks stay (ties:
    the earlier block), generated frames leaving the window are pruned, so the history stops growing."""
    backbone = scripted(d=lambda gid: 0.0, world=one_hot_world)
    _, cont = run(build_method({"name": "tempdiff", "k": 2, "update_each_chunk": True}), backbone)
    assert survivors(cont.cache) == chunk_gids(0) + [8, 12] + chunk_gids(5)
    assert per_head_visible(cont) == [(18, 24), (18, 32), (18, 40)]
    assert cont.kept_tokens == {0: 8, 1: 2, 2: 0, 3: 0, 4: 0, 5: 8}


def test_decoprune_with_tempdiffs_context_selection_differs_from_tempdiff_only_in_the_continuation(monkeypatch):
    """The matched-context experiment: the context's survivors are TempDiff's (here with k = 2: position
    0 of frames 2 and 3, as TempDiff alone), the continuation is pruned by DeCoPrune's rule."""
    import functools

    from cmbench.methods import decoprune, tempdiff

    monkeypatch.setattr(decoprune, "TempDiff", functools.partial(tempdiff.TempDiff, k=2))
    _, alone = run(build_method({"name": "tempdiff", "k": 2}), scripted(d=d_pattern, world=one_hot_world))
    _, matched = run(build_method({"name": "decoprune", "context_selection": "tempdiff"}),
                     scripted(d=d_pattern, world=one_hot_world))
    context = chunk_gids(0) + [8, 12] + chunk_gids(2)
    assert [g for g in survivors(alone.cache) if g < 24] == context
    assert survivors(matched.cache) == context + CHUNK3 + chunk_gids(4) + chunk_gids(5)
    with pytest.raises(ConfigError, match="context_selection must be one of decoprune, tempdiff"):
        build_method({"name": "decoprune", "context_selection": "streaming"})


def test_streaming_sizes_one_bank_per_layer_to_its_sink_and_recent_window():
    """Streaming's banks hold every head, with the sink and the recent window as their size (capped by
    max_history_tokens): the memory plan and the peak device KV read this size."""
    g = fake_geometry(num_layers=3, num_heads=2)
    layout = build_method({"name": "streaming", "sink_chunks": 1, "recent_chunks": 3}).layout(g)
    assert [[(group.heads, group.role, group.max_tokens) for group in layer] for layer in layout] == \
        [[((0, 1), "all", 4 * g.tokens_per_chunk)]] * 3
    capped = build_method({"name": "streaming", "recent_chunks": 3, "max_history_tokens": 5}).layout(g)
    assert {group.max_tokens for layer in capped for group in layer} == {5}


def test_tempdiff_block_similarity_by_hand():
    """Per consecutive-frame pair and block: the mean over the block's tokens of the key cosine, with
    norms below 1e-8 only clamped (a key of norm 0.5 keeps its own norm)."""
    frames = [[(0.5, 0.0), (0.0, 2.0), (3.0, 4.0)],   # tokens 0, 1 in block 0; token 2 in block 1
              [(0.5, 0.0), (0.0, 5.0), (4.0, -3.0)],  # cosines to frame 0: 1, 1 | 0
              [(0.0, 0.5), (1.0, 0.0), (-4.0, 3.0)]]  # cosines to frame 1: 0, 0 | -1
    keys = torch.tensor(frames)[None, :, :, None, :]  # [B=1, 3 frames, T=3, H=1, D=2]
    sim = block_similarity(keys, torch.tensor([0, 0, 1]))
    torch.testing.assert_close(sim, torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
    bounds = split_bounds(7, 3)
    assert bounds.tolist() == [0, 3, 5, 7] and bounds.dtype == torch.long  # larger parts first, integer offsets


def test_decoprune_keep_rule_at_gamma_its_probes_and_its_window():
    """MSE-type scores keep what lies above gamma, a similarity keeps what lies at or below it, and a
    non-finite score is always kept; the no-context probe is asked for by the score that divides by
    it; the delayed compaction of scored banks waits twice the recent window."""
    cosine = build_method({"name": "decoprune", "score": "cosine", "gamma": 0.5})
    assert cosine.keep_rule(torch.tensor([0.4, 0.5, 0.6, math.nan])).tolist() == [True, True, False, True]
    mse = build_method({"name": "decoprune", "gamma": 0.5, "recent_chunks": 3})
    assert mse.keep_rule(torch.tensor([0.4, 0.5, 0.6, math.inf])).tolist() == [False, False, True, True]
    assert mse.needs().no_context_probe is False
    assert build_method({"name": "decoprune", "score": "mse_over_no_context"}).needs().no_context_probe is True
    assert mse.window() == 6
    # the cosine of tokens of small norm (0.02 per value) is still 1 for parallel values, 0 for orthogonal ones
    a = torch.full((1, G.latent_channels, 2, G.latent_height, G.latent_width), 0.02)
    b = a.clone()
    b[:, 0] = -b[:, 0]  # one of three channels flipped: per token, (2 - 1) / 3 of its values agree
    torch.testing.assert_close(token_cosine(a, 2 * a, G), torch.ones(2 * G.tokens_per_frame))
    torch.testing.assert_close(token_cosine(a, b, G), torch.full((2 * G.tokens_per_frame,), 1.0 / 3.0))
