"""Read DiT checkpoints from disk and map their key layouts onto :class:`CausalWanDiT`.

:class:`~cmbench.backbones.dit.CausalWanDiT` uses the original Wan parameter names (and LingBot's
camera names), so a checkpoint in that layout loads key by key. This module handles what is around
it:

- files: a directory with a sharded ``*.safetensors.index.json``, a single ``.safetensors``, or a
  ``torch.save`` file (``.pt`` / ``.pth`` / ``.bin``) whose dict may nest the weights under a key
  such as ``generator`` / ``generator_ema`` (Self-Forcing, Causal Forcing, LongLive);
- wrapper prefixes: ``model.`` (Self-Forcing's ``WanDiffusionWrapper.model``), ``module.``,
  ``_orig_mod.``, stripped when every key carries them;
- the diffusers layout (``WanTransformer3DModel``: ``condition_embedder.*``, ``attn1``/``attn2``,
  ``to_q``..., ``scale_shift_table``), renamed to Wan names by :data:`DIFFUSERS_TO_WAN`;
- LoRA deltas in PEFT's layout (``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``),
  merged as ``W += (alpha / rank) * B @ A`` (LongLive);
- a strict check that names every missing, unexpected and wrongly shaped key
  (:func:`check_state_dict`), raised as :class:`~cmbench.errors.ConfigError`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import load_file
from torch import nn

from cmbench.errors import ConfigError

WRAPPER_PREFIXES = ("model.", "module.", "_orig_mod.")
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
LISTED = 12  # keys named per category in an error message

# diffusers' WanTransformer3DModel names -> original Wan names (applied in order, first match wins
# per rule; every rule is applied to every key)
DIFFUSERS_TO_WAN: tuple[tuple[str, str], ...] = (
    (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
    (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
    (r"^condition_embedder\.time_proj\.", "time_projection.1."),
    (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
    (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."),
    (r"^(blocks\.\d+)\.attn1\.", r"\1.self_attn."),
    (r"^(blocks\.\d+)\.attn2\.", r"\1.cross_attn."),
    (r"\.to_q\.", ".q."),
    (r"\.to_k\.", ".k."),
    (r"\.to_v\.", ".v."),
    (r"\.to_out\.0\.", ".o."),
    (r"^(blocks\.\d+)\.norm2\.", r"\1.norm3."),
    (r"^(blocks\.\d+)\.ffn\.net\.0\.proj\.", r"\1.ffn.0."),
    (r"^(blocks\.\d+)\.ffn\.net\.2\.", r"\1.ffn.2."),
    (r"^(blocks\.\d+)\.scale_shift_table$", r"\1.modulation"),
    (r"^proj_out\.", "head.head."),
    (r"^scale_shift_table$", "head.modulation"),
)
_DIFFUSERS_MARKERS = ("condition_embedder.", "scale_shift_table", "proj_out.")


# ----------------------------------------------------------------------------- reading files
def find_weight_files(path: str | Path) -> list[Path]:
    """The weight files of a checkpoint path.

    Parameters
    ----------
    path : str or Path
        A weight file, or a directory holding a sharded safetensors index, one safetensors file,
        or one torch file.

    Returns
    -------
    list of Path
        Shards in index order, or a single file.
    """
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"checkpoint not found: {path} (no such file or directory; "
                          f"downloads: docs/real_backbones.md)")
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise ConfigError(f"{path}: several safetensors indexes {[p.name for p in indexes]}; point at one file")
    if indexes:
        weight_map = json.loads(indexes[0].read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{indexes[0]}: no 'weight_map' in the safetensors index")
        shards = list(dict.fromkeys(weight_map.values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ConfigError(f"{path}: shards listed in {indexes[0].name} are missing: {missing}")
        return [path / s for s in shards]
    single = sorted(path.glob("*.safetensors"))
    if len(single) == 1:
        return single
    torch_files = sorted(p for p in path.iterdir() if p.suffix in TORCH_SUFFIXES)
    if not single and len(torch_files) == 1:
        return torch_files
    found = sorted(p.name for p in path.iterdir())
    raise ConfigError(
        f"{path}: cannot tell which weights to load (expected one *.safetensors.index.json, one *.safetensors "
        f"or one torch file); found {found[:20]}"
    )


def read_state_dict(path: str | Path, state_key: str | None = None, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, by name.

    Parameters
    ----------
    path : str or Path
        See :func:`find_weight_files`.
    state_key : str, optional
        For torch files holding several state dicts (``{"generator": {...}, "generator_ema": {...}}``):
        the one to use. Without it a file whose top level holds dicts of tensors is an error naming them.
    device : str
        Where safetensors tensors are materialised (``"cuda"`` loads shards straight to the GPU).

    Returns
    -------
    dict of str to Tensor
    """
    files = find_weight_files(path)
    if state_key is not None and all(f.suffix == ".safetensors" for f in files):
        raise ConfigError(f"{path}: state_key={state_key!r} only applies to torch files, not safetensors")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix == ".safetensors":
            part = load_file(str(file), device=device)
        else:
            part = _read_torch_file(file, state_key)
        clash = set(part) & set(state)
        if clash:
            raise ConfigError(f"{file}: keys {sorted(clash)[:LISTED]} also appear in an earlier shard")
        state.update(part)
    return state


