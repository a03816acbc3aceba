"""LingBot / Wan conditioning: Plucker camera maps, I2V channels, umt5 prompts, the context timeline,
bf16 inference and host-memory KV offload, with small models on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cmbench.backbones.dit import DiTConfig
from cmbench.backbones.wan.backbone import WanBackbone, WanCondition
from cmbench.backbones.wan.camera import CameraPlan, fold_to_latent, plan_from_extension, relative_framewise
from cmbench.backbones.wan.components import build_dit
from cmbench.backbones.wan.i2v import FirstFrameLatents
from cmbench.backbones.wan.offload import HostOffloadAttention
from cmbench.backbones.wan.synthetic import TINY_VAE, build_tokenizer, random_dit_state, tiny_umt5_config
from cmbench.backbones.wan.text import TextEncoder, clean_prompt
from cmbench.backbones.wan.timeline import read_timeline
from cmbench.backbones.wan.vae import WanVAE
from cmbench.cache.kv_cache import KVCache
from cmbench.data import prepare_context
from cmbench.data.video import latent_frame_count, write_video
from cmbench.errors import ConfigError
from cmbench.generation import continue_task, prefill
from cmbench.methods.registry import build_method

LINGBOT_TINY = DiTConfig(in_channels=36, out_channels=16, dim=24, ffn_dim=32, num_heads=2, num_layers=2,
                         text_dim=16, camera_dim=384)


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


def lingbot(vae, text, dtype="float32", offload=False) -> WanBackbone:
    dit = build_dit(LINGBOT_TINY.to_dict(), random_dit_state(LINGBOT_TINY, seed=1), "tiny", dtype, "cpu")
    return WanBackbone(dit, vae, text, 32, 32, chunk_frames=2, camera_intrinsics=(16.0, 16.0, 16.0, 16.0),
                       offload_kv=offload, name="tiny_lingbot")


# ----------------------------------------------------------------------------- camera
def test_fold_puts_channel_then_row_then_column_of_each_8x8_patch():
    rays = torch.randn(2, 16, 24, 6)
    folded = fold_to_latent(rays)
    assert folded.shape == (1, 384, 2, 2, 3)
    f, i, j, c, dy, dx = 1, 1, 2, 4, 3, 5
    assert folded[0, c * 64 + dy * 8 + dx, f, i, j] == rays[f, 8 * i + dy, 8 * j + dx, c]


def test_static_identity_camera_rays_are_pinhole_directions():
    plan = CameraPlan.static((16.0, 8.0, 16.0, 16.0))
    cam = plan.latent_map(5, 3, 32, 32)
    assert cam.shape == (1, 384, 3, 4, 4)
    assert plan.latent_map(9, 3, 32, 32) is cam  # static: one map for every chunk, computed once
    torch.testing.assert_close(cam[:, :, 0], cam[:, :, 2])  # static: every frame alike
    assert cam[0, : 3 * 64].abs().max() == 0  # origins at the identity camera's centre
    d = torch.tensor([(0.5 - 16) / 16, (0.5 - 16) / 8, 1.0])
    d = d / d.norm()
    got = torch.stack([cam[0, (3 + a) * 64, 0, 0, 0] for a in range(3)])  # pixel (0, 0): latent (0, 0), dy=dx=0
    torch.testing.assert_close(got, d)
    norms = cam[0, 3 * 64 :].reshape(3, 64, 3, 4, 4).norm(dim=0)
    torch.testing.assert_close(norms, torch.ones_like(norms))


def test_camera_extension_gives_framewise_motion_with_normalised_translation():
    # 9 pixel frames: the camera moves +0.5 along x per frame and turns 90 degrees at pixel frame 8
    c2w = np.tile(np.eye(4), (9, 1, 1))
    c2w[:, 0, 3] = 0.5 * np.arange(9)
    c2w[8, :3, :3] = [[0, 0, 1], [0, 1, 0], [-1, 0, 0]]
    plan = plan_from_extension({"c2w": c2w.tolist(), "intrinsics": [8.0, 8.0, 8.0, 8.0], "image_size": [16, 16]},
                               32, 32)
    assert plan.num_frames == 3  # latent frames take pixel frames 0, 4, 8
    torch.testing.assert_close(plan.intrinsics, torch.tensor([16.0, 16.0, 16.0, 16.0], dtype=torch.float64))
    rel = plan.relative
    torch.testing.assert_close(rel[0], torch.eye(4, dtype=torch.float64))
    torch.testing.assert_close(rel[1][:3, 3], torch.tensor([1.0, 0, 0], dtype=torch.float64))  # 2 / max norm 2
    cam = plan.latent_map(0, 3, 32, 32)
    assert cam[0, 0, 0].abs().max() == 0 and torch.allclose(cam[0, 0, 1], torch.ones(4, 4))  # origin x
    # frame 2's rotation maps the optical axis (0, 0, 1) to world +x
    d = torch.stack([cam[0, (3 + a) * 64, 2, 2, 2] for a in range(3)])  # pixel (16, 16): latent (2, 2), offset 0
    assert d[0] > 0.99 and abs(d[2]) < 0.1
    with pytest.raises(ConfigError, match=r"covers latent frames 0..2, but frames 2..3 were asked for"):
        plan.latent_map(2, 2, 32, 32)
    with pytest.raises(ConfigError, match="needs 'c2w'"):
        plan_from_extension({"intrinsics": [1, 1, 1, 1]}, 32, 32)


def test_relative_poses_of_a_static_camera_stay_identity():
    rel = relative_framewise(torch.eye(4).repeat(5, 1, 1))
    torch.testing.assert_close(rel, torch.eye(4, dtype=torch.float64).repeat(5, 1, 1))


# ----------------------------------------------------------------------------- I2V
def test_first_frame_channels_mask_frame_zero_and_extend_exactly(vae):
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    lazy = FirstFrameLatents(vae, frame, expected_frames=8)
    head = lazy.channels(0, 4)
    assert head.shape == (1, 20, 4, 4, 4)
    assert (head[:, :4, 0] == 1).all() and (head[:, :4, 1:] == 0).all()
    torch.testing.assert_close(head[:, 4:, :1], vae.encode(torch.from_numpy(frame[None])))  # frame 0 alone
    tail = lazy.channels(12, 4)  # beyond the 8 frames encoded first: the encoding doubles to 16
    assert (tail[:, :4] == 0).all() and lazy.encodes == 2 and lazy.latents.shape[2] == 16
    once = FirstFrameLatents(vae, frame, expected_frames=16).channels(0, 16)
    torch.testing.assert_close(tail, once[:, :, 12:16], atol=1e-6, rtol=1e-6)
    assert (tail[:, 4:, 0] - head[:, 4:, 0]).abs().max() > 1e-3  # later frames encode the zero frames


# ----------------------------------------------------------------------------- text
def test_prompts_are_cleaned_padded_with_zeros_and_cached(text):
    assert clean_prompt("  a &amp;amp;  red\n vase ") == "a & red vase"
    a = text.encode("a vase")
    assert a.shape == (1, 16, 16)
    n = int(text.tokenizer("a vase")["attention_mask"].__len__())
    assert (a[0, n:] == 0).all() and (a[0, :n].abs().sum(-1) > 0).all()
    assert text.encode("a vase") is a
    assert not torch.equal(text.encode("a cup"), a)


def test_prompt_of_each_frame_is_the_continue_prompt_by_default():
    """The authors' harness conditions the whole prefill on the task's continue_prompt."""
    cond = WanCondition("t", tuple(f"clip {i}" for i in range(6)), "go back", context_frames=12)
    assert {cond.prompt_at(f) for f in range(0, 41)} == {"go back"}
    with pytest.raises(ConfigError, match="context_prompts must be one of"):
        WanCondition("t", ("a",) * 6, "go back", context_frames=12, context_prompts="schedule")


def test_prompt_of_each_frame_spreads_clips_over_the_context():
    cond = WanCondition("t", tuple(f"clip {i}" for i in range(6)), "go back", context_frames=12,
                        context_prompts="clips")
    assert [cond.prompt_at(f) for f in (0, 1, 2, 11, 12, 40)] == ["clip 0", "clip 0", "clip 1", "clip 5", "go back",
                                                                   "go back"]


# ----------------------------------------------------------------------------- timeline
def test_timeline_matches_the_evaluators_context_preparation(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "v.mp4"
    write_video(path, rng.integers(0, 255, (37, 16, 24, 3), dtype=np.uint8), 24.0)
    tl = read_timeline(path, 16.0, 32, 32, 4, 4)
    ctx = prepare_context(path, 16.0, 32, 32, 4, 4)
    # 37 frames at 24 fps -> 25 at 16 fps (7 latent frames) -> padded to 26 frames, 8 latent frames
    assert tl.pixel_frames == len(ctx) == 26 and tl.latent_frames == latent_frame_count(len(ctx)) == 8
    np.testing.assert_array_equal(tl.first_frame, ctx[0])


# ----------------------------------------------------------------------------- precision and offload
def test_bf16_keeps_wans_float32_islands_and_stays_close(vae, text):
    full, half = lingbot(vae, text), lingbot(vae, text, "bfloat16")
    assert half.dit.blocks[0].self_attn.q.weight.dtype == torch.bfloat16
    assert half.dit.time_embedding[0].weight.dtype == torch.float32
    assert half.dit.blocks[0].norm3.weight.dtype == torch.float32
    assert half.dit.blocks[0].modulation.dtype == torch.float32 and half.dit.head.modulation.dtype == torch.float32
    cond = WanCondition("t", ("a vase",) * 6, "go back", 4, CameraPlan.static((16.0, 16.0, 16.0, 16.0)),
                        FirstFrameLatents(vae, np.full((32, 32, 3), 90, np.uint8)))
    x = torch.randn(1, 16, 2, 4, 4)
    outs, caches = [], []
    for model in (full, half):
        cache = KVCache.from_geometry(model.geometry)
        cache.begin_chunk(0, 0, 2)
        outs.append(model.denoise(x, 0.9, cache, 0, cond))
        cache.commit_chunk()
        caches.append(cache)
    assert outs[1].dtype == torch.float32
    rel = (outs[1] - outs[0]).norm() / outs[0].norm()
    assert 0 < rel < 3e-2
    assert caches[1].stored_bytes() * 2 == caches[0].stored_bytes() == 2 * 2 * 8 * 24 * 4  # layers, K+V, tokens, dim


def test_host_offload_gives_the_same_continuation_and_stages_each_layer(vae, text):
    cond = WanCondition("t", ("a vase",) * 6, "go back", 4, CameraPlan.static((16.0, 16.0, 16.0, 16.0)),
                        FirstFrameLatents(vae, np.full((32, 32, 3), 90, np.uint8)))
    context = torch.randn(1, 16, 4, 4, 4)
    results = []
    for offload in (False, True):
        model = lingbot(vae, text, offload=offload)
        method = build_method({"name": "decoprune", "gamma": 0.5, "probe_step": 2})
        pre = prefill(model, method, context, cond, seed=3)
        results.append(continue_task(model, pre, cond, 4, seed=3))
    torch.testing.assert_close(results[1].latents, results[0].latents, atol=0, rtol=0)
    assert results[1].ledger.pruning_ratio() == results[0].ledger.pruning_ratio()

    model = lingbot(vae, text)
    cache = KVCache.from_geometry(model.geometry)
    attention = HostOffloadAttention(cache)
    for chunk in range(2):
        cache.begin_chunk(chunk, 2 * chunk, 2)
        with torch.no_grad():
            model.velocity(context[:, :, 2 * chunk : 2 * chunk + 2], 0.0, attention, 2 * chunk, cond)
        cache.commit_chunk()
    # chunk 1 staged 8 history + 8 slot rows of K and V, per layer, 24 float32 channels each
    assert attention.staged_bytes == 2 * (2 * 16 * 24 * 4)
    assert all(b.k.device.type == "cpu" and b.n == 16 for b in cache.all_banks())


def test_condition_reads_the_context_and_the_tasks_camera_plan(vae, text, tmp_path):
    from cmbench.data.manifest import load_manifest
    from official_fixture import official_row, write_context_video, write_manifest

    write_context_video(tmp_path / "videos" / "synthetic" / "syn_001.mp4", seed=0)
    poses = np.tile(np.eye(4), (61, 1, 1))
    poses[:, 2, 3] = np.arange(61) / 60.0  # dolly forward
    write_manifest(tmp_path, [
        official_row("syn_001_reappear_01", "videos/synthetic/syn_001.mp4"),
        official_row("syn_001_revisit_01", "videos/synthetic/syn_001.mp4", task_type="revisit",
                     camera={"c2w": poses.tolist(), "intrinsics": [16.0, 16.0, 16.0, 16.0]}),
    ])
    static_task, moving_task = load_manifest(tmp_path)
    model = lingbot(vae, text)
    still, moving = model.condition(static_task), model.condition(moving_task)
    assert still.context_frames == moving.context_frames == 10  # 32 frames padded to 38: 10 latent (chunk 2)
    assert still.camera.is_static and moving.camera.num_frames == 16  # 61 pixel frames: 16 latent frames
    assert still.first_frame is moving.first_frame  # one I2V encoding per context video
    ctx = prepare_context(static_task.video_path, 16.0, 32, 32, 2, 4)
    np.testing.assert_array_equal(model.timeline(static_task).first_frame, ctx[0])
    cam = moving.camera.latent_map(12, 2, 32, 32)
    assert torch.allclose(cam[0, 2 * 64], torch.ones(4, 4))  # origin z of a forward step, normalised to 1
    with pytest.raises(ConfigError, match="frames 16..17 were asked for"):
        moving.camera.latent_map(16, 2, 32, 32)


def test_four_step_schedules_follow_from_shift_5():
    from cmbench.backbones.wan.schedule import lingbot_schedule, self_forcing_schedule
    from cmbench.generation.sampler import DEFAULT_TIMESTEPS

    timesteps, sigmas = lingbot_schedule()
    assert timesteps == (999, 957, 899, 702) == tuple(int(t) for t in DEFAULT_TIMESTEPS)
    assert max(abs(s - t / 1000) for s, t in zip(sigmas, timesteps)) < 1e-3  # the sampler's t = timestep / 1000
    np.testing.assert_allclose(self_forcing_schedule(), (1000.0, 937.5, 2500 / 3, 625.0))
