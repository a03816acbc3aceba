"""Methods on a scripted sequence of chunks: exactly which tokens survive, and the ledger, by hand.

Geometry (tests/fakes.py): 4 tokens per latent frame, chunks of 2 frames (8 tokens), 2 layers x 2 heads.
Timeline: a 6-frame context (chunks 0-2) and a 6-frame continuation (chunks 3-5); token ``gid`` =
``frame * 4 + pos``. The scripted backbone predicts ``x0 = world + t * D`` so DeCoPrune's score of a
token with discrepancy ``d`` is ``(0.899 d)^2 = 0.808 d^2`` on context chunks (re-noise probe against
the observed ``world``) and ``((0.899 - 0.702) d)^2 = 0.0388 d^2`` on generated chunks.
"""

import math

import pytest
import torch

from cmbench.cache import KVCache
from cmbench.errors import ConfigError
from cmbench.generation import continue_task, prefill
from cmbench.methods import build_method
from cmbench.methods.base import ChunkSignals
from cmbench.methods.head_map import HeadMap
from fakes import single_thread, AttentionBackbone, ScriptedBackbone, fake_geometry, survivors, timeline  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

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


def test_decoprune_survivors_and_ledger_by_hand():
    pre, cont = run(build_method({"name": "decoprune"}))
    chunk1 = [9, 10, 12, 13, 14, 15]  # %3 in {0, 1}, plus the NaN token 14
    chunk2 = [16, 18, 19, 21, 22]
    # after prefill chunk 1 is compacted, chunk 2 (recent window) is still dense
    assert survivors(pre.cache) == chunk_gids(0) + chunk1 + chunk_gids(2)
    expect = chunk_gids(0) + chunk1 + chunk2 + [24, 27, 30] + [33, 36, 39] + chunk_gids(5)
    for layer in range(2):
        assert survivors(cont.cache, layer) == expect
    assert per_head_visible(cont) == [(22, 24), (27, 32), (30, 40)]
    assert cont.ledger.pruning_ratio() == pytest.approx(1 - 79 / 96)
    assert [(int(e.visible[0, 0]), e.full) for e in pre.ledger.entries] == [(0, 0), (8, 8), (16, 16)]
    assert pre.ledger.pruning_ratio() == 0.0
    assert cont.kept_tokens == {0: 8, 1: 6, 2: 5, 3: 3, 4: 3, 5: 8}
    assert pre.cache.banks[0][0].n == 22  # the prefilled cache is untouched by the task


def test_decoprune_reverse_keeps_low_scores():
    _, cont = run(build_method({"name": "decoprune_reverse"}))
    expect = chunk_gids(0) + [8, 11, 14] + [17, 20, 23] + [25, 26, 28, 29, 31] + [32, 34, 35, 37, 38] + chunk_gids(5)
    assert survivors(cont.cache) == expect


def test_gamma_moves_the_threshold():
    # gamma 0.03: generated d=1 tokens score 0.0388 > 0.03 and are kept too
    _, cont = run(build_method({"name": "decoprune", "gamma": 0.03}))
    assert [g for g in survivors(cont.cache) if 24 <= g < 40] == [24, 25, 27, 28, 30, 31, 33, 34, 36, 37, 39]


def test_streaming_and_fullkv():
    _, cont = run(build_method({"name": "streaming", "recent_chunks": 1}))
    assert survivors(cont.cache) == chunk_gids(0) + chunk_gids(5)
    assert per_head_visible(cont) == [(16, 24), (16, 32), (16, 40)]
    _, cont = run(build_method({"name": "streaming", "sink_chunks": 1, "recent_chunks": 0}))
    assert survivors(cont.cache) == chunk_gids(0)
    assert per_head_visible(cont) == [(8, 24), (8, 32), (8, 40)]
    _, cont = run(build_method({"name": "fullkv"}))
    assert survivors(cont.cache) == list(range(48))
    assert cont.ledger.pruning_ratio() == 0.0


def test_random_is_seeded_and_counts_are_exact():
    a = run(build_method({"name": "random", "keep_ratio": 0.25}))[1]
    b = run(build_method({"name": "random", "keep_ratio": 0.25}))[1]
    c = run(build_method({"name": "random", "keep_ratio": 0.25, "seed": 1}))[1]
    assert survivors(a.cache) == survivors(b.cache) != survivors(c.cache)
    assert a.kept_tokens == {0: 8, 1: 2, 2: 2, 3: 2, 4: 2, 5: 8}
    counts = {1: 5, 2: 0, 3: 7, 4: 1, 5: 3}
    _, d = run(build_method({"name": "random", "keep_counts": counts}))
    assert d.kept_tokens == {0: 8, 1: 5, 2: 0, 3: 7, 4: 1, 5: 8}
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