def _read_torch_file(file: Path, state_key: str | None) -> dict[str, torch.Tensor]:
    try:
        try:
            obj = torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) format cannot be memory-mapped
            obj = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as err:  # pickle with non-tensor objects, truncated file, ...
        raise ConfigError(f"{file}: cannot read as a torch weights file (weights_only=True): {err}") from err
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{file}: expected a dict of tensors, got {type(obj).__name__}")
    nested = sorted(k for k, v in obj.items() if isinstance(v, Mapping))
    if state_key is not None:
        if state_key not in obj or not isinstance(obj[state_key], Mapping):
            raise ConfigError(f"{file}: no state dict under {state_key!r}; the file holds {sorted(obj)[:LISTED]}")
        obj = obj[state_key]
    elif nested:
        raise ConfigError(f"{file}: holds several state dicts {nested}; choose one with state_key")
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ConfigError(f"{file}: no tensors found")
    return tensors


# ----------------------------------------------------------------------------- key layouts
def strip_wrapper_prefixes(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove wrapper prefixes (``model.``, ``module.``, ``_orig_mod.``) that every key carries."""
    out = dict(state)
    changed = True
    while changed and out:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in out):
                out = {k[len(prefix):]: v for k, v in out.items()}
                changed = True
    return out


def is_diffusers_layout(keys) -> bool:
    """Whether keys follow diffusers' ``WanTransformer3DModel`` naming."""
    return any(k.startswith(_DIFFUSERS_MARKERS) or ".attn1." in k for k in keys)


def diffusers_to_wan(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a diffusers ``WanTransformer3DModel`` state dict to Wan names (tensors unchanged)."""
    out = {}
    for key, value in state.items():
        new = key
        for pattern, repl in DIFFUSERS_TO_WAN:
            new = re.sub(pattern, repl, new)
        out[new] = value
    return out


def to_wan_layout(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str]:
    """Any supported layout -> Wan names.

    Returns
    -------
    state : dict
    layout : {"wan", "diffusers"}
        The layout the keys were recognised as.
    """
    state = strip_wrapper_prefixes(state)
    if is_diffusers_layout(state):
        return diffusers_to_wan(state), "diffusers"
    return dict(state), "wan"


# ----------------------------------------------------------------------------- LoRA
def merge_lora(state: dict[str, torch.Tensor], lora: Mapping[str, torch.Tensor], alpha: float,
               source: str = "LoRA") -> int:
    """Merge PEFT LoRA deltas into a Wan-layout state dict, in place.

    ``W <- W + (alpha / r) * B @ A`` for every module with ``<module>.lora_A.weight`` ``[r, in]`` and
    ``<module>.lora_B.weight`` ``[out, r]``; the sum is computed in float32 and stored in ``W``'s dtype.

    Parameters
    ----------
    state : dict
        Base weights in Wan names (``blocks.0.self_attn.q.weight`` ...).
    lora : mapping
        PEFT keys, e.g. ``base_model.model.blocks.0.self_attn.q.lora_A.weight`` (an adapter name such as
        ``.default`` before ``.weight`` is accepted).
    alpha : float
        LoRA alpha (LongLive: 256 with rank 256, scale 1).
    source : str
        Named in errors.

    Returns
    -------
    int
        Number of merged modules.
    """
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    bad = []
    for key, value in lora.items():
        m = re.match(r"^(?:base_model\.model\.)?(?:model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$", key)
        if not m:
            bad.append(key)
            continue
        pairs.setdefault(m.group(1), {})[m.group(2)] = value
    if bad:
        raise ConfigError(f"{source}: keys that are not LoRA A/B weights: {bad[:LISTED]}")
    problems = []
    for module, ab in sorted(pairs.items()):
        target = f"{module}.weight"
        if set(ab) != {"A", "B"}:
            problems.append(f"{module}: has lora_{'/'.join(sorted(ab))} only")
        elif target not in state:
            problems.append(f"{module}: no base weight {target!r}")
        else:
            a, b, w = ab["A"], ab["B"], state[target]
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != tuple(w.shape):
                problems.append(f"{module}: A {tuple(a.shape)} and B {tuple(b.shape)} do not fit W {tuple(w.shape)}")
    if problems:
        raise ConfigError(f"{source}: {len(problems)} LoRA module(s) do not fit the base model: "
                          + "; ".join(problems[:LISTED]))
    for module, ab in pairs.items():
        target = f"{module}.weight"
        a, b = ab["A"].float(), ab["B"].float()
        w = state[target]
        state[target] = (w.float() + (alpha / a.shape[0]) * (b.to(w.device) @ a.to(w.device))).to(w.dtype)
    return len(pairs)


# ----------------------------------------------------------------------------- loading
def check_state_dict(module: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise :class:`ConfigError` naming every missing, unexpected and wrongly shaped key.

    Parameters
    ----------
    module : nn.Module
        The model the weights are for (may live on the meta device).
    state : mapping
        Weights in the module's names.
    source : str
        Where the weights came from (named in the message).
    """
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(expected) & set(state)
        if tuple(state[k].shape) != tuple(expected[k].shape)
    )
    if not (missing or unexpected or shapes):
        return
    parts = []
    for title, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)):
        if items:
            more = f" (+{len(items) - LISTED} more)" if len(items) > LISTED else ""
            parts.append(f"{len(items)} {title}: {items[:LISTED]}{more}")
    raise ConfigError(f"{source} does not fit the {type(module).__name__} config: " + "; ".join(parts))


def load_into(module: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Check, then load ``state`` into ``module`` by assignment (works for a meta-device module).

    Parameters take the checkpoint tensors themselves (their dtype and device); cast afterwards.
    """
    check_state_dict(module, state, source)
    module.load_state_dict(dict(state), strict=True, assign=True)
