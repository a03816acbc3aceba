"""The short-window tiny weights (``backbone=tiny_short``): they load through the normal config path,
generate a chunk deterministically, and their JSON records how they were trained (true-time temporal
positions on short clips, from scratch), which is what makes them the RoPE re-index ablation's
backbone (docs/tiny_model.md, "Short-window weights (tiny_short)")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from cmbench.backbones.loading import build_backbone
from cmbench.backbones.tiny import CameraPlan, TinyWorldModel
from cmbench.config_paths import CONFIG_DIR
from cmbench.generation import continue_task, prefill
from cmbench.methods.head_map import HeadMap
from cmbench.methods.registry import build_method
from cmbench.miniworld import render_video, scene_from_seed

CONTEXT_FRAMES = 192  # a MiniWorld context: 12x the training clip


def backbone_config():
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=["backbone=tiny_short"]).backbone


def test_the_config_names_the_short_weights_and_their_head_map():
    cfg = backbone_config()
    assert cfg.name == "tiny_short"
    assert Path(cfg.path).name == "tiny_miniworld_short.safetensors" and Path(cfg.path).is_file()
    hmap = HeadMap.load_for(cfg.head_map, build_backbone(cfg).geometry, "decoprune_hs")
    assert Path(cfg.head_map).name == "tiny_miniworld_short_head_map.json"
    assert (hmap.num_layers, hmap.num_heads) == (4, 4)
    assert cfg.context.temporal_stride == 1  # the tiny model's context preparation, inherited


def test_the_json_records_true_time_positions_on_a_short_window_from_scratch():
    saved = json.loads(Path(backbone_config().path).with_suffix(".json").read_text())
    training = saved["training"]
    assert training["positions"] == "true" and training["world"] == "dynamic"
    window = training["chunks"] * saved["chunk_frames"]
    assert window == 16 and window < CONTEXT_FRAMES
    assert training["init_weights"] is None and "init_training" not in training
    assert training["max_temporal_span"] is None  # true time: the window alone bounds the offsets
    assert saved["rope"]["t"]["theta"] == training["time_theta"] == 100.0
    assert training["steps_done"] > 0 and training["cpu_minutes"] > 0


def test_loads_through_the_config_path_and_generates_a_chunk_deterministically():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_backbone(backbone_config())
        assert isinstance(model, TinyWorldModel) and model.config.chunk_frames == 4
        cf = model.config.chunk_frames
        scene = scene_from_seed(7, "synthetic", model.config.world_width, True)
        cams = (np.arange(3 * cf) * 4) % model.config.world_width  # 2 context chunks + 1 generated
        context = model.encode(torch.from_numpy(render_video(scene, cams[: 2 * cf])))
        plan = CameraPlan(cams)

        def generate() -> torch.Tensor:
            with torch.no_grad():
                pre = prefill(model, build_method({"name": "fullkv"}), context, plan, 5)
                return continue_task(model, pre, plan, cf, 6).latents

        first, second = generate(), generate()
        assert first.shape == (1, 12, cf, 16, 16)
        assert bool(torch.isfinite(first).all())
        assert torch.equal(first, second)
    finally:
        torch.set_num_threads(threads)
