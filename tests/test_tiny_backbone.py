"""The tiny MiniWorld world model: latents, positions, conditioning, weights, and cache equivalence."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cmbench.backbones.base import Backbone
from cmbench.backbones.dit import BlockCausalAttention, DiTConfig
from cmbench.backbones.tiny import CameraPlan, TinyConfig, TinyWorldModel, depth_to_space, space_to_depth
from cmbench.cache import KVCache
from cmbench.errors import ConfigError
from cmbench.miniworld import render_video, sample_camera_path, sample_scene

WORLD = 256


def small_config() -> TinyConfig:
    """The tiny model's layout at half the width (fast tests)."""
    dit = DiTConfig(in_channels=12, out_channels=12, dim=64, ffn_dim=128, num_heads=2, num_layers=2, camera_dim=3)
    rope = {
        "t": {"dim": 4, "kind": "log", "theta": 10000.0},
        "h": {"dim": 8, "kind": "periodic", "period": 16.0},
        "w": {"dim": 20, "kind": "periodic", "period": WORLD / 4},
    }
    return TinyConfig(dit=dit, rope=rope, world_width=WORLD)


def random_model(seed: int = 0) -> TinyWorldModel:
    torch.manual_seed(seed)
    model = TinyWorldModel(small_config())
    with torch.no_grad():  # leave no zero-initialised path (head, camera scale/shift)
        for p in model.dit.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.dit.eval()
    return model


