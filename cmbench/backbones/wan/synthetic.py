"""Random-weight stand-ins for the real checkpoints, written in their on-disk layouts.

Real weights are never available on CPU test machines, so every loader is exercised with random
models built from configs, saved in the layout of the real release and loaded back through the same
code path. This module writes those folders:

- :func:`save_components`: a diffusers ``AutoencoderKLWan`` (``vae/``), a transformers umt5 encoder
  (``text_encoder/``) and a tokenizer (``tokenizer/``) built offline from a character vocabulary;
- :func:`random_dit_state`: a DiT state dict in the original Wan names (every parameter random);
- :func:`save_lingbot_dit`: a LingBot-style DiT folder (``config.json`` with Wan's names and sharded
  ``diffusion_pytorch_model-*.safetensors`` with an index).

The tiny shapes used by the tests are in :data:`TINY_VAE` and :func:`tiny_umt5_config`; with
``AutoencoderKLWan()`` defaults the VAE has the real Wan 2.1 architecture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import save_file

from cmbench.backbones.dit import CausalWanDiT, DiTConfig
from cmbench.cache.rope import RopeSpec

TINY_VAE = {"base_dim": 3, "z_dim": 16, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1,
            "temperal_downsample": [False, True, True]}
VOCAB_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,'-"


def build_tokenizer():
    """A T5-style tokenizer (Unigram over characters, ``</s>`` appended, ``<pad>`` = 0), fully offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [(c, -3.0) for c in VOCAB_CHARS] + [("\u2581" + c, -2.5) for c in VOCAB_CHARS]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def tiny_umt5_config(d_model: int = 16, vocab_size: int = 4 + 2 * len(VOCAB_CHARS)):
    """A two-layer umt5 encoder config (``d_model`` = the DiT's ``text_dim``)."""
    from transformers import UMT5Config

    return UMT5Config(vocab_size=vocab_size, d_model=d_model, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                      relative_attention_num_buckets=8, is_encoder_decoder=False)


def save_components(folder: str | Path, text_dim: int = 16, vae: Mapping[str, Any] | None = None,
                    seed: int = 0) -> Path:
    """Write ``vae/``, ``text_encoder/`` and ``tokenizer/`` with random weights (diffusers layout).

    Parameters
    ----------
    folder : str or Path
    text_dim : int
        ``d_model`` of the umt5 encoder.
    vae : mapping, optional
        ``AutoencoderKLWan`` arguments (default :data:`TINY_VAE`; ``{}`` for the real architecture).
    seed : int
    """
    from diffusers import AutoencoderKLWan
    from transformers import UMT5EncoderModel

    folder = Path(folder)
    torch.manual_seed(seed)
    tiny_vae = AutoencoderKLWan(**(TINY_VAE if vae is None else dict(vae)))
    # diffusers' top-level typing resolves AutoencoderKLWan to its no-torch placeholder (no save_pretrained)
    tiny_vae.save_pretrained(str(folder / "vae"))  # type: ignore[attr-defined]
    UMT5EncoderModel(tiny_umt5_config(text_dim)).save_pretrained(str(folder / "text_encoder"))
    build_tokenizer().save_pretrained(str(folder / "tokenizer"))
    return folder


def random_dit_state(cfg: DiTConfig, seed: int = 0, std: float = 0.05) -> dict[str, torch.Tensor]:
    """Random weights of a DiT of shape ``cfg``, in Wan names (no zero-initialised path left)."""
    gen = torch.Generator().manual_seed(seed)
    rope = RopeSpec.wan(cfg.head_dim)
    with torch.device("meta"):
        model = CausalWanDiT(cfg, rope)
    state = {}
    for key, value in model.state_dict().items():
        noise = torch.randn(value.shape, generator=gen) * std
        state[key] = noise + 1.0 if key.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight")) else noise
    return state


def wan_config_json(cfg: DiTConfig, control_type: str | None = "cam") -> dict[str, Any]:
    """The ``config.json`` of a Wan / LingBot DiT folder (Wan's field names)."""
    out = {"_class_name": "WanModelFast", "model_type": "i2v" if cfg.in_channels != cfg.out_channels else "t2v",
           "patch_size": list(cfg.patch_size), "in_dim": cfg.in_channels, "out_dim": cfg.out_channels, "dim": cfg.dim,
           "ffn_dim": cfg.ffn_dim, "freq_dim": cfg.freq_dim, "text_dim": cfg.text_dim, "num_heads": cfg.num_heads,
           "num_layers": cfg.num_layers, "eps": cfg.eps, "cross_attn_norm": cfg.cross_attn_norm, "text_len": 512}
    if control_type is not None:
        out["control_type"] = control_type
    return out


def save_lingbot_dit(folder: str | Path, state: Mapping[str, torch.Tensor], cfg: DiTConfig, shards: int = 2,
                     dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write a DiT folder as LingBot's release: ``config.json`` + sharded safetensors + index."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    keys = sorted(state)
    weight_map = {}
    for i in range(shards):
        name = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k].to(dtype).contiguous() for k in keys[i::shards]}
        save_file(part, str(folder / name))
        weight_map.update({k: name for k in part})
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
             "weight_map": weight_map}
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (folder / "config.json").write_text(json.dumps(wan_config_json(cfg), indent=1))
    return folder


def random_dit(cfg: DiTConfig, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
               std: float = 0.02, fp32_residual: bool = False) -> CausalWanDiT:
    """A DiT of shape ``cfg`` built directly on ``device`` with random weights (training init plus noise,
    so no path is zero), cast for inference (``fp32_residual``: LingBot's float32 residual stream and
    head). For checks at real shapes without any download."""
    from cmbench.backbones.wan.precision import cast_for_inference

    rope = RopeSpec.wan(cfg.head_dim)
    torch.manual_seed(seed)
    with torch.device(device):
        dit = CausalWanDiT(cfg, rope)
        with torch.no_grad():
            for p in dit.parameters():
                p.add_(std * torch.randn_like(p))
    return cast_for_inference(dit, dtype, device, fp32_residual)
