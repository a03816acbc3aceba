"""A tiny LingBot-shaped backbone for tests, loaded exactly as the real one: a user config folder naming
backbone ``lingbot_tiny``, the DiT in LingBot's release layout (sharded safetensors), the VAE, umt5 and
tokenizer in diffusers layout, with text, camera and I2V conditioning on 32x32 frames at 16 fps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml

from cmbench.backbones.dit import DiTConfig
from cmbench.backbones.wan.synthetic import random_dit_state, save_components, save_lingbot_dit

DIT = DiTConfig(in_channels=36, out_channels=16, dim=24, ffn_dim=32, num_heads=2, num_layers=2, text_dim=16,
                camera_dim=384)


def write_tiny_lingbot(root: Path, memory: dict[str, Any], std: float = 0.05) -> Path:
    """Write the model under ``root`` (``components/``, ``model/``) and its config; the config folder.

    Parameters
    ----------
    root : Path
    memory : dict
        The backbone's ``memory`` block (offloads, ``park_prefill``, ...).
    std : float
        Spread of the random DiT weights (larger: the text path moves the frames visibly).

    Returns
    -------
    Path
        ``root / "configs"``, for ``CMBENCH_CONFIG_PATH``.
    """
    torch.manual_seed(0)
    save_components(root / "components", text_dim=DIT.text_dim)
    save_lingbot_dit(root / "model" / "lingbot_world_fast", random_dit_state(DIT, seed=2, std=std), DIT)
    backbone = {
        "name": "lingbot_tiny", "description": "tiny LingBot-shaped test backbone",
        "_target_": "cmbench.backbones.wan.lingbot.load_lingbot_world",
        "path": str(root / "model"), "components": str(root / "components"), "dit": DIT.to_dict(),
        "height": "${.context.height}", "width": "${.context.width}", "fps": "${.context.fps}", "chunk_frames": 4,
        "text_len": 16, "camera_intrinsics": [16.0, 16.0, 16.0, 16.0], "dtype": "float32", "text_dtype": "float32",
        "device": "cpu", "context": {"fps": 16, "height": 32, "width": 32, "temporal_stride": 4},
        "memory": memory,
    }
    configs = root / "configs"
    (configs / "backbone").mkdir(parents=True)
    (configs / "backbone" / "lingbot_tiny.yaml").write_text(yaml.safe_dump(backbone))
    return configs