def test_tempdiff_keeps_the_changed_patch_of_every_frame():
    backbone = scripted(d=lambda gid: 0.0, world=one_hot_world)
    _, cont = run(build_method({"name": "tempdiff", "keep_ratio": 0.25}), backbone)  # K = 1 per frame
    assert survivors(cont.cache) == chunk_gids(0) + list(range(8, 40, 4)) + chunk_gids(5)


def test_forcingkv_top_k_within_history_and_static_heads(tmp_path):
    path = tmp_path / "map.json"
    HeadMap(2, 2, ((), (0,))).save(path)
    backbone = scripted(d=lambda gid: 0.0, world=one_hot_world)
    method = build_method({"name": "forcingkv", "k": 2, "history_chunks": 2, "head_map": str(path)})
    _, cont = run(method, backbone)
    # dynamic banks: sink, the two changed patches of chunk 3 (chunks 1-2 fell out of the 2-chunk range)
    assert survivors(cont.cache, 0) == chunk_gids(0) + [24, 28] + chunk_gids(5)
    assert [b.group.heads for b in cont.cache.banks[1]] == [(1,), (0,)]
    assert survivors(cont.cache, 1, 0) == chunk_gids(0) + [24, 28] + chunk_gids(5)
    assert survivors(cont.cache, 1, 1) == chunk_gids(0) + chunk_gids(5)  # static head: sink + recent
    last = cont.ledger.entries[-1].visible
    assert last.tolist() == [[18, 18], [16, 18]]


def test_decoprune_hs_static_heads_stream_and_layer0_is_dynamic(tmp_path):
    path = tmp_path / "map.json"
    HeadMap(2, 2, ((1,), (0,))).save(path)
    _, cont = run(build_method({"name": "decoprune_hs", "head_map": str(path)}))
    decoprune = chunk_gids(0) + [9, 10, 12, 13, 14, 15] + [16, 18, 19, 21, 22] + [24, 27, 30] + [33, 36, 39] + chunk_gids(5)
    assert len(cont.cache.banks[0]) == 1 and survivors(cont.cache, 0) == decoprune
    roles = {b.role: b for b in cont.cache.banks[1]}
    assert roles["dynamic"].group.heads == (1,) and roles["static"].group.heads == (0,)
    assert roles["dynamic"].field("gid").tolist() == decoprune
    assert roles["static"].field("gid").tolist() == chunk_gids(0) + chunk_gids(5)
    # the ledger counts every head: layer 1 head 0 sees sink + recent only
    assert [e.visible[1, 0].item() for e in cont.ledger.entries] == [16, 16, 16]
    assert [e.visible[1, 1].item() for e in cont.ledger.entries] == [22, 27, 30]
    with pytest.raises(ConfigError, match="needs head_map"):
        run(build_method({"name": "decoprune_hs"}))


class _Stats:
    def __init__(self, mass):
        self.mass = mass

    def stacked(self):
        return self.mass


def test_dummyforcing_classification_by_hand():
    method = build_method({"name": "dummyforcing", "first_frames": 2, "middle_frames": 2, "last_frames": 2})
    # history frames 0..7, chunk at frames 8-9: first = [0, 2), middle = [2, 6), last = [6, 10)
    mass = torch.zeros(2, 2, 10)
    mass[0, 0, 8] = 1.0                                  # all on the chunk itself -> dummy
    mass[0, 1, 0], mass[0, 1, 3], mass[0, 1, 7] = 0.5, 0.2, 0.3  # last 0.3, first > middle -> first
    mass[1, 0, 1], mass[1, 0, 4], mass[1, 0, 6] = 0.1, 0.6, 0.3  # last 0.3, middle > first -> middle
    mass[1, 1, 7], mass[1, 1, 9], mass[1, 1, 2] = 0.4, 0.4, 0.2  # last 0.8 -> dummy
    assert method.classify(_Stats(mass), frame_start=8).tolist() == [[0, 1], [2, 0]]


def test_dummyforcing_banks_follow_their_roles():
    backbone = AttentionBackbone(G)
    method = build_method({"name": "dummyforcing", "first_frames": 2, "middle_frames": 2, "last_frames": 2,
                           "classify_chunk": 1})
    pre = prefill(backbone, method, torch.randn(1, 3, 8, 4, 4), None, 0)
    assert {tuple(sorted(set(b.field("frame").tolist()))) for b in pre.cache.all_banks()} == {(0, 1, 4, 5, 6, 7)}
    cont = continue_task(backbone, pre, None, 6, 1)
    frames = {"first": [0, 1, 12, 13], "middle": [10, 11, 12, 13], "dummy": [12, 13]}
    roles = [b.role for b in cont.cache.all_banks()]
    assert roles.count("dummy") and "unclassified" not in roles
    assert sum(b.num_heads for b in cont.cache.all_banks() if b.role == "dummy") == 2  # half of 4 layer-heads
    for bank in cont.cache.all_banks():
        assert sorted(set(bank.field("frame").tolist())) == frames[bank.role]


