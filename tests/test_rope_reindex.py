"""RoPE: the axes' frequencies, angles and rotation by hand, and re-indexing (the mapping's values and the
phase correction of cached keys)."""

import math

import pytest
import torch

from cmbench.cache import KVCache
from cmbench.cache.rope import RopeAxis, RopeSpec, apply_rotary, reindex_frames, shift_positions
from fakes import fake_geometry, token_positions


G = fake_geometry(num_layers=1, num_heads=2, head_dim=12, chunk_frames=4)


def test_mapping_values():
    q0 = 48
    t = torch.arange(q0)
    new = reindex_frames(t, q0, n_recent=8, l_virt=17)
    assert torch.equal(new[q0 - 8 :], t[q0 - 8 :].double())  # recent frames keep true positions
    assert new[0].item() == q0 - 17  # the oldest frame lands at q0 - L_virt
    # hand value: t = 20, delta = 28 -> 48 - (8 + 20 * 9 / 40) = 35.5
    assert new[20].item() == 35.5
    assert torch.all(new[1:] > new[:-1])  # order is kept
    assert torch.equal(reindex_frames(t[:6], 6), t[:6].double())  # identity when q0 <= N_r
    assert torch.equal(reindex_frames(t, q0), new)  # the defaults are the paper's N_r = 8, L_virt = 17


