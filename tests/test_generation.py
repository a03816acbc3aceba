"""The AR loop: probes leave no trace, forks are independent, seeds reproduce, the cache is causal."""

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from cmbench.cache.rope import reindex_frames
from cmbench.errors import ConfigError
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.methods import build_method
from cmbench.methods.decoprune import DeCoPrune
from fakes import AttentionBackbone, fake_geometry


G = fake_geometry(num_layers=2, num_heads=2, head_dim=12)
BACKBONE = AttentionBackbone(G, seed=1)
CONTEXT = torch.randn(1, 3, 8, 4, 4, generator=torch.Generator().manual_seed(2))


def bank_state(cache):
    return [(b.history()[0].clone(), b.history()[1].clone(), {n: b.field(n).clone() for n in b.PROVENANCE})
            for b in cache.all_banks()]


def assert_same_state(a, b):
    assert len(a) == len(b)
    for (ka, va, pa), (kb, vb, pb) in zip(a, b):
        assert torch.equal(ka, kb) and torch.equal(va, vb)
        for name in pa:
            if name != "priority":  # scores are recorded by the scoring method only
                assert torch.equal(pa[name], pb[name]), name


@pytest.mark.parametrize("variant", [{}, {"post_prune": True}, {"score": "mse_over_no_context"}])
def test_probes_leave_no_trace(variant):
    """A probing method that keeps everything stores exactly FullKV's cache and generates the same frames."""
    full = build_method({"name": "fullkv"})
    probing = build_method({"name": "decoprune", "gamma": 0.0, **variant})
    pre_full = prefill(BACKBONE, full, CONTEXT, None, 5)
    pre_probe = prefill(BACKBONE, probing, CONTEXT, None, 5)
    assert_same_state(bank_state(pre_full.cache), bank_state(pre_probe.cache))
    out_full = continue_task(BACKBONE, pre_full, None, 6, 7)
    out_probe = continue_task(BACKBONE, pre_probe, None, 6, 7)
    assert torch.equal(out_full.latents, out_probe.latents)
    assert_same_state(bank_state(out_full.cache), bank_state(out_probe.cache))
    assert out_probe.ledger.pruning_ratio() == 0.0


@dataclass
class HidingProbe(DeCoPrune):
    """Keeps every token (gamma 0: every score here is positive) but its post-prune probe hides chunk 1: the probe's prediction
    differs from the trajectory's, so any trace it left would show in the continuation."""

    gamma: float = 0.0
    post_prune: bool = True

    def probe_hide(self, cache):
        return lambda bank: bank.field("chunk") == 1


class ProbeCounting(AttentionBackbone):
    """Counts, per probe call, the history tokens layer 0 saw."""

    def denoise(self, x_t, t, cache, frame_start, cond=None):
        if cache.probing:
            self.probe_views.append(len(cache.visible_history(cache.banks[0][0])))
        return super().denoise(x_t, t, cache, frame_start, cond)


def test_a_probe_that_hides_chunks_leaves_no_trace():
    """The post-prune probe's x0 feeds the score only: with chunk 1 hidden from every probe, the stored
    cache and the continuation equal FullKV's exactly (the trajectory's own x0 drives the sampler)."""
    backbone = ProbeCounting(G, seed=1)
    backbone.load_state_dict(BACKBONE.state_dict())
    backbone.probe_views = []
    full = build_method({"name": "fullkv"})
    pre_full, pre_probe = prefill(BACKBONE, full, CONTEXT, None, 5), prefill(backbone, HidingProbe(), CONTEXT, None, 5)
    assert_same_state(bank_state(pre_full.cache), bank_state(pre_probe.cache))
    out_full = continue_task(BACKBONE, pre_full, None, 6, 7)
    out_probe = continue_task(backbone, pre_probe, None, 6, 7)
    assert torch.equal(out_full.latents, out_probe.latents)
    assert_same_state(bank_state(out_full.cache), bank_state(out_probe.cache))
    # context chunks 0-3 then generated chunks 4-6: chunk 1's 8 tokens are hidden once it is history
    assert backbone.probe_views == [0, 8, 8, 16, 24, 32, 40]


def test_fork_per_task_equals_fresh_runs_and_leaves_the_prefill_alone():
    method = build_method({"name": "decoprune", "gamma": 0.05})
    pre = prefill(BACKBONE, method, CONTEXT, None, 0)
    before = bank_state(pre.cache)
    a = continue_task(BACKBONE, pre, None, 4, 11)
    b = continue_task(BACKBONE, pre, None, 4, 12)
    assert_same_state(before, bank_state(pre.cache))
    fresh_b = continue_task(BACKBONE, prefill(BACKBONE, method, CONTEXT, None, 0), None, 4, 12)
    assert torch.equal(b.latents, fresh_b.latents)
    assert not torch.equal(a.latents, b.latents)
    again = continue_task(BACKBONE, pre, None, 4, 11)
    assert torch.equal(a.latents, again.latents)


