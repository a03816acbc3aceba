"""LingBot World v2 (causal fast, 14B and 1.3B) on the causal DiT.

The release (``robbyant/lingbot-world-v2-14b-causal-fast``) keeps the fast causal DiT in a subfolder
(``config.json`` with Wan's names, e.g. ``in_dim 36``, ``control_type "cam"``, and sharded
``diffusion_pytorch_model-*.safetensors``) in the original Wan key layout plus LingBot's camera
layers, next to ``Wan2.1_VAE.pth`` and the umt5-xxl encoder. CMBench reads the DiT from there and the
VAE / text encoder through diffusers / transformers from a diffusers-format folder (``components``),
e.g. ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``, which holds the same VAE and umt5-xxl weights.

Conditioning (facts of the LingBot runtime): DiT input = 16 noisy channels + 4 mask + 16 first-frame
latent channels; camera = Plucker rays folded per 8x8 pixels (384 channels) through
``patch_embedding_wancamctrl`` and injected after every self-attention; the model predicts the flow
velocity, sampled with 4 steps (999, 957, 899, 702).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from cmbench.backbones.wan.backbone import WanBackbone
from cmbench.backbones.wan.checkpoint import open_state_dict
from cmbench.backbones.wan.components import (build_dit, check_device, check_folder_config, find_dit_folder,
                                              load_components)
from cmbench.errors import ConfigError


def load_lingbot_world(path: str, dit: Mapping[str, Any], components: str | None = None,
                       dit_subfolder: str | None = None,
                       vae: str | None = None, text_encoder: str | None = None, tokenizer: str | None = None,
                       height: int = 480, width: int = 832, fps: float = 16.0, chunk_frames: int = 4,
                       text_len: int = 512, camera_intrinsics: Sequence[float] | None = None,
                       dtype: str = "bfloat16", vae_dtype: str = "float32", text_dtype: str = "bfloat16",
                       device: str = "cuda", text_device: str | None = None, offload_kv: bool = False,
                       fp32_residual: bool = True, context_prompts: str = "continue",
                       decode_warmup: int | None = None, model_name: str = "lingbot_world_v2") -> WanBackbone:
    """Build LingBot World v2 from a local download.

    Parameters
    ----------
    path : str
        The model download (or directly the DiT folder).
    dit : mapping
        The DiT's shape (:class:`~cmbench.backbones.dit.DiTConfig` fields); must have the I2V input
        (``in_channels = out_channels + 4 + 16``) and the camera path (``camera_dim = 384``).
    components : str, optional
        Folder with ``vae/``, ``text_encoder/`` and ``tokenizer/`` (diffusers layout).
    dit_subfolder : str, optional
        Subfolder of ``path`` with the DiT; found automatically when only one holds safetensors.
    vae, text_encoder, tokenizer : str, optional
        Explicit folders instead of ``components``.
    height, width, fps : frame size and rate of the prepared context (the config's ``context`` block).
    chunk_frames : int
        Latent frames per AR chunk (4, the paper's operating point).
    text_len : int
        umt5 context length (512).
    camera_intrinsics : 4 floats, optional
        ``(fx, fy, cx, cy)`` of the default static camera; default LingBot's example intrinsics
        (502.91, 503.11, 415.78, 239.78) at 832x480, scaled to the frame size.
    dtype, vae_dtype, text_dtype : compute dtypes of DiT, VAE and text encoder.
    device, text_device : where the models run (the text encoder may stay on ``"cpu"``).
    offload_kv : bool
        Keep the KV cache in host memory, staged per layer.
    fp32_residual : bool
        Carry the residual stream and the head in float32 (LingBot's runtime does; default true).
    context_prompts : {"continue", "clips"}
        What conditions the prefill: the task's ``continue_prompt`` (the authors' harness) or the clip
        prompts spread over the context.
    decode_warmup : int, optional
        Context latent frames the VAE decoder runs over before a continuation (``None``: all of them).
    model_name : str
        Named in errors (the configs pass their ``name``).
    """
    name = model_name
    if dit.get("camera_dim") is None or int(dit["in_channels"]) <= int(dit["out_channels"]):
        raise ConfigError(f"{name}: LingBot World needs camera_dim and I2V input channels in its dit config, "
                          f"got {dict(dit)}")
    check_device(device, name)
    folder = find_dit_folder(path, dit_subfolder)
    check_folder_config(folder, dit)
    model = build_dit(dit, open_state_dict(folder), f"{name} checkpoint {folder}", dtype, device, fp32_residual)
    vae_model, text = load_components(components, vae, text_encoder, tokenizer, text_len, device, text_device,
                                      vae_dtype, text_dtype)
    return WanBackbone(model, vae_model, text, height, width, chunk_frames, fps, camera_intrinsics, device,
                       offload_kv, name, context_prompts, decode_warmup)
