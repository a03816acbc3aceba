"""Softmax attention over keys that arrive in blocks: one block's partial result at a time, combined by
their log-sum-exp (the online softmax of flash attention).

A quantized bank decodes its history block by block (:meth:`~cmbench.cache.quantized_bank.QuantizedBank.blocks`)
so that an attention call never holds the full-precision history: at most two decoded blocks, this call's
output and a running ``[B, Hg, L]`` log-sum-exp. A single block is plain scaled-dot-product attention.

For each block ``i`` with output ``o_i`` and log-sum-exp ``s_i`` of its logits, the attention over all keys is
``sum_i exp(s_i - s) o_i`` with ``s = logsumexp_i s_i``; the running form rescales what is accumulated
whenever ``s`` grows.

A block's ``o_i`` and ``s_i`` come from a fused kernel that returns the log-sum-exp (:func:`kernel`): torch's
CPU flash attention, CUDA's flash attention or its memory-efficient attention (which takes the bias and
float32). ``flex_attention(..., return_lse=True)`` returns it on both devices too, but uncompiled it forms the
block's whole logits, and compiled it is built again for each new block length: not used.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
import torch.nn.functional as F

_FUSED: Any = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH: Any = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None)
_EFFICIENT: Any = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None)
LOGIT_BYTES = 64 * 2**20
"""Most bytes of float32 logits :func:`partial` forms at once where no fused kernel returns the log-sum-exp."""
BIAS_ALIGN = 16
"""The memory-efficient CUDA kernel reads a bias whose rows start on multiples of this many elements."""


def attention(q: torch.Tensor, blocks: Iterable[tuple[torch.Tensor, torch.Tensor]],
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention of ``q`` over the keys of every block (no mask between queries and keys).

    Parameters
    ----------
    q : Tensor, shape ``[B, L, Hg, D]``
    blocks : iterable of ``(k, v)``
        ``k, v [B, n_i, Hg, D]`` in ``q``'s dtype and device; at least one block.
    bias : Tensor, shape ``[sum n_i]``, float32, optional
        Added to each key's logit (keys in block order).

    Returns
    -------
    Tensor, shape ``[B, L, Hg, D]`` in ``q``'s dtype: attention over the concatenated blocks.
    """
    qt = q.transpose(1, 2)
    it = iter(blocks)
    k, v = next(it, (None, None))
    if k is None or v is None:
        raise ValueError("attention needs at least one block of keys")
    following = next(it, None)
    if following is None:
        mask = None if bias is None else bias.to(device=q.device, dtype=q.dtype).expand(*qt.shape[:3], k.shape[1])
        return F.scaled_dot_product_attention(qt, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask).transpose(1, 2)
    out, total = partial(qt, k, v, None if bias is None else bias[: k.shape[1]])
    done = k.shape[1]
    del k, v  # at most two decoded blocks alive: the one attended to and the next
    while following is not None:
        k, v = following
        following = None
        o, s = partial(qt, k, v, None if bias is None else bias[done : done + k.shape[1]])
        done += k.shape[1]
        del k, v
        grown = torch.logaddexp(total, s)
        out = out * torch.exp(total - grown).unsqueeze(-1) + o * torch.exp(s - grown).unsqueeze(-1)
        total = grown
        following = next(it, None)
    return out.to(q.dtype).transpose(1, 2)


def kernel(device: torch.device, dtype: torch.dtype, head_dim: int, biased: bool) -> str:
    """The kernel :func:`partial` computes a block with: ``"cpu"`` (torch's fused CPU flash attention),
    ``"flash"`` (CUDA flash attention: half precision, no bias), ``"efficient"`` (CUDA memory-efficient
    attention: float32 too, a bias) or ``"logits"`` (float32 logits, a few queries at a time), each the first
    torch provides that takes the block."""
    if device.type == "cpu" and _FUSED is not None:
        return "cpu"
    if device.type == "cuda" and head_dim % 8 == 0:
        if _FLASH is not None and not biased and dtype in (torch.float16, torch.bfloat16) and head_dim <= 256:
            return "flash"
        if _EFFICIENT is not None and dtype in (torch.float16, torch.bfloat16, torch.float32):
            return "efficient"
    return "logits"


def aligned_bias(bias: torch.Tensor, qt: torch.Tensor, n: int) -> torch.Tensor:
    """``bias [n]`` as the fused kernels' mask ``[B, Hg, L, n]`` in ``qt``'s dtype and device: one row, read by
    every query, held in a buffer padded to :data:`BIAS_ALIGN` elements."""
    row = torch.zeros(-(-n // BIAS_ALIGN) * BIAS_ALIGN, dtype=qt.dtype, device=qt.device)
    row[:n] = bias
    return row[:n].expand(*qt.shape[:3], n)


def partial(qt: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``qt [B, Hg, L, D]`` over one block and the log-sum-exp of its logits.

    Parameters
    ----------
    qt : Tensor, shape ``[B, Hg, L, D]`` (queries, heads first)
    k, v : Tensor, shape ``[B, n, Hg, D]``
    bias : Tensor, shape ``[n]``, float32, optional

    Returns
    -------
    out : Tensor, shape ``[B, Hg, L, D]``, float32
    lse : Tensor, shape ``[B, Hg, L]``, float32: ``logsumexp`` over the block's keys of ``q.k / sqrt(D) + bias``.

    A fused kernel computes both where one takes the block (:func:`kernel`: torch's CPU flash attention; on
    CUDA flash attention, or memory-efficient attention with a bias or in float32); elsewhere the block's
    logits are formed in float32, ``[B, Hg, rows, n]``, for ``rows`` queries at a time: at most
    :data:`LOGIT_BYTES`.
    """
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    B, Hg, L, D = qt.shape
    how = kernel(qt.device, qt.dtype, D, bias is not None)
    if how == "cpu":
        mask = None if bias is None else bias.to(qt.dtype).expand(*qt.shape[:3], k.shape[1])
        out, lse = _FUSED(qt, kt, vt, 0.0, False, attn_mask=mask)
        return out.float(), lse.float()
    if how == "flash":
        out, lse = _FLASH(qt, kt, vt)[:2]
        return out.float(), lse.float()
    if how == "efficient":
        mask = None if bias is None else aligned_bias(bias, qt, k.shape[1])
        out, lse = _EFFICIENT(qt, kt, vt, mask, True)[:2]
        return out.float(), lse[:, :, :L].float()  # the kernel pads its log-sum-exp's query rows
    rows = max(1, LOGIT_BYTES // (4 * B * Hg * max(1, k.shape[1])))
    keys, values = kt.float().transpose(-1, -2), vt.float()
    outs, lses = [], []
    for start in range(0, L, rows):
        logits = torch.matmul(qt[:, :, start : start + rows].float(), keys) / math.sqrt(D)
        if bias is not None:
            logits = logits + bias.to(logits.device)
        lse = torch.logsumexp(logits, dim=-1)
        outs.append(torch.matmul(torch.exp(logits - lse.unsqueeze(-1)), values))
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)