def world_clip(seed: int, frames: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scene = sample_scene(rng, "synthetic", WORLD)
    cams = sample_camera_path(rng, frames, WORLD)
    return render_video(scene, cams), cams


def test_is_a_backbone_with_the_documented_geometry():
    model = random_model()
    g = model.geometry
    assert isinstance(model, Backbone)
    assert (g.latent_channels, g.latent_height, g.latent_width, g.tokens_per_frame, g.chunk_frames) == (12, 16, 16, 64, 4)
    assert g.rope.w.kind == "periodic" and g.rope.w.period == WORLD / 4


def test_space_to_depth_layout_and_round_trip():
    frames, _ = world_clip(1, 3)
    lat = space_to_depth(torch.from_numpy(frames))
    assert lat.shape == (1, 12, 3, 16, 16) and lat.min() >= -1 and lat.max() <= 1
    f, i, j, c, dy, dx = 2, 5, 11, 1, 1, 0
    assert lat[0, 4 * c + 2 * dy + dx, f, i, j] == pytest.approx(frames[f, 2 * i + dy, 2 * j + dx, c] / 127.5 - 1)
    assert torch.equal(depth_to_space(lat), torch.from_numpy(frames))
    model = random_model()
    assert torch.equal(model.decode(model.encode(torch.from_numpy(frames))), torch.from_numpy(frames))


def test_frames_of_another_shape_are_refused():
    model = random_model()
    for shape in [(32, 32, 3), (2, 32, 32, 4), (2, 32, 16, 3), (1, 2, 32, 32, 3)]:
        with pytest.raises(ValueError, match=r"tiny model frames must be \[F, 32, 32, 3\], got"):
            model.encode(torch.zeros(shape, dtype=torch.uint8))


def test_camera_poses_turn_about_the_vertical_axis_by_the_windows_share_of_the_world():
    poses = random_model().camera_poses(CameraPlan(np.array([0, WORLD // 4, WORLD // 2, 3 * WORLD // 8])))
    assert poses.shape == (4, 4, 4) and poses.dtype == torch.float64
    s = 2**-0.5
    turns = {0: (1.0, 0.0), 1: (0.0, 1.0), 2: (-1.0, 0.0), 3: (-s, s)}  # (cos, sin) of 0, 90, 180, 135 degrees
    for i, (c, n) in turns.items():
        expected = torch.tensor([[c, 0, n, 0], [0, 1, 0, 0], [-n, 0, c, 0], [0, 0, 0, 1]], dtype=torch.float64)
        torch.testing.assert_close(poses[i], expected, atol=1e-12, rtol=0)


def test_positions_use_world_columns_that_wrap_around():
    model = random_model()
    pos = model.positions(np.array([252, 8]), np.array([7.0, 8.0]))
    assert pos.shape == (128, 3)
    first = pos[:64].reshape(8, 8, 3)
    assert first[0, :, 2].tolist() == [63, 0, 1, 2, 3, 4, 5, 6]  # offset 252 px = world token 63, wraps
    assert first[:, 0, 1].tolist() == list(range(8)) and bool((first[..., 0] == 7).all())
    assert pos[64:].reshape(8, 8, 3)[0, :, 2].tolist() == list(range(2, 10))


def test_screen_keys_put_the_screen_column_on_the_w_axis_whatever_the_camera():
    """The real models' layout: the camera reaches the model only through the camera map."""
    from cmbench.backbones.tiny import default_config

    cfg = default_config(keys="screen")
    assert cfg.keys == "screen" and cfg.rope_spec().t.dim == 16 and cfg.rope_spec().w.period == 16
    model = TinyWorldModel.random(0, cfg)
    pos = model.positions(np.array([252, 8]), np.array([7.0, 8.0])).reshape(2, 8, 8, 3)
    assert pos[0, 0, :, 2].tolist() == list(range(8)) and torch.equal(pos[0, ..., 1:], pos[1, ..., 1:])
    assert not torch.equal(model.camera_map(np.array([252])), model.camera_map(np.array([8])))
    with pytest.raises(ConfigError, match="keys must be"):
        TinyConfig.from_dict({**cfg.to_dict(), "keys": "panorama"})
    legacy = default_config().to_dict()
    del legacy["keys"]  # weights saved before the field existed used world keys
    assert TinyConfig.from_dict(legacy).keys == "world"


def test_camera_map_is_the_viewing_ray_on_the_cylinder():
    model = random_model()
    cam = model.camera_map(np.array([0, 128]))
    assert cam.shape == (1, 3, 2, 16, 16)
    # latent column 0 of offset 0 looks at pixel x = 1: phi = 2 pi / 256
    assert cam[0, 0, 0, 3, 0] == pytest.approx(np.sin(2 * np.pi / WORLD), abs=1e-6)
    # half a world later the ray points the opposite way
    torch.testing.assert_close(cam[0, :2, 1], -cam[0, :2, 0])
    assert cam[0, 2, 0, 0, 0] == pytest.approx(-15 / 16) and cam[0, 2, 0, 15, 0] == pytest.approx(15 / 16)


def test_condition_reads_the_miniworld_extension():
    model = random_model()
    task = SimpleNamespace(task_id="syn_001_revisit_01", extra={
        "miniworld": {"context_camera_x": [0, 4, 8], "continuation_camera_x": [12, 16], "panorama_width": WORLD}
    })
    plan = model.condition(task)
    assert plan.camera_x.tolist() == [0, 4, 8, 12, 16]
    assert plan.window(3, 2).tolist() == [12, 16]
    with pytest.raises(ValueError, match="outside the camera plan"):
        plan.window(4, 2)
    with pytest.raises(ConfigError, match="MiniWorld camera plans"):
        model.condition(SimpleNamespace(task_id="real_001_reappear_01", extra={}))
    task.extra["miniworld"]["panorama_width"] = 512
    with pytest.raises(ConfigError, match="trained for 256 px"):
        model.condition(task)
    with pytest.raises(ValueError, match="whole 4-px steps"):
        CameraPlan(np.array([0, 6]))


def test_config_rejects_a_world_axis_that_does_not_wrap():
    cfg = small_config().to_dict()
    cfg["rope"]["w"] = {"dim": 20, "kind": "log", "theta": 10000.0}
    with pytest.raises(ConfigError, match="periodic with period 64"):
        TinyConfig.from_dict(cfg)


def test_save_and_load_round_trip(tmp_path):
    model = random_model(3)
    path = tmp_path / "w.safetensors"
    model.save_pretrained(path)
    loaded = TinyWorldModel.from_pretrained(path)
    assert loaded.config == model.config
    for key, value in model.dit.state_dict().items():
        assert torch.equal(loaded.dit.state_dict()[key], value), key
    cfg = json.loads(path.with_suffix(".json").read_text())
    cfg["dit"]["num_layers"] = 3
    path.with_suffix(".json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="missing keys.*blocks.2"):
        TinyWorldModel.from_pretrained(path)
    with pytest.raises(ConfigError, match="not found"):
        TinyWorldModel.from_pretrained(tmp_path / "absent.safetensors")


def test_chunk_by_chunk_with_the_kv_cache_equals_one_block_causal_forward():
    """The key contract: AR generation through ``KVCache.attend`` == the training forward."""
    model = random_model(4)
    n_chunks, cf = 4, 4
    frames, cams = world_clip(5, n_chunks * cf)
    x0 = model.encode(torch.from_numpy(frames))
    plan = CameraPlan(cams)
    gen = torch.Generator().manual_seed(0)
    levels = [0.999, 0.9, 0.7, 0.4]
    noisy = torch.cat(
        [(1 - t) * x0[:, :, j * cf : (j + 1) * cf] + t * torch.randn(1, 12, cf, 16, 16, generator=gen)
         for j, t in enumerate(levels)], dim=2
    )

    cache = KVCache.from_geometry(model.geometry)
    stepwise = []
    with torch.no_grad():
        for j, t in enumerate(levels):
            cache.begin_chunk(j, j * cf, cf)
            stepwise.append(model.denoise(noisy[:, :, j * cf : (j + 1) * cf], t, cache, j * cf, plan))
            model.denoise(x0[:, :, j * cf : (j + 1) * cf], 0.0, cache, j * cf, plan)
            cache.commit_chunk()
            if j == 1:  # keep-all compaction must not change anything
                cache.compact(lambda bank: torch.ones(bank.n, dtype=torch.bool))

        segments = [(j, False) for j in range(n_chunks)] + [(j, True) for j in range(n_chunks)]
        x = torch.cat([x0, noisy], dim=2)
        t = torch.cat([torch.zeros(n_chunks * cf), torch.tensor(levels).repeat_interleave(cf)])[None]
        frame_idx = np.concatenate([np.arange(n_chunks * cf)] * 2)
        whole = model.predict(x, t, np.concatenate([cams, cams]), frame_idx.astype(float),
                              BlockCausalAttention(segments, model.geometry.tokens_per_chunk))
    torch.testing.assert_close(torch.cat(stepwise, dim=2), whole[:, :, n_chunks * cf :], atol=1e-4, rtol=1e-4)
    # the history matters (so the equality is not vacuous): without it chunk 3 comes out different
    with torch.no_grad():
        alone = KVCache.from_geometry(model.geometry)
        alone.begin_chunk(3, 3 * cf, cf)
        no_history = model.denoise(noisy[:, :, 3 * cf :], levels[3], alone, 3 * cf, plan)
    assert (no_history - stepwise[3]).abs().max() > 1e-2