def test_reindex_equals_rotating_unrotated_keys_at_new_positions():
    frames, q0 = 12, 12
    cache = KVCache.from_geometry(G)
    g = torch.Generator().manual_seed(0)
    raw = []
    for c in range(frames // 4):
        cache.begin_chunk(c, 4 * c, 4)
        pos = token_positions(G, 4 * c, 4)
        k0 = torch.randn(1, len(pos), 2, 12, generator=g)
        raw.append((k0, pos))
        cos, sin = G.rope.cos_sin(pos)
        k = apply_rotary(k0, cos, sin)
        cache.attend(0, k, k, torch.randn_like(k))
        cache.commit_chunk()
    cache.compact(lambda b: b.field("pos") != 2)  # re-indexing follows the source frame, not the rank
    cache.reindex(q0, n_recent=3, l_virt=5.0)
    bank = cache.banks[0][0]
    k0 = torch.cat([r[0] for r in raw], 1)
    pos = torch.cat([r[1] for r in raw], 0).double()
    pos[:, 0] = reindex_frames(pos[:, 0], q0, 3, 5.0)
    keep = (torch.arange(len(pos)) % G.tokens_per_frame) != 2
    cos, sin = G.rope.cos_sin(pos[keep])
    expect = apply_rotary(k0[:, keep], cos, sin)
    torch.testing.assert_close(bank.history()[0], expect, rtol=1e-5, atol=1e-5)
    assert torch.equal(bank.field("tpos"), pos[keep, 0])
    # spatial pairs untouched; applying it again is a no-op
    before = bank.history()[0].clone()
    cache.reindex(q0, n_recent=3, l_virt=5.0)
    assert torch.equal(bank.history()[0], before)
    nt = G.rope.t.dim
    cos0, sin0 = G.rope.cos_sin(torch.cat([r[1] for r in raw], 0)[keep])
    torch.testing.assert_close(before[..., nt:], apply_rotary(k0[:, keep], cos0, sin0)[..., nt:])


@pytest.mark.parametrize(
    "args, message",
    [
        ((3,), "rope axis dim must be even and >= 0, got 3"),
        ((-2,), "rope axis dim must be even and >= 0, got -2"),
        ((4, "linear"), "rope axis kind must be 'log' or 'periodic', got 'linear'"),
        ((4, "periodic"), "a periodic rope axis needs a positive period"),
        ((4, "periodic", 10000.0, 0.0), "a periodic rope axis needs a positive period"),
        ((4, "periodic", 10000.0, -8.0), "a periodic rope axis needs a positive period"),
    ],
)
def test_impossible_rope_axes_are_refused(args, message):
    with pytest.raises(ValueError) as err:
        RopeAxis(*args)
    assert str(err.value) == message


def test_frequencies_by_hand():
    assert RopeAxis(0).frequencies().shape == (0,)
    torch.testing.assert_close(RopeAxis(4, "log", 100.0).frequencies(), torch.tensor([1.0, 0.1], dtype=torch.float64))
    torch.testing.assert_close(RopeAxis(6).frequencies(), torch.tensor([1.0, 10000 ** (-1 / 3), 10000 ** (-2 / 3)],
                                                                          dtype=torch.float64))
    # integer harmonics of one period: a position and the same position plus the period rotate alike
    period = RopeAxis(4, "periodic", period=8.0).frequencies()
    torch.testing.assert_close(period, torch.tensor([math.pi / 4, math.pi / 2], dtype=torch.float64))
    assert RopeAxis(2, "periodic", period=0.5).frequencies().item() == pytest.approx(4 * math.pi)


def test_wan_split_and_the_axes_of_each_pair():
    spec = RopeSpec.wan(16, theta=100.0)
    assert (spec.t.dim, spec.h.dim, spec.w.dim, spec.head_dim) == (8, 4, 4, 16)
    wan14b = RopeSpec.wan(128)  # Wan 2.1's 128-channel heads: 44 temporal, 42 + 42 spatial channels
    assert (wan14b.t.dim, wan14b.h.dim, wan14b.w.dim) == (44, 42, 42)
    assert {axis.theta for axis in (spec.t, spec.h, spec.w)} == {100.0} and spec.t.kind == "log"
    assert RopeSpec.wan(12).t.theta == 10000.0 and spec.temporal_pairs == slice(0, 4)
    # one frequency per axis (dim 2, freq 1 each) then the t axis with two: angles are position * freq, per axis
    hand = RopeSpec(RopeAxis(4, "log", 100.0), RopeAxis(2, "periodic", period=2 * math.pi), RopeAxis(2))
    angles = hand.angles(torch.tensor([[3, 5, 7], [1, 0, 2]]))
    torch.testing.assert_close(angles, torch.tensor([[3.0, 0.3, 5.0, 7.0], [1.0, 0.1, 0.0, 2.0]], dtype=torch.float64))
    cos, sin = hand.cos_sin(torch.tensor([[3, 5, 7]]), dtype=torch.float64)
    assert cos.dtype == sin.dtype == torch.float64
    assert [part.dtype for part in hand.cos_sin(torch.tensor([[3, 5, 7]]))] == [torch.float32, torch.float32]
    torch.testing.assert_close(sin, angles[:1].sin())


def test_apply_rotary_turns_each_pair_by_its_angle():
    x = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64).reshape(1, 1, 1, 4)
    quarter = torch.tensor([[math.pi / 2, math.pi / 2]])
    out = apply_rotary(x, quarter.cos(), quarter.sin())
    torch.testing.assert_close(out, torch.tensor([0.0, 1.0, -1.0, 0.0], dtype=torch.float64).reshape(1, 1, 1, 4))
    assert out.dtype == torch.float64
    assert apply_rotary(x.to(torch.bfloat16), quarter.cos(), quarter.sin()).dtype == torch.bfloat16
    # views a complex view cannot take rotate as their contiguous copies: odd strides (135, 45, 9), an odd
    # offset (3), only the head stride odd (420, 70, 7), a last-channel stride of 2, channels last in memory
    # (stride 5: a copy that preserves the layout keeps it)
    g = torch.Generator().manual_seed(0)
    angle = torch.randn(3, 3, generator=g)
    for view in (torch.randn(2, 3, 5, 9, generator=g)[..., :6], torch.randn(2, 3, 5, 10, generator=g)[..., 3:9],
                 torch.randn(2, 5, 3, 6, generator=g).transpose(1, 2),
                 torch.randn(4, 6, 5, 7, generator=g)[::2, ::2][..., :6],
                 torch.randn(2, 3, 5, 12, generator=g)[..., ::2],
                 torch.randn(2, 3, 6, 5, generator=g).transpose(-1, -2)):
        torch.testing.assert_close(apply_rotary(view, angle.cos(), angle.sin()),
                                   apply_rotary(view.contiguous(), angle.cos(), angle.sin()))


def test_shift_positions_turns_only_the_temporal_pairs():
    spec = RopeSpec(RopeAxis(2, "log"), RopeAxis(2), RopeAxis(2))
    keys = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]).reshape(1, 1, 1, 6)
    moved = shift_positions(keys, spec, torch.tensor([math.pi]))  # t freq 1: half a turn
    torch.testing.assert_close(moved, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 1.0]).reshape(1, 1, 1, 6))
    no_time = RopeSpec(RopeAxis(0), RopeAxis(2), RopeAxis(2))
    assert torch.equal(shift_positions(keys[..., :4], no_time, torch.tensor([1.0])), keys[..., :4])