def test_budget_mode_hits_target_pr(tmp_path):
    g = fake_geometry(num_heads=4)
    backbone = AttentionBackbone(g)
    path = tmp_path / "map.json"
    HeadMap(2, 4, ((), (0, 3))).save(path)
    context = torch.randn(1, 3, 24, 4, 4)
    for cfg in ({"name": "decoprune"}, {"name": "decoprune_reverse"}, {"name": "random"}, {"name": "tempdiff"},
                {"name": "forcingkv", "head_map": str(path)}, {"name": "decoprune_hs", "head_map": str(path)}):
        for target in (0.5, 0.8):
            method = build_method({**cfg, "target_pr": target})
            pre = prefill(backbone, method, context, None, 0)
            cont = continue_task(backbone, pre, None, 8, 1)
            assert abs(cont.ledger.pruning_ratio() - target) < 0.01, (cfg, target, cont.ledger.pruning_ratio())
            assert cont.summary(method)["target_pr"] == target


def test_token_budget_and_bounded_memory_never_exceed_their_cap():
    backbone = AttentionBackbone(G)
    context = torch.randn(1, 3, 16, 4, 4)
    for cfg in ({"name": "fullkv", "max_history_tokens": 24}, {"name": "decoprune", "gamma": -1.0, "max_history_tokens": 24},
                {"name": "tempdiff", "token_budget": 20}):
        method = build_method(cfg)
        pre = prefill(backbone, method, context, None, 0)
        cont = continue_task(backbone, pre, None, 8, 1)
        cap = cfg.get("max_history_tokens", cfg.get("token_budget"))
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
    method = build_method({"name": "decoprune", "gamma": -1.0, "max_history_tokens": 20})
    pre = prefill(backbone, method, backbone.world[:, :, :CTX], None, 0)
    # after chunk 2: sink (8) + window chunk 2 (8) protected; 4 of chunk 1 stay: the highest scores
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
    with pytest.raises(ConfigError, match="target_pr or token_budget"):
        build_method({"name": "decoprune", "target_pr": 0.5, "token_budget": 3})
    with pytest.raises(ConfigError, match="probe_step=3 must name a step before the last"):
        run(build_method({"name": "decoprune", "probe_step": 3}))


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
    """The probe of chunk c sees chunk c-1 as the next compaction will leave it (post-prune), or dense
    (the paper's default). Context chunk 2 = frames 4-5; generated chunk 5 = frames 10-11."""

    class Recording(ScriptedBackbone):
        def denoise(self, x_t, t, cache, frame_start, cond=None):
            if cache.probing:
                self.probe_views[frame_start] = cache.visible_history(cache.banks[0][0]).tolist()
            return super().denoise(x_t, t, cache, frame_start, cond)

    views = {}
    for post_prune in (True, False):
        backbone = Recording(G, timeline(G, 12, lambda gid: 0.0), timeline(G, 12, d_pattern))
        backbone.probe_views = {}
        run(build_method({"name": "decoprune", "post_prune": post_prune}), backbone)
        views[post_prune] = backbone.probe_views
    chunk1 = [9, 10, 12, 13, 14, 15]
    assert views[True][4] == chunk_gids(0) + chunk1
    assert views[False][4] == chunk_gids(0) + chunk_gids(1)
    assert views[True][10] == chunk_gids(0) + chunk1 + [16, 18, 19, 21, 22] + [24, 27, 30] + [33, 36, 39]
    assert 10 not in views[False]  # generated chunks reuse their own trajectory: no extra call


@pytest.mark.parametrize("name", ["fullkv", "streaming", "decoprune", "decoprune_reverse", "decoprune_hs", "random",
                                  "tempdiff", "forcingkv", "dummyforcing"])
def test_invariants_for_every_method(name, tmp_path):
    """After every chunk: ids strictly increasing in every bank, banks within their configured size,
    provenance consistent; attention over a real model runs end to end."""
    path = tmp_path / "map.json"
    HeadMap(2, 2, ((), (1,))).save(path)
    cfg = {"name": name, **({"head_map": str(path)} if name in ("decoprune_hs", "forcingkv") else {}),
           **({"k": 6} if name == "forcingkv" else {}), **({"classify_chunk": 1} if name == "dummyforcing" else {})}
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
