"""Wan2.1-T2V-1.3B and its causal distillations: Self-Forcing, Causal Forcing, LongLive.

All three ship a ``torch.save`` file whose top level holds state dicts (``generator``,
``generator_ema``) of Self-Forcing's ``WanDiffusionWrapper``, i.e. Wan's names under ``model.``:

- Self-Forcing (``gdhe17/Self-Forcing``): ``checkpoints/self_forcing_dmd.pt``, EMA weights
  (``generator_ema``) as its inference script's ``--use_ema``;
- Causal Forcing (``zhuhz22/Causal-Forcing``): ``chunkwise/causal_forcing.pt``, ``generator``;
- LongLive (``Efficient-Large-Model/LongLive-1.3B``): ``models/longlive_base.pt`` (``generator``)
  plus a PEFT LoRA ``models/lora.pt`` (``generator_lora``; rank 256, alpha 256, every linear layer of
  every block), merged here into the base weights.

The base model itself is published in Wan's layout (``Wan-AI/Wan2.1-T2V-1.3B``) and in diffusers'
(``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``, ``transformer/``); both load through ``checkpoint`` too.
Sampling (their configs): 3 latent frames per chunk, ``denoising_step_list [1000, 750, 500, 250]``
warped with shift 5, i.e. timesteps (1000, 937.5, 833.33, 625), re-noised with fresh noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from cmbench.backbones.wan.backbone import WanBackbone
from cmbench.backbones.wan.checkpoint import merge_lora, open_state_dict, to_wan_layout
from cmbench.backbones.wan.components import build_dit, check_device, check_folder_config, load_components
from cmbench.errors import ConfigError


def load_wan_t2v(checkpoint: str, dit: Mapping[str, Any], components: str | None = None,
                 state_key: str | None = None, lora: str | None = None, lora_key: str | None = None,
                 lora_alpha: float | None = None, vae: str | None = None, text_encoder: str | None = None,
                 tokenizer: str | None = None, height: int = 480, width: int = 832, fps: float = 16.0,
                 chunk_frames: int = 3, text_len: int = 512, dtype: str = "bfloat16", vae_dtype: str = "float32",
                 text_dtype: str = "bfloat16", device: str = "cuda", text_device: str | None = None,
                 offload_kv: bool = False, fp32_residual: bool = False, context_prompts: str = "continue",
                 decode_warmup: int | None = None, model_name: str = "wan_t2v") -> WanBackbone:
    """Build a Wan2.1-T2V-1.3B-based causal backbone from a local checkpoint.

    Parameters
    ----------
    checkpoint : str
        A ``.pt`` file (Self-Forcing style), or a folder with Wan or diffusers safetensors.
    dit : mapping
        The DiT's shape (text-to-video: ``in_channels == out_channels``, no camera).
    state_key : str, optional
        Which state dict of a ``.pt`` file to use (``generator`` / ``generator_ema``).
    lora, lora_key, lora_alpha : optional
        A PEFT LoRA file, the state dict inside it, and its alpha (merged as ``alpha / rank``).
    fp32_residual : bool
        Default false: these runtimes cast the whole generator to bf16 (residual stream included).
    Other parameters as :func:`cmbench.backbones.wan.lingbot.load_lingbot_world`.
    """
    name = model_name
    if int(dit["in_channels"]) != int(dit["out_channels"]) or dit.get("camera_dim") is not None:
        raise ConfigError(f"{name}: a text-to-video DiT has in_channels == out_channels and no camera, got {dict(dit)}")
    check_device(device, name)
    source = f"{name} checkpoint {checkpoint}"
    if Path(checkpoint).is_dir():
        check_folder_config(checkpoint, dit)
    state, _ = to_wan_layout(open_state_dict(checkpoint, state_key))
    if lora is not None:
        if lora_alpha is None:
            raise ConfigError(f"{name}: a LoRA needs lora_alpha (LongLive: 256)")
        merge_lora(state, open_state_dict(lora, lora_key), float(lora_alpha), f"{name} LoRA {lora}")
    model = build_dit(dit, state, source, dtype, device, fp32_residual)
    vae_model, text = load_components(components, vae, text_encoder, tokenizer, text_len, device, text_device,
                                      vae_dtype, text_dtype)
    return WanBackbone(model, vae_model, text, height, width, chunk_frames, fps, device=device,
                       offload_kv=offload_kv, name=name, context_prompts=context_prompts,
                       decode_warmup=decode_warmup)
