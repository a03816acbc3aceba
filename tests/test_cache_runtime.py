"""Runtime paths made fast for the speed targets (docs/speed.md): complex-product RoPE, one-shot fork allocation,
suffix compaction."""

import pytest
import torch

from cmbench.cache import HeadGroup, KVCache
from cmbench.cache.bank import Bank
from cmbench.cache.rope import apply_rotary
from cmbench.generation import continue_task, prefill
from cmbench.methods.fullkv import FullKV
from cmbench.methods.streaming import Streaming
from fakes import AttentionBackbone, fake_geometry


G = fake_geometry(num_layers=2, num_heads=4, head_dim=12)
L = G.tokens_per_chunk  # 8


def pairwise_rotary(x, cos, sin):
    """The textbook interleaved-pair rotation, element by element."""
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    c, s = cos[None, :, None, :].float(), sin[None, :, None, :].float()
    out = torch.empty(x.shape, dtype=torch.float32)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.to(x.dtype)


def angles(n, pairs, seed=0):
    a = torch.rand(n, pairs, generator=torch.Generator().manual_seed(seed)) * 20 - 10
    return a.cos(), a.sin()


def test_rotary_matches_the_pairwise_formula_and_its_gradient():
    x = torch.randn(2, 7, 3, 10, generator=torch.Generator().manual_seed(1), requires_grad=True)
    cos, sin = angles(7, 5)
    out = apply_rotary(x, cos, sin)
    torch.testing.assert_close(out, pairwise_rotary(x, cos, sin), rtol=1e-6, atol=1e-6)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (grad,) = torch.autograd.grad((out * w).sum(), x)
    (expect,) = torch.autograd.grad((pairwise_rotary(x, cos, sin) * w).sum(), x)
    torch.testing.assert_close(grad, expect, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("view", ["last_dim_slice", "odd_offset", "contiguous_odd_offset", "transposed", "bfloat16"])
def test_rotary_accepts_strided_and_low_precision_inputs(view):
    base = torch.randn(1, 6, 4, 13, generator=torch.Generator().manual_seed(3))
    x = {
        "last_dim_slice": base[..., :4],  # the temporal pairs of cached keys (shift_positions)
        "odd_offset": base[..., 1:5],
        "contiguous_odd_offset": torch.randn(97, generator=torch.Generator().manual_seed(9))[1:].view(1, 6, 4, 4),
        "transposed": torch.randn(1, 4, 6, 12, generator=torch.Generator().manual_seed(8)).transpose(1, 2),
        "bfloat16": base[..., :12].to(torch.bfloat16),
    }[view]
    cos, sin = angles(6, x.shape[-1] // 2, seed=4)
    out = apply_rotary(x, cos, sin)
    assert out.dtype == x.dtype and out.shape == x.shape
    tol = 1e-2 if x.dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(out, pairwise_rotary(x, cos, sin), rtol=tol, atol=tol)


def bank_with(n: int, seed: int = 0) -> Bank:
    bank = Bank(0, HeadGroup((0, 1, 2)))
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(1, n, 3, 4, generator=g), torch.randn(1, n, 3, 4, generator=g)
    bank.write_slot(k, v)
    ids = torch.arange(n)
    bank.commit(ids // 4, 0, ids % 4, ids)
    bank.priority[:n] = torch.randn(n, generator=g)
    return bank


@pytest.mark.parametrize("pattern", ["random", "keep_all", "drop_all", "drop_first", "drop_last", "drop_middle"])
def test_compaction_keeps_exactly_the_masked_rows_in_order(pattern):
    n = 300
    bank = bank_with(n)
    before_k, before_v = (t.clone() for t in bank.history())
    before = {name: bank.field(name).clone() for name in Bank.PROVENANCE}
    keep = {
        "random": torch.rand(n, generator=torch.Generator().manual_seed(5)) < 0.3,
        "keep_all": torch.ones(n, dtype=torch.bool),
        "drop_all": torch.zeros(n, dtype=torch.bool),
        "drop_first": torch.arange(n) > 0,
        "drop_last": torch.arange(n) < n - 1,
        "drop_middle": (torch.arange(n) < 100) | (torch.arange(n) >= 200),
    }[pattern]
    bank.keep_only(keep)
    assert bank.n == int(keep.sum())
    k, v = bank.history()
    assert torch.equal(k, before_k[:, keep]) and torch.equal(v, before_v[:, keep])
    for name in Bank.PROVENANCE:
        assert torch.equal(bank.field(name), before[name][keep]), name


def test_fork_allocates_the_whole_continuation_once():
    backbone = AttentionBackbone(G, seed=0)
    ctx = torch.randn(1, G.latent_channels, 3 * G.chunk_frames, G.latent_height, G.latent_width,
                      generator=torch.Generator().manual_seed(6))
    pre = prefill(backbone, FullKV(), ctx, None, seed=0)
    frames = 4 * G.chunk_frames
    fork = pre.cache.fork(headroom=frames * G.tokens_per_frame)
    for bank in fork.all_banks():
        assert bank.capacity == 3 * L + 4 * L
    cont = continue_task(backbone, pre, None, frames, seed=1)
    for bank in cont.cache.all_banks():  # filled to the brim, never regrown
        assert bank.n == bank.capacity == 7 * L


def test_fork_headroom_respects_bank_sizes_and_capacity_limits():
    sized = KVCache.from_geometry(G, [[HeadGroup((0, 1, 2, 3), max_tokens=2 * L)]] * 2)
    limited = KVCache.from_geometry(G, capacity_limit=2 * L)
    for cache in (sized, limited):
        for c in range(2):
            cache.begin_chunk(c, c * G.chunk_frames, G.chunk_frames)
            for layer in range(2):
                q = torch.randn(1, L, 4, 12)
                cache.attend(layer, q, q, q)
            cache.commit_chunk()
    assert all(b.capacity == 3 * L for b in sized.fork(headroom=100 * L).all_banks())
    assert all(b.capacity == 2 * L for b in limited.fork(headroom=100 * L).all_banks())
    assert all(b.capacity == 3 * L for b in sized.fork().all_banks())  # default: one chunk of room


def test_streaming_continuation_stays_within_its_window_allocation():
    backbone = AttentionBackbone(G, seed=0)
    ctx = torch.randn(1, G.latent_channels, 4 * G.chunk_frames, G.latent_height, G.latent_width,
                      generator=torch.Generator().manual_seed(7))
    method = Streaming()
    pre = prefill(backbone, method, ctx, None, seed=0)
    cont = continue_task(backbone, pre, None, 8 * G.chunk_frames, seed=1)
    window = method.window_size(G)
    assert all(b.capacity == window + L for b in cont.cache.all_banks())