def test_cached_kv_equals_one_block_causal_forward():
    """FullKV generation leaves, per layer, the K/V of a single forward over the clean sequence in which
    each chunk attends to earlier chunks and to itself (block-causal)."""

    class Capture:
        def __init__(self, mask):
            self.mask, self.kv = mask, {}

        def attend(self, layer, q, k, v):
            self.kv[layer] = (k, v)
            return F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=self.mask
            ).transpose(1, 2)

    settings = GenerationSettings(reindex=False)
    pre = prefill(BACKBONE, build_method({"name": "fullkv"}), CONTEXT, None, 0, settings)
    cont = continue_task(BACKBONE, pre, None, 4, 1)
    sequence = torch.cat([CONTEXT, cont.latents], dim=2)  # 12 frames = 6 chunks of 8 tokens
    chunk = torch.arange(12 * 4) // 8
    capture = Capture(chunk[None, :] <= chunk[:, None])
    BACKBONE.denoise(sequence, 0.0, capture, 0)
    for layer in range(2):
        k, v = cont.cache.banks[layer][0].history()
        torch.testing.assert_close(k, capture.kv[layer][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, capture.kv[layer][1], rtol=1e-5, atol=1e-5)


def test_reindex_switch():
    method = build_method({"name": "fullkv"})
    on = prefill(BACKBONE, method, torch.randn(1, 3, 24, 4, 4), None, 0)
    off = prefill(BACKBONE, method, torch.randn(1, 3, 24, 4, 4), None, 0, GenerationSettings(reindex=False))
    bank_on, bank_off = on.cache.banks[0][0], off.cache.banks[0][0]
    frames = bank_on.field("frame")
    assert torch.equal(bank_on.field("tpos"), reindex_frames(frames, 24, 8, 17.0))
    assert bank_on.field("tpos")[0].item() == 24 - 17
    assert torch.equal(bank_off.field("tpos"), frames.double())
    assert on.cache.reindexed == (24, 8, 17.0) and off.cache.reindexed is None
    custom = prefill(BACKBONE, method, torch.randn(1, 3, 24, 4, 4), None, 0,
                     GenerationSettings(reindex_recent=4, reindex_virtual_length=10.0))
    assert custom.cache.banks[0][0].field("tpos")[0].item() == 24 - 10


def test_seeds_reproduce_and_differ():
    method = build_method({"name": "random", "gamma": 3.0})  # context scores here are 1.3-5.4: some pruned
    runs = [continue_task(BACKBONE, prefill(BACKBONE, method, CONTEXT, None, s), None, 4, t)
            for s, t in ((0, 0), (0, 0), (1, 0), (0, 1))]
    assert torch.equal(runs[0].latents, runs[1].latents)
    kept = [r.cache.banks[0][0].field("gid").tolist() for r in runs]
    assert kept[0] == kept[1] != kept[2]  # the run seed reaches Random's choice
    assert not torch.equal(runs[0].latents, runs[3].latents)


def test_ledger_timings_bytes_and_attention():
    method = build_method({"name": "fullkv"})
    pre = prefill(BACKBONE, method, CONTEXT, None, 0)
    cont = continue_task(BACKBONE, pre, None, 4, 0, record_attention_at=(1,))
    assert pre.seconds > 0 and cont.seconds > 0
    per_token = 2 * 2 * 2 * 12 * 4  # K and V, 2 layers, 2 heads, head_dim 12, float32
    assert cont.ledger.peak_stored_bytes == (8 + 4) * 4 * per_token
    assert [e.full for e in cont.ledger.entries] == [32, 40]
    mass = cont.attention[1].mass
    assert sorted(mass) == [0, 1] and mass[0].shape == (2, 12)
    torch.testing.assert_close(mass[0].sum(-1), torch.ones(2))
    summary = cont.summary(method)
    assert summary["pruning_ratio"] == 0.0 and summary["latent_frames"] == 4 and "quota_pr" not in summary


def test_bad_input_is_a_config_error():
    method = build_method({"name": "fullkv"})
    with pytest.raises(ConfigError, match="not a multiple of the chunk size"):
        prefill(BACKBONE, method, torch.randn(1, 3, 5, 4, 4), None, 0)
    with pytest.raises(ConfigError, match=r"must be \[B, 3, F, 4, 4\]"):
        prefill(BACKBONE, method, torch.randn(1, 4, 4, 4, 4), None, 0)
    pre = prefill(BACKBONE, method, CONTEXT, None, 0)
    with pytest.raises(ConfigError, match="positive multiple"):
        continue_task(BACKBONE, pre, None, 3, 0)
    with pytest.raises(ConfigError, match="does not match the prefill"):
        continue_task(BACKBONE, pre, None, 2, 0, method=build_method({"name": "streaming"}))


def test_no_context_generation():
    method = build_method({"name": "decoprune"})
    pre = prefill(BACKBONE, method, torch.zeros(1, 3, 0, 4, 4), None, 0)
    cont = continue_task(BACKBONE, pre, None, 6, 0)
    assert cont.latents.shape == (1, 3, 6, 4, 4)
    assert [e.full for e in cont.ledger.entries] == [0, 8, 16]
