"""Building blocks shared by the real backbone loaders: the DiT from a state dict, VAE + text encoder.

The VAE and the umt5 encoder are the same for every model here (Wan 2.1 VAE, umt5-xxl). They are
read from a diffusers-format folder such as ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` with ``vae/``,
``text_encoder/`` and ``tokenizer/`` subfolders (``components``), or from explicit paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from cmbench.backbones.dit import CausalWanDiT
from cmbench.backbones.wan.checkpoint import WeightLike, load_into, to_wan_layout
from cmbench.backbones.wan.precision import cast_for_inference, parse_dtype
from cmbench.backbones.wan.spec import check_against_checkpoint_config, dit_config, read_checkpoint_config
from cmbench.backbones.wan.text import TextEncoder
from cmbench.backbones.wan.vae import WanVAE
from cmbench.cache.rope import RopeSpec
from cmbench.errors import ConfigError


def check_device(device: str, name: str) -> None:
    """Fail early, before any weight is read, when the configured device does not exist here."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{name}: device {device!r} is configured but no CUDA GPU is available; the real "
                          f"backbones run on GPUs (docs/real_backbones.md); use backbone=tiny on a CPU")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"{name}: device {device!r} does not exist ({torch.cuda.device_count()} GPU(s) visible)")


def meta_dit(fields: Mapping[str, Any], dtype: str | torch.dtype = "bfloat16", fp32_residual: bool = False,
             rope_theta: float = 10000.0) -> CausalWanDiT:
    """The DiT of the given shape on the meta device, cast as it will run (no memory, no weights).

    Every parameter has its inference dtype (:func:`cast_for_inference`), so its bytes are what the
    loaded model will hold: the loader fills it, the memory planner counts it.
    """
    cfg = dit_config(fields)
    rope = RopeSpec.wan(cfg.head_dim, rope_theta)  # its frequency table is a real (CPU) tensor
    with torch.device("meta"):
        dit = CausalWanDiT(cfg, rope)
    return cast_for_inference(dit, parse_dtype(dtype), fp32_residual=fp32_residual)


def build_dit(fields: Mapping[str, Any], state: Mapping[str, WeightLike], source: str,
              dtype: str | torch.dtype = "bfloat16", device: str = "cpu", fp32_residual: bool = False,
              rope_theta: float = 10000.0) -> CausalWanDiT:
    """A causal DiT of the given shape holding ``state`` (any supported key layout).

    The model is built on the meta device and cast there (:func:`meta_dit`); then each checkpoint
    tensor is read from its memory-mapped file, cast to its parameter's dtype and moved to ``device``
    one at a time (:func:`~cmbench.backbones.wan.checkpoint.load_into`). Peak memory is the model in
    its final dtype plus one tensor: a 14B model never exists twice, in any dtype.

    Parameters
    ----------
    fields : mapping
        :class:`~cmbench.backbones.dit.DiTConfig` fields (the backbone config's ``dit`` block).
    state : mapping
        Weights in Wan, wrapped (``model.``) or diffusers names; tensors or lazy handles
        (:func:`~cmbench.backbones.wan.checkpoint.open_state_dict`).
    source : str
        Named in errors.
    dtype, device : compute dtype and device.
    fp32_residual : bool
        Carry the residual stream and the head in float32 (LingBot World; see ``precision``).
    rope_theta : float
        Base of Wan's 3D RoPE.
    """
    wan_state, _ = to_wan_layout(state)
    dit = meta_dit(fields, dtype, fp32_residual, rope_theta)
    load_into(dit, wan_state, source, device)
    return dit.eval().requires_grad_(False)


def check_folder_config(folder: str | Path, fields: Mapping[str, Any]) -> None:
    """Compare a checkpoint folder's ``config.json`` (if any) with the backbone config's ``dit`` block."""
    stated = read_checkpoint_config(folder)
    if stated is not None:
        check_against_checkpoint_config(dit_config(fields), stated[0], f"{Path(folder) / 'config.json'}")


def find_dit_folder(path: str | Path, subfolder: str | None = None) -> Path:
    """The folder holding a model's DiT weights.

    ``path/subfolder`` when given; ``path`` itself when it holds weights; else its only subfolder that
    holds ``*.safetensors`` (LingBot's release keeps the fast DiT in a subfolder next to the VAE and T5).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ConfigError(f"model weights not found: {path} does not exist (see docs/real_backbones.md)")
    if subfolder:
        folder = path / subfolder
        if not folder.is_dir():
            raise ConfigError(f"{path}: no subfolder {subfolder!r}; it holds {sorted(p.name for p in path.iterdir())}")
        return folder
    if path.is_file() or any(path.glob("*.safetensors")):
        return path
    candidates = sorted(p for p in path.iterdir() if p.is_dir() and any(p.glob("*.safetensors")))
    if len(candidates) != 1:
        raise ConfigError(f"{path}: cannot tell which subfolder holds the DiT (candidates "
                          f"{[p.name for p in candidates]}); set dit_subfolder")
    return candidates[0]


def load_components(components: str | Path | None, vae: str | Path | None = None,
                    text_encoder: str | Path | None = None, tokenizer: str | Path | None = None,
                    text_len: int = 512, device: str = "cpu", text_device: str | None = None,
                    vae_dtype: str = "float32", text_dtype: str = "bfloat16") -> tuple[WanVAE, TextEncoder]:
    """The Wan VAE and umt5 encoder from ``components/{vae,text_encoder,tokenizer}`` or explicit folders."""
    def pick(explicit, sub):
        if explicit is not None:
            return Path(explicit).expanduser()
        if components is None:
            raise ConfigError(f"set backbone.components (a folder with {sub}/) or backbone.{sub}")
        return Path(components).expanduser() / sub

    vae_model = WanVAE.from_pretrained(pick(vae, "vae"), device=device, dtype=vae_dtype)
    tok = pick(tokenizer, "tokenizer") if tokenizer is not None or components is not None else None
    text = TextEncoder.from_pretrained(pick(text_encoder, "text_encoder"), tokenizer=tok, text_len=text_len,
                                       device=text_device or device, dtype=text_dtype)
    return vae_model, text
