"""Attention statistics on request: how much attention each head puts on each source frame.

SDPA does not return attention weights, so while a :class:`AttentionStats` recorder is active the
cache recomputes the softmax explicitly, one head and one block of queries at a time: the float32
logits never exceed :data:`BLOCK_BYTES` (at LingBot 14B's one-minute context, all heads' logits of one
layer would be tens of GB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

BLOCK_BYTES = 256 * 2**20  # float32 logits computed at once (one head, a block of queries, all keys)


@dataclass
class AttentionStats:
    """Attention mass per source latent frame, filled by :meth:`KVCache.record_attention`.

    Attributes
    ----------
    mass : dict[int, Tensor]
        ``layer -> [H, F]`` (float32, CPU): mean over batch and queries of the attention weight that
        head ``h`` puts on keys of absolute latent frame ``f`` (history and current chunk), for the
        latest ``attend`` call of that layer while recording. Rows sum to 1.
    num_frames : int
        ``F``: frames ``0 .. F-1`` (the end of the chunk being denoised).
    key_frames : tuple of int or None
        Only keys of these source frames enter the softmax (renormalised over them); ``None``: all.
    """

    num_frames: int
    key_frames: tuple[int, ...] | None = None
    mass: dict[int, torch.Tensor] = field(default_factory=dict)

    def of(self, q: torch.Tensor, keys: torch.Tensor, frames: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
        """Mass per frame ``[Hg, F]`` of one bank's call (:func:`frame_mass` over the chosen key frames).

        Parameters
        ----------
        q : Tensor, shape ``[B, L, Hg, D]``
        keys : Tensor, shape ``[B, N, Hg, D]``
        frames : Tensor, shape ``[N]``, long: source frame of each key.
        bias : Tensor, shape ``[N]``, optional: added to each key's logit (a merged row's ``log(count)``).
        """
        if self.key_frames is not None:
            chosen = torch.isin(frames, torch.tensor(self.key_frames, dtype=frames.dtype))
            keys, frames = keys[:, chosen.to(keys.device)], frames[chosen]
            bias = None if bias is None else bias[chosen]
        return frame_mass(q, keys, frames, self.num_frames, bias=bias)

    def stacked(self) -> torch.Tensor:
        """All recorded layers, ``[num_layers_recorded, H, F]`` in layer order."""
        if not self.mass:
            raise RuntimeError("no attention was recorded (no attend call while recording)")
        return torch.stack([self.mass[layer] for layer in sorted(self.mass)])


def query_block(batch: int, keys: int, block_bytes: int = BLOCK_BYTES) -> int:
    """Queries of one head whose float32 logits over ``keys`` keys fit ``block_bytes`` (at least 1)."""
    return max(1, block_bytes // (4 * batch * max(1, keys)))


def frame_mass(q: torch.Tensor, k: torch.Tensor, key_frames: torch.Tensor, num_frames: int,
               block_bytes: int = BLOCK_BYTES, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Mean softmax attention mass per key frame.

    Parameters
    ----------
    q : Tensor, shape ``[B, L, Hg, D]``
        Queries.
    k : Tensor, shape ``[B, N, Hg, D]``
        Keys attended to (history then current chunk).
    key_frames : Tensor, shape ``[N]``, long
        Source latent frame of each key.
    num_frames : int
        Number of frame bins ``F`` (every entry of ``key_frames`` is below it).
    block_bytes : int
        Most bytes of float32 logits held at once (one head, ``query_block`` queries, all ``N`` keys).
    bias : Tensor, shape ``[N]``, optional
        Added to each key's logit before the softmax (a merged row's ``log(count)``, as attention adds it).

    Returns
    -------
    Tensor, shape ``[Hg, F]``, float32 on the CPU: mean over batch and queries; rows sum to 1.
    """
    b, L, hg, d = q.shape
    per_key = torch.zeros(hg, k.shape[1], dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(d)
    rows = query_block(b, k.shape[1], block_bytes)
    shift = 0.0 if bias is None else bias.to(device=q.device, dtype=torch.float32)
    for h in range(hg):
        kt = k[:, :, h].float().transpose(-1, -2)  # [B, D, N]: one head's keys in float32
        for start in range(0, L, rows):
            logits = torch.matmul(q[:, start : start + rows, h].float(), kt) * scale + shift  # [B, rows, N]
            per_key[h] += logits.softmax(dim=-1).sum(dim=(0, 1))
    per_key = per_key.cpu() / (b * L)
    out = torch.zeros(hg, num_frames, dtype=torch.float32)
    return out.index_add_(1, key_frames.cpu(), per_key)
