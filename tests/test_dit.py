"""The causal Wan-family DiT: Wan parity, the block-causal training attention, causality."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cmbench.backbones.dit import BlockCausalAttention, CausalWanDiT, DiTConfig, grid_positions
from cmbench.backbones.wan.checkpoint import diffusers_to_wan
from cmbench.cache.rope import RopeAxis, RopeSpec


def _tiny_dit(camera: bool = True, seed: int = 0) -> CausalWanDiT:
    torch.manual_seed(seed)
    cfg = DiTConfig(
        in_channels=12, out_channels=12, dim=32, ffn_dim=64, num_heads=2, num_layers=2, camera_dim=3 if camera else None
    )
    rope = RopeSpec(RopeAxis(4, "log"), RopeAxis(4, "periodic", period=16), RopeAxis(8, "periodic", period=16))
    model = CausalWanDiT(cfg, rope).eval()
    with torch.no_grad():  # a trained-looking model: no zero-initialised paths
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _dense_reference(segments: list[tuple[int, bool]], n: int) -> torch.Tensor:
    """The diffusion-forcing mask written out token by token (independent of the implementation)."""
    owner = [s for s in range(len(segments)) for _ in range(n)]
    size = len(owner)
    mask = torch.zeros(size, size, dtype=torch.bool)
    for i in range(size):
        ci, ni = segments[owner[i]]
        for j in range(size):
            cj, nj = segments[owner[j]]
            if owner[i] == owner[j]:
                mask[i, j] = True
            elif not nj:
                mask[i, j] = cj < ci or (cj == ci and not ni)
    return mask


def test_block_causal_attention_equals_dense_masked_softmax():
    segments = [(0, False), (1, False), (2, False), (2, True), (0, True), (1, True)]
    n = 3
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, len(segments) * n, 2, 8) for _ in range(3))
    out = BlockCausalAttention(segments, n).attend(0, q, k, v)
    mask = _dense_reference(segments, n)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-6, rtol=1e-5)
    # a noisy copy of chunk 2 reads clean 0 and 1 and itself, not clean 2
    assert mask[3 * n, 2 * n - 1] and not mask[3 * n, 2 * n] and mask[3 * n, 3 * n + 2]
    # a noisy copy never reads another noisy copy
    assert not mask[4 * n, 3 * n]


def test_future_chunks_do_not_change_earlier_predictions():
    model = _tiny_dit()
    torch.manual_seed(2)
    chunk, tok = 2, 2 * 16  # 2 frames of 4x4 tokens per chunk
    clean = torch.randn(1, 12, 3 * chunk, 8, 8)
    noisy = torch.randn(1, 12, chunk, 8, 8)
    cam = torch.randn(1, 3, 4 * chunk, 8, 8)

    def run(n_clean: int) -> torch.Tensor:
        segs = [(i, False) for i in range(n_clean)] + [(1, True)]
        x = torch.cat([clean[:, :, : n_clean * chunk], noisy], dim=2)
        t = torch.cat([torch.zeros(1, n_clean * chunk), torch.full((1, chunk), 0.9)], dim=1)
        pos = torch.cat([grid_positions(0, n_clean * chunk, 4, 4), grid_positions(chunk, chunk, 4, 4)])
        c = torch.cat([cam[:, :, : n_clean * chunk], cam[:, :, 3 * chunk :]], dim=2)
        with torch.no_grad():
            return model(x, t, pos, BlockCausalAttention(segs, tok), camera=c)[:, :, -chunk:]

    short, long_ = run(1), run(3)
    torch.testing.assert_close(short, long_, atol=1e-5, rtol=1e-5)
    # and the clean history does matter: different history, different prediction
    clean.mul_(-1.0)
    assert (run(1) - short).abs().max() > 1e-3


def test_camera_map_is_folded_per_patch_like_lingbot():
    """Token (f, i, j) gets channels ordered (camera channel, patch t, patch h, patch w)."""
    model = _tiny_dit()
    cam = torch.randn(1, 3, 2, 8, 8)
    lin = model.patch_embedding_wancamctrl
    with torch.no_grad():
        lin.weight.copy_(torch.eye(32, 12))  # first 12 embedding channels copy the folded inputs
        lin.bias.zero_()
        model.c2ws_hidden_states_layer2.weight.zero_()
        model.c2ws_hidden_states_layer2.bias.zero_()
        emb = model.embed_camera(cam)
    f, i, j = 1, 2, 3
    token = f * 16 + i * 4 + j
    expected = cam[0, :, f, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].reshape(-1)  # (c, dy, dx)
    torch.testing.assert_close(emb[0, token, :12], expected)


def test_camera_injection_starts_as_identity_and_then_conditions():
    torch.manual_seed(3)
    cfg = DiTConfig(in_channels=12, out_channels=12, dim=32, ffn_dim=64, num_heads=2, num_layers=2, camera_dim=3)
    model = CausalWanDiT(cfg, RopeSpec.wan(16)).eval()
    with torch.no_grad():
        model.head.head.weight.normal_()  # a readable output; camera layers stay at their zero init
    x, pos = torch.randn(1, 12, 1, 8, 8), grid_positions(0, 1, 4, 4)
    att = BlockCausalAttention([(0, True)], 16)
    t = torch.full((1, 1), 0.5)
    with torch.no_grad():
        a = model(x, t, pos, att, camera=torch.randn(1, 3, 1, 8, 8))
        b = model(x, t, pos, att, camera=torch.randn(1, 3, 1, 8, 8))
        torch.testing.assert_close(a, b)
        model.blocks[0].cam_scale_layer.weight.normal_()
        c = model(x, t, pos, att, camera=torch.randn(1, 3, 1, 8, 8))
    assert (a - c).abs().max() > 1e-3


def test_config_round_trip_and_validation():
    cfg = DiTConfig(in_channels=36, out_channels=16, dim=64, ffn_dim=96, num_heads=4, num_layers=1, text_dim=8)
    assert DiTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown DiT config keys"):
        DiTConfig.from_dict({**cfg.to_dict(), "num_blocks": 3})
    with pytest.raises(ValueError, match="multiple of num_heads"):
        DiTConfig(in_channels=4, out_channels=4, dim=30, ffn_dim=8, num_heads=4, num_layers=1)
    with pytest.raises(ValueError, match="rope head_dim"):
        CausalWanDiT(cfg, RopeSpec.wan(8))


def test_one_chunk_matches_diffusers_wan_transformer():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(4)
    ref = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.08)
    state = diffusers_to_wan(ref.state_dict())
    cfg = DiTConfig(in_channels=4, out_channels=4, dim=24, ffn_dim=32, num_heads=2, num_layers=2, text_dim=16)
    ours = CausalWanDiT(cfg, RopeSpec.wan(12)).eval()
    ours.load_state_dict(state, strict=True)
    x, text = torch.randn(1, 4, 3, 8, 10), torch.randn(1, 5, 16)
    with torch.no_grad():
        expected = ref(x, torch.tensor([700.0]), text, return_dict=False)[0]
        got = ours(x, torch.full((1, 3), 0.7), grid_positions(0, 3, 4, 5), BlockCausalAttention([(0, True)], 60), text=text)
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_batch_rows_are_independent():
    """A batch of two predicts what each row predicts alone (per-frame time modulation and gates included)."""
    model = _tiny_dit()
    torch.manual_seed(3)
    chunk, tok = 2, 2 * 16
    x = torch.randn(2, 12, 2 * chunk, 8, 8)
    t = torch.tensor([[0.0, 0.0, 0.9, 0.9], [0.0, 0.0, 0.3, 0.3]])  # the rows' noise levels differ
    pos = grid_positions(0, 2 * chunk, 4, 4)
    cam = torch.randn(2, 3, 2 * chunk, 8, 8)
    mask = BlockCausalAttention([(0, False), (1, True)], tok)
    with torch.no_grad():
        both = model(x, t, pos, mask, camera=cam)
        alone = torch.cat([model(x[i : i + 1], t[i : i + 1], pos, mask, camera=cam[i : i + 1]) for i in range(2)])
    torch.testing.assert_close(both, alone, atol=1e-5, rtol=1e-5)
