"""DiT shapes: from a backbone config, and from a checkpoint's ``config.json``.

A backbone config states the transformer's shape (``dit:`` block, :class:`DiTConfig` fields). When a
checkpoint directory carries a ``config.json`` (Wan's ``WanModel`` / LingBot's ``WanModelFast``, or
diffusers' ``WanTransformer3DModel``), :func:`check_against_checkpoint_config` compares the two and
names every field that differs, so a wrong checkpoint fails before any weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from cmbench.backbones.dit import DiTConfig
from cmbench.errors import ConfigError

CAMERA_FOLD = 8 * 8  # LingBot folds the per-pixel camera map over the VAE's 8x8 pixel patch
LINGBOT_CONTROL_CHANNELS = {"cam": 6, "act": 7}  # Plucker rays; rays + WASD action


def dit_config(fields: Mapping[str, Any]) -> DiTConfig:
    """A :class:`DiTConfig` from a config mapping, with a :class:`ConfigError` naming bad keys."""
    try:
        return DiTConfig.from_dict(dict(fields))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"backbone dit config {dict(fields)}: {err}") from err


def from_wan_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """DiT fields stated by an original Wan / LingBot ``config.json`` (``in_dim``, ``dim``, ...).

    LingBot's model always builds its camera path; ``control_type`` (``"cam"``: 6 Plucker channels)
    or ``cam_channels`` give the per-pixel channels, folded over 8x8 pixels per latent pixel.
    """
    out: dict[str, Any] = {}
    for ours, theirs in (("in_channels", "in_dim"), ("out_channels", "out_dim"), ("dim", "dim"),
                         ("ffn_dim", "ffn_dim"), ("num_heads", "num_heads"), ("num_layers", "num_layers"),
                         ("freq_dim", "freq_dim"), ("text_dim", "text_dim"), ("eps", "eps"),
                         ("cross_attn_norm", "cross_attn_norm")):
        if theirs in cfg:
            out[ours] = cfg[theirs]
    if "patch_size" in cfg:
        out["patch_size"] = tuple(cfg["patch_size"])
    if cfg.get("cam_channels") is not None:
        out["camera_dim"] = int(cfg["cam_channels"]) * CAMERA_FOLD
    elif "control_type" in cfg:
        kind = cfg["control_type"]
        if kind not in LINGBOT_CONTROL_CHANNELS:
            raise ConfigError(f"config.json control_type {kind!r} is not one of {sorted(LINGBOT_CONTROL_CHANNELS)}")
        out["camera_dim"] = LINGBOT_CONTROL_CHANNELS[kind] * CAMERA_FOLD
    return out


def from_diffusers_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """DiT fields stated by a diffusers ``WanTransformer3DModel`` ``config.json``.

    Raises for features this DiT does not build (CLIP image cross-attention, other q/k norms).
    """
    unsupported = {k: cfg[k] for k in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len") if cfg.get(k)}
    if cfg.get("qk_norm", "rms_norm_across_heads") != "rms_norm_across_heads":
        unsupported["qk_norm"] = cfg["qk_norm"]
    if unsupported:
        raise ConfigError(f"diffusers config.json uses features the causal DiT does not build: {unsupported}")
    out: dict[str, Any] = {}
    if "num_attention_heads" in cfg and "attention_head_dim" in cfg:
        out["dim"] = int(cfg["num_attention_heads"]) * int(cfg["attention_head_dim"])
        out["num_heads"] = int(cfg["num_attention_heads"])
    for ours, theirs in (("in_channels", "in_channels"), ("out_channels", "out_channels"), ("ffn_dim", "ffn_dim"),
                         ("num_layers", "num_layers"), ("freq_dim", "freq_dim"), ("text_dim", "text_dim"),
                         ("eps", "eps"), ("cross_attn_norm", "cross_attn_norm")):
        if theirs in cfg:
            out[ours] = cfg[theirs]
    if "patch_size" in cfg:
        out["patch_size"] = tuple(cfg["patch_size"])
    return out


def read_checkpoint_config(directory: str | Path) -> tuple[dict[str, Any], str] | None:
    """DiT fields from ``<directory>/config.json`` and the layout it describes, or None without one.

    Returns
    -------
    (fields, kind) with kind ``"diffusers"`` or ``"wan"``.
    """
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from err
    if cfg.get("_class_name") == "WanTransformer3DModel" or "num_attention_heads" in cfg:
        return from_diffusers_config(cfg), "diffusers"
    return from_wan_config(cfg), "wan"


def check_against_checkpoint_config(declared: DiTConfig, stated: Mapping[str, Any], source: str) -> None:
    """Raise naming every field where the backbone config and the checkpoint's config.json differ."""
    ours = declared.to_dict()
    diffs = []
    for key, value in stated.items():
        mine = ours[key]
        theirs = list(value) if isinstance(value, tuple) else value
        if isinstance(mine, float) or isinstance(theirs, float):
            same = (isinstance(mine, (int, float)) and isinstance(theirs, (int, float))
                    and abs(float(mine) - float(theirs)) <= 1e-12)
        else:
            same = mine == theirs
        if not same:
            diffs.append(f"{key}: checkpoint {theirs!r} vs backbone config {mine!r}")
    if diffs:
        raise ConfigError(f"{source} describes a different transformer: " + "; ".join(diffs))
