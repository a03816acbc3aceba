"""Bytes of every model a run keeps on its devices, counted from meta-device models (no weights read).

- the DiT: :func:`~cmbench.backbones.wan.components.meta_dit`, cast exactly as the loader casts it (bf16
  with float32 islands), so its bytes are the loaded model's;
- the umt5 text encoder and the Wan VAE: built on the meta device from their folder's ``config.json``
  when it is there, else from the released architecture (umt5-xxl: Wan's ``umt5_xxl`` shape; the Wan 2.1
  VAE: ``AutoencoderKLWan()``'s defaults), in the configured dtype;
- the scorer's networks: from a local folder's safetensors headers, else a table of the default models'
  parameter counts (an approximation: those models are not here to count).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch

from cmbench.backbones.memory.measure import tensor_bytes
from cmbench.backbones.wan.precision import parse_dtype

# umt5-xxl encoder as Wan runs it (Wan's ``umt5_xxl``: vocab 256384, dim 4096, ffn 10240, 64 heads, 24 layers,
# 32 relative-position buckets per layer, gated GELU)
UMT5_XXL: dict[str, Any] = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                                 relative_attention_num_buckets=32, feed_forward_proj="gated-gelu",
                                 is_encoder_decoder=False)

# parameters of the scorers' default networks (model cards), used when a model is not a local folder
SCORER_PARAMS = {"google/owlvit-base-patch32": 153_000_000, "google/owlvit-base-patch16": 153_000_000,
                 "google/owlv2-base-patch16-ensemble": 155_000_000, "facebook/sam2.1-hiera-large": 224_400_000,
                 "facebook/sam2.1-hiera-base-plus": 80_800_000, "facebook/sam2.1-hiera-small": 46_000_000,
                 "facebook/sam2.1-hiera-tiny": 38_900_000, "facebook/dinov2-small": 22_100_000,
                 "facebook/dinov2-base": 86_600_000, "facebook/dinov2-large": 304_400_000}
NEURAL_STAGES = ("detector", "segmenter", "embedder")


def dit_bytes(fields: Mapping[str, Any], dtype: str, fp32_residual: bool) -> int:
    """Bytes of the loaded DiT (bf16 with float32 islands, as :func:`cast_for_inference` leaves it)."""
    from cmbench.backbones.wan.components import meta_dit

    return tensor_bytes(meta_dit(fields, dtype, fp32_residual).parameters())


def largest_tensor_bytes(fields: Mapping[str, Any]) -> int:
    """The largest DiT parameter in float32: what the loader holds beside the model while casting it."""
    from cmbench.backbones.wan.components import meta_dit

    return max(p.numel() for p in meta_dit(fields, "float32").parameters()) * 4


def _config_json(folder: Path | None) -> dict | None:
    if folder is None or not (folder / "config.json").is_file():
        return None
    return json.loads((folder / "config.json").read_text())


def text_encoder_config(folder: str | Path | None) -> tuple[Any, str]:
    """The umt5 encoder's transformers config (its folder's, else umt5-xxl's) and where it came from."""
    from transformers import AutoConfig, UMT5Config

    path = Path(folder).expanduser() if folder is not None else None
    if path is not None and _config_json(path) is not None:
        return AutoConfig.from_pretrained(str(path), local_files_only=True), f"{path / 'config.json'}"
    return UMT5Config(**UMT5_XXL), "umt5-xxl (Wan's text encoder)"


def text_encoder_bytes(folder: str | Path | None, dtype: str) -> tuple[int, str]:
    """Bytes of the umt5 encoder in ``dtype`` and where its shape came from."""
    from transformers import T5EncoderModel, UMT5EncoderModel

    config, source = text_encoder_config(folder)
    cls = UMT5EncoderModel if config.model_type == "umt5" else T5EncoderModel
    with torch.device("meta"):
        model = cls(config)
    return _bytes_in(model.parameters(), parse_dtype(dtype)), source


def vae_bytes(folder: str | Path | None, dtype: str) -> tuple[int, str, int]:
    """Bytes of the Wan VAE in ``dtype``, where its shape came from, and its base width (``base_dim``)."""
    from diffusers import AutoencoderKLWan

    path = Path(folder).expanduser() if folder is not None else None
    stated = _config_json(path)
    with torch.device("meta"):
        if path is not None and stated is not None:
            model = AutoencoderKLWan.from_config(stated)
            source = f"{path / 'config.json'}"
        else:
            model, source = AutoencoderKLWan(), "the Wan 2.1 VAE"
    size = _bytes_in([*model.parameters(), *model.buffers()], parse_dtype(dtype))
    return size, source, int(model.config.base_dim)


def _bytes_in(tensors, dtype: torch.dtype) -> int:
    """Bytes of ``tensors`` once cast to ``dtype`` (floating point ones; others as they are)."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(t.numel() * (size if t.is_floating_point() else t.element_size()) for t in tensors)


def safetensors_params(folder: Path) -> int:
    """Parameters stored in a folder's safetensors files (headers only)."""
    from safetensors import safe_open

    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                n = 1
                for d in f.get_slice(key).get_shape():
                    n *= int(d)
                total += n
    return total


def scorer_bytes(scorer: Mapping[str, Any]) -> tuple[int, list[str]]:
    """Bytes of a scorer config's neural networks, and one note per network.

    The scorers keep float32 weights (``precision`` is an autocast of their forward passes); a stage
    without a ``model`` (the light scorer's template matcher) holds none.
    """
    size = 4
    total, notes = 0, []
    for stage in NEURAL_STAGES:
        model = (scorer.get(stage) or {}).get("model")
        if not model:
            continue
        path = Path(str(model)).expanduser()
        if path.is_dir() and any(path.glob("*.safetensors")):
            params, where = safetensors_params(path), "its safetensors"
        elif str(model) in SCORER_PARAMS:
            params, where = SCORER_PARAMS[str(model)], "model card"
        else:
            notes.append(f"{stage} {model}: size unknown (not a local folder), counted as 0")
            continue
        total += params * size
        notes.append(f"{stage} {model}: {params / 1e6:.0f} M parameters ({where})")
    return total, notes
