"""Read DiT checkpoints from disk and map their key layouts onto :class:`CausalWanDiT`.

:class:`~cmbench.backbones.dit.CausalWanDiT` uses the original Wan parameter names (and LingBot's
camera names), so a checkpoint in that layout loads key by key. This module handles what is around
it:

- files: a directory with a sharded ``*.safetensors.index.json``, a single ``.safetensors``, or a
  ``torch.save`` file (``.pt`` / ``.pth`` / ``.bin``) whose dict may nest the weights under a key
  such as ``generator`` / ``generator_ema`` (Self-Forcing, Causal Forcing, LongLive); opened lazily
  (:func:`open_state_dict`: safetensors tensors are :class:`LazyTensor` handles read from the
  memory-mapped file one at a time, torch files are memory-mapped), so a loader can cast and move
  the weights tensor by tensor without ever holding the whole checkpoint twice;
- wrapper prefixes: ``model.`` (Self-Forcing's ``WanDiffusionWrapper.model``), ``module.``,
  ``_orig_mod.``, stripped when every key carries them, and FSDP's ``_fsdp_wrapped_module.`` infix,
  removed wherever it appears in a key (as the Self-Forcing family's own loaders do for checkpoints
  saved from FSDP-wrapped generators);
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
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, TypeVar

import torch
from safetensors import safe_open
from torch import nn

from cmbench.errors import ConfigError

WRAPPER_PREFIXES = ("model.", "module.", "_orig_mod.")
WRAPPER_INFIXES = ("_fsdp_wrapped_module.",)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
LISTED = 12  # keys named per category in an error message

SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}

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
@dataclass(frozen=True)
class LazyTensor:
    """One tensor of a safetensors file, not read yet (shape and dtype come from the file's header).

    Attributes
    ----------
    file : Path
    key : str
        The tensor's name in the file.
    shape : tuple of int
    dtype : torch.dtype
        As stored.
    """

    file: Path
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()

    def load(self) -> torch.Tensor:
        """The tensor, read from the memory-mapped file into host memory (only this one)."""
        with safe_open(str(self.file), framework="pt", device="cpu") as f:
            return f.get_tensor(self.key)


WeightLike = torch.Tensor | LazyTensor
V = TypeVar("V")


def materialise(value: WeightLike) -> torch.Tensor:
    """A checkpoint entry as a tensor (a :class:`LazyTensor` is read now)."""
    return value.load() if isinstance(value, LazyTensor) else value


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


def open_state_dict(path: str | Path, state_key: str | None = None) -> dict[str, WeightLike]:
    """Every tensor of a checkpoint, by name, without reading the weights yet.

    Parameters
    ----------
    path : str or Path
        See :func:`find_weight_files`.
    state_key : str, optional
        For torch files holding several state dicts (``{"generator": {...}, "generator_ema": {...}}``):
        the one to use. Without it a file whose top level holds dicts of tensors is an error naming them.

    Returns
    -------
    dict of str to LazyTensor (safetensors) or Tensor (torch files, memory-mapped where the format
    allows)
    """
    files = find_weight_files(path)
    if state_key is not None and all(f.suffix == ".safetensors" for f in files):
        raise ConfigError(f"{path}: state_key={state_key!r} only applies to torch files, not safetensors")
    state: dict[str, WeightLike] = {}
    for file in files:
        part = _open_safetensors(file) if file.suffix == ".safetensors" else _read_torch_file(file, state_key)
        clash = set(part) & set(state)
        if clash:
            raise ConfigError(f"{file}: keys {sorted(clash)[:LISTED]} also appear in an earlier shard")
        state.update(part)
    return state


def read_state_dict(path: str | Path, state_key: str | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, by name, read into host memory (see :func:`open_state_dict`)."""
    return {k: materialise(v) for k, v in open_state_dict(path, state_key).items()}


def _open_safetensors(file: Path) -> dict[str, WeightLike]:
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            out: dict[str, WeightLike] = {}
            for key in f.keys():
                meta = f.get_slice(key)
                dtype = meta.get_dtype()
                if dtype not in SAFETENSORS_DTYPES:
                    raise ConfigError(f"{file}: tensor {key!r} has dtype {dtype}, which CMBench does not read")
                out[key] = LazyTensor(file, key, tuple(int(d) for d in meta.get_shape()), SAFETENSORS_DTYPES[dtype])
            return out
    except ConfigError:
        raise
    except Exception as err:  # truncated or foreign file
        raise ConfigError(f"{file}: cannot read as safetensors: {err}") from err


def _read_torch_file(file: Path, state_key: str | None) -> dict[str, WeightLike]:
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
    tensors: dict[str, WeightLike] = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ConfigError(f"{file}: no tensors found")
    return tensors


# ----------------------------------------------------------------------------- key layouts
def strip_wrapper_infixes(state: Mapping[str, V]) -> dict[str, V]:
    """Remove FSDP's ``_fsdp_wrapped_module.`` wherever it appears in a key (values unchanged)."""
    out: dict[str, V] = {}
    for key, value in state.items():
        for infix in WRAPPER_INFIXES:
            key = key.replace(infix, "")
        if key in out:
            raise ConfigError(f"checkpoint keys collide after removing {WRAPPER_INFIXES}: {key!r} appears twice")
        out[key] = value
    return out


def strip_wrapper_prefixes(state: Mapping[str, V]) -> dict[str, V]:
    """Remove FSDP's ``_fsdp_wrapped_module.`` anywhere in a key, then the wrapper prefixes (``model.``,
    ``module.``, ``_orig_mod.``) that every key carries."""
    out = strip_wrapper_infixes(state)
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


def diffusers_to_wan(state: Mapping[str, V]) -> dict[str, V]:
    """Rename a diffusers ``WanTransformer3DModel`` state dict to Wan names (tensors unchanged)."""
    out = {}
    for key, value in state.items():
        new = key
        for pattern, repl in DIFFUSERS_TO_WAN:
            new = re.sub(pattern, repl, new)
        out[new] = value
    return out


def to_wan_layout(state: Mapping[str, V]) -> tuple[dict[str, V], str]:
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
def merge_lora(state: dict[str, WeightLike], lora: Mapping[str, WeightLike], alpha: float,
               source: str = "LoRA") -> int:
    """Merge PEFT LoRA deltas into a Wan-layout state dict, in place.

    ``W <- W + (alpha / r) * B @ A`` for every module with ``<module>.lora_A.weight`` ``[r, in]`` and
    ``<module>.lora_B.weight`` ``[out, r]``; the sum is computed in float32 and stored in ``W``'s dtype.

    Parameters
    ----------
    state : dict
        Base weights in Wan names (``blocks.0.self_attn.q.weight`` ...), tensors or :class:`LazyTensor`;
        the merged entries become tensors.
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
    pairs: dict[str, dict[str, WeightLike]] = {}
    bad = []
    for key, value in strip_wrapper_infixes(lora).items():
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
            fits = len(a.shape) == 2 and len(b.shape) == 2 and a.shape[0] == b.shape[1]
            if not fits or (b.shape[0], a.shape[1]) != tuple(w.shape):
                problems.append(f"{module}: A {tuple(a.shape)} and B {tuple(b.shape)} do not fit W {tuple(w.shape)}")
    if problems:
        raise ConfigError(f"{source}: {len(problems)} LoRA module(s) do not fit the base model: "
                          + "; ".join(problems[:LISTED]))
    for module, ab in pairs.items():
        target = f"{module}.weight"
        a, b = materialise(ab["A"]).float(), materialise(ab["B"]).float()
        w = materialise(state[target])
        state[target] = (w.float() + (alpha / a.shape[0]) * (b.to(w.device) @ a.to(w.device))).to(w.dtype)
    return len(pairs)


# ----------------------------------------------------------------------------- loading
def check_state_dict(module: nn.Module, state: Mapping[str, WeightLike], source: str) -> None:
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


def load_into(module: nn.Module, state: Mapping[str, WeightLike], source: str,
              device: str | torch.device = "cpu") -> None:
    """Check, then fill ``module``'s parameters from ``state``, one tensor at a time.

    ``module`` may live on the meta device (built there and cast, so every parameter already has its
    target dtype): each checkpoint tensor is read (a :class:`LazyTensor` from its memory-mapped file),
    cast to that parameter's dtype, moved to ``device`` and assigned, before the next one is read. Peak
    memory is the model in its final dtype plus one checkpoint tensor, never the checkpoint twice.

    Parameters
    ----------
    module : nn.Module
        With parameters only (no buffers), in their target dtypes.
    state : mapping
        Weights in the module's names (tensors or :class:`LazyTensor`).
    source : str
        Named in errors.
    device : str or torch.device
    """
    check_state_dict(module, state, source)
    buffers = [name for name, _ in module.named_buffers()]
    if buffers:
        raise ConfigError(f"{source}: {type(module).__name__} has buffers {buffers[:LISTED]}; load_into fills parameters")
    for name, param in list(module.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        target = module.get_submodule(owner) if owner else module
        value = materialise(state[name]).to(device=device, dtype=param.dtype)
        target._parameters[leaf] = nn.Parameter(value, requires_grad=param.requires_grad)
