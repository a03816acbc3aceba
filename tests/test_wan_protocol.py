"""The real backbones' protocol readings, each pinned to what the authors' runtime does (docs/protocol.md):
LingBot's fresh-noise sampler, float32 residual stream and head, continuation decoded after the context
(64 frames for 16 latents), continue_prompt over the prefill, LingBot's example intrinsics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from cmbench.backbones.base import decode_continuation
from cmbench.backbones.dit import BlockCausalAttention, DiTConfig, grid_positions
from cmbench.backbones.wan.backbone import WanBackbone
from cmbench.backbones.wan.camera import LINGBOT_INTRINSICS_832X480, default_intrinsics
from cmbench.backbones.wan.components import build_dit
from cmbench.backbones.wan.synthetic import TINY_VAE, build_tokenizer, random_dit_state, tiny_umt5_config
from cmbench.backbones.wan.text import TextEncoder
from cmbench.backbones.wan.vae import WanVAE
from cmbench.config_paths import CONFIG_DIR
from cmbench.errors import ConfigError
from cmbench.generation.sampler import FlowMatchSampler
from cmbench.spec import generation_settings

LINGBOT_TINY = DiTConfig(in_channels=36, out_channels=16, dim=24, ffn_dim=32, num_heads=2, num_layers=2,
                         text_dim=16, camera_dim=384)
LINGBOT_CONFIGS = ("lingbot_world_v2_14b", "lingbot_world_v2_1_3b")


def resolved(backbone: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=[f"backbone={backbone}"])


@pytest.fixture(scope="module")
def vae():
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return WanVAE(AutoencoderKLWan(**TINY_VAE))


@pytest.fixture(scope="module")
def text():
    from transformers import UMT5EncoderModel

    torch.manual_seed(0)
    return TextEncoder(UMT5EncoderModel(tiny_umt5_config(16)), build_tokenizer(), text_len=16)


def lingbot(vae, text, height=32, width=32, **kwargs) -> WanBackbone:
    dit = build_dit(LINGBOT_TINY.to_dict(), random_dit_state(LINGBOT_TINY, seed=1), "tiny", "float32", "cpu")
    return WanBackbone(dit, vae, text, height, width, chunk_frames=2, name="tiny_lingbot", **kwargs)


# ----------------------------------------------------------------------------- sampler
@pytest.mark.parametrize("name", LINGBOT_CONFIGS)
def test_lingbot_configs_run_the_fresh_noise_sampler(name):
    sampler = generation_settings(resolved(name).generation).sampler
    assert sampler == FlowMatchSampler((999.0, 957.0, 899.0, 702.0), stochastic=True)


def test_fresh_noise_sampler_renoises_each_step_with_new_noise():
    """LingBot's runtime: x_next = add_noise(x0, randn, t_next), a new draw at every step."""
    x0 = torch.full((1, 4, 2, 3, 3), 0.5)
    noise = torch.randn(1, 4, 2, 3, 3, generator=torch.Generator().manual_seed(0))

    def implied_noise(stochastic: bool) -> list[torch.Tensor]:
        seen = []

        def denoise(x, t, step):
            seen.append((x - (1.0 - t) * x0) / t)  # the noise x carries at level t
            return x0

        FlowMatchSampler(stochastic=stochastic).sample(denoise, noise, torch.Generator().manual_seed(1))
        return seen

    fresh = implied_noise(True)
    assert len(fresh) == 4
    for i in range(len(fresh)):
        for j in range(i):
            assert (fresh[i] - fresh[j]).abs().max() > 0.5, (i, j)
    # the deterministic step would carry the first draw all the way
    carried = implied_noise(False)
    for later in carried[1:]:
        torch.testing.assert_close(later, carried[0], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- precision
def test_bf16_with_float32_residual_stays_close_to_float32():
    """bf16 with LingBot's float32 islands (residual stream and head) within 1e-2 of float32, and closer
    than a bf16 residual stream, on a 6-layer LingBot-shaped model."""
    cfg = DiTConfig(in_channels=36, out_channels=16, dim=64, ffn_dim=128, num_heads=2, num_layers=6, text_dim=16,
                    camera_dim=384)
    state = random_dit_state(cfg, seed=3)
    models = {key: build_dit(cfg.to_dict(), state, "t", dtype, "cpu", fp32_residual=fp32)
              for key, dtype, fp32 in (("fp32", "float32", False), ("bf16", "bfloat16", False),
                                       ("islands", "bfloat16", True))}
    islands = models["islands"]
    assert islands.residual_dtype == torch.float32 and islands.head.head.weight.dtype == torch.float32
    assert islands.blocks[0].ffn[0].weight.dtype == torch.bfloat16
    assert models["bf16"].residual_dtype is None and models["bf16"].head.head.weight.dtype == torch.bfloat16
    residual_dtypes = []
    islands.blocks[3].register_forward_hook(lambda mod, args, out: residual_dtypes.append(out.dtype))

    torch.manual_seed(3)
    x, text, cam = torch.randn(1, 36, 2, 8, 8), torch.randn(1, 8, 16), torch.randn(1, 384, 2, 8, 8)
    t, pos = torch.full((1, 2), 0.9), grid_positions(0, 2, 4, 4)
    outs = {}
    for key, model in models.items():
        dt = model.patch_embedding.weight.dtype
        with torch.no_grad():
            outs[key] = model(x.to(dt), t, pos, BlockCausalAttention([(0, True)], 32), text=text.to(dt),
                              camera=cam.to(dt)).float()
    assert residual_dtypes == [torch.float32]
    err = {k: float((outs[k] - outs["fp32"]).norm() / outs["fp32"].norm()) for k in ("bf16", "islands")}
    assert 0 < err["islands"] < 1e-2
    assert err["islands"] < 0.9 * err["bf16"]


# ----------------------------------------------------------------------------- decoding
def test_continuation_is_decoded_after_the_context_64_frames_for_16_latents(vae, text):
    torch.manual_seed(5)
    context, cont = torch.randn(1, 16, 6, 4, 4), torch.randn(1, 16, 16, 4, 4)
    whole = vae.decode(torch.cat([context, cont], dim=2))  # the authors decode the whole timeline ...
    assert whole.shape[0] == 1 + 4 * (6 + 16 - 1)
    start = 1 + 4 * (6 - 1)  # ... and keep the continuation's frames
    model = lingbot(vae, text)
    frames = decode_continuation(model, cont, context)
    assert frames.shape == (64, 32, 32, 3)
    assert torch.equal(frames, whole[start:])
    assert torch.equal(model.decode_continuation(cont, context), frames)  # the context's decoder state is reused
    assert model.decode(cont).shape[0] == 61  # decoded alone: the first latent frame becomes one image frame
    warm = lingbot(vae, text, decode_warmup=2).decode_continuation(cont, context)  # a cheaper approximation
    assert warm.shape == (64, 32, 32, 3) and not torch.equal(warm, frames)
    with pytest.raises(ConfigError, match="decode_warmup must be at least 1"):
        lingbot(vae, text, decode_warmup=0)


def test_a_backbone_without_a_causal_vae_decodes_the_continuation_alone():
    class OneFramePerLatent:
        def decode(self, latents):
            return torch.zeros(latents.shape[2], 2, 2, 3, dtype=torch.uint8)

    assert decode_continuation(OneFramePerLatent(), torch.zeros(1, 4, 16, 1, 1), torch.zeros(1, 4, 8, 1, 1)).shape[0] == 16


# ----------------------------------------------------------------------------- prompts and camera
def test_prefill_is_conditioned_on_the_continue_prompt_unless_clips_are_asked_for(vae, text, tmp_path):
    from official_fixture import official_row, write_context_video, write_manifest

    from cmbench.data.manifest import load_manifest

    write_context_video(tmp_path / "videos" / "synthetic" / "syn_001.mp4", seed=0)
    write_manifest(tmp_path, [official_row("syn_001_reappear_01", "videos/synthetic/syn_001.mp4")])
    (task,) = load_manifest(tmp_path)
    default = lingbot(vae, text).condition(task)
    assert default.context_prompts == "continue"
    assert {default.prompt_at(f) for f in range(default.context_frames + 4)} == {task.continue_prompt}
    clips = lingbot(vae, text, context_prompts="clips").condition(task)
    assert clips.prompt_at(0) == task.context_clip_prompts[0]
    assert clips.prompt_at(clips.context_frames) == task.continue_prompt
    with pytest.raises(ConfigError, match="context_prompts must be one of"):
        lingbot(vae, text, context_prompts="per_clip")
    for name in LINGBOT_CONFIGS + ("self_forcing", "causal_forcing", "longlive"):
        assert resolved(name).backbone.context_prompts == "continue"


def test_default_static_camera_uses_lingbots_example_intrinsics(vae, text):
    assert LINGBOT_INTRINSICS_832X480 == (502.9116, 503.10812, 415.77786, 239.77779)
    assert default_intrinsics(480, 832) == LINGBOT_INTRINSICS_832X480
    np.testing.assert_allclose(default_intrinsics(32, 32), (502.9116 * 32 / 832, 503.10812 * 32 / 480,
                                                            415.77786 * 32 / 832, 239.77779 * 32 / 480), rtol=1e-12)
    model = lingbot(vae, text)
    assert model.camera_intrinsics == pytest.approx(default_intrinsics(32, 32))
    plan = model.camera_plan(type("Task", (), {"extra": {}})())
    assert plan.is_static and plan.intrinsics.tolist() == pytest.approx(list(default_intrinsics(32, 32)))
    for name in LINGBOT_CONFIGS:
        assert resolved(name).backbone.camera_intrinsics is None  # the loader's default: the values above
    assert lingbot(vae, text, camera_intrinsics=(16.0, 16.0, 16.0, 16.0)).camera_intrinsics == (16.0,) * 4
