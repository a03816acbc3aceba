"""Inference precision of the causal DiT: bf16 weights with float32 islands, as Wan runs them.

Wan computes its timestep path in float32 (``time_embedding``, ``time_projection``, the
``modulation`` tables) and its LayerNorms in float32 (:class:`LayerNorm32` upcasts the input, so an
affine norm must keep float32 parameters). :func:`cast_for_inference` casts everything else to the
requested dtype, so no autocast context is needed and the result is the same on CPU and GPU.

``fp32_residual`` (a backbone property) adds LingBot World's float32 islands: its runtime adds every
gated branch to the residual stream inside a float32 autocast region (so the stream is float32 from the
first block on) and runs the output head, linear layer included, in float32. The DiT then carries
``x`` in float32 (:attr:`CausalWanDiT.residual_dtype`) and keeps ``head.head`` in float32. The
Self-Forcing family's runtimes cast the whole generator to bf16 and keep a bf16 residual stream.
"""

from __future__ import annotations

import torch
from torch import nn

from cmbench.backbones.dit import CausalWanDiT, LayerNorm32
from cmbench.errors import ConfigError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` / ``"bf16"`` / ``"float32"`` / ... -> a torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}")
    return DTYPES[name]


def float32_modules(dit: CausalWanDiT, fp32_residual: bool = False) -> list[nn.Module]:
    """Modules whose parameters stay float32: the timestep path and affine LayerNorms (and, with a
    float32 residual stream, the output head's linear layer)."""
    keep: list[nn.Module] = [dit.time_embedding, dit.time_projection]
    keep += [m for m in dit.modules() if isinstance(m, LayerNorm32) and m.elementwise_affine]
    if fp32_residual:
        keep.append(dit.head.head)
    return keep


def cast_for_inference(dit: CausalWanDiT, dtype: torch.dtype, device: str | torch.device | None = None,
                       fp32_residual: bool = False) -> CausalWanDiT:
    """Cast ``dit`` in place: ``dtype`` everywhere except float32 islands; optionally move it.

    Works on a meta-device model too (the loader and the memory planner read each parameter's target
    dtype from it before any weight exists).

    Parameters
    ----------
    dit : CausalWanDiT
    dtype : torch.dtype
        Compute dtype of the linear layers and of the cached keys/values (bf16 on GPUs).
    device : str or torch.device, optional
    fp32_residual : bool
        Carry the residual stream in float32 and keep the output head in float32 (LingBot World).

    Returns
    -------
    CausalWanDiT (the same object), in eval mode with gradients off.
    """
    dit.to(device=device, dtype=dtype)
    for module in float32_modules(dit, fp32_residual):
        module.float()
    for name, param in dit.named_parameters():
        if name.endswith("modulation"):
            param.data = param.data.float()
    dit.residual_dtype = torch.float32 if fp32_residual else None
    return dit.eval().requires_grad_(False)


def param_dtype(dit: CausalWanDiT) -> torch.dtype:
    """The compute dtype of ``dit`` (that of its patch embedding)."""
    return dit.patch_embedding.weight.dtype
