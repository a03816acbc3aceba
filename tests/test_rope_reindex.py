"""RoPE re-indexing: the mapping's values and the phase correction of cached keys."""

import torch

from cmbench.cache import KVCache
from cmbench.cache.rope import apply_rotary, reindex_frames
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
