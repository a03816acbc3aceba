"""Attention statistics on request: how much attention each head puts on each source frame.

SDPA does not return attention weights, so while a :class:`AttentionStats` recorder is active the
cache recomputes the softmax explicitly, one head and one block of queries at a time: the float32
logits never exceed :data:`BLOCK_BYTES` (at LingBot 14B's one-minute context, all heads' logits of one
layer would be tens of GB). Keys may arrive in blocks (a quantized bank decodes its history a block of
rows at a time): then the softmax's normaliser is found in a first pass over the blocks and each block's
share of it in a second, so no more than one decoded block is needed at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Iterable, Iterator

import torch

BLOCK_BYTES = 256 * 2**20  # float32 logits computed at once (one head, a block of queries, a block of keys)

KeyBlock = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]
"""One block of keys ``[B, n, Hg, D]``, the source frame of each ``[n]`` (long) and an optional per-key logit
bias ``[n]`` (float32)."""


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

    def of(self, q: torch.Tensor, blocks: Callable[[], Iterable[KeyBlock]]) -> torch.Tensor:
        """Mass per frame ``[Hg, F]`` of one bank's call (:func:`blocked_frame_mass` over the chosen key frames).

        Parameters
        ----------
        q : Tensor, shape ``[B, L, Hg, D]``
        blocks : callable
            Returns the call's keys as :data:`KeyBlock` s in key order (history, then the current chunk); called
            once per pass over them (twice when there is more than one block).
        """
        if self.key_frames is None:
            return blocked_frame_mass(q, blocks, self.num_frames)
        wanted = torch.tensor(self.key_frames)

        def chosen() -> Iterator[KeyBlock]:
            for keys, frames, bias in blocks():
                keep = torch.isin(frames, wanted)
                yield keys[:, keep.to(keys.device)], frames[keep], None if bias is None else bias[keep]

        return blocked_frame_mass(q, chosen, self.num_frames)

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
    b, L, hg, _ = q.shape
    per_key = torch.zeros(hg, k.shape[1], dtype=torch.float32, device=q.device)
    for h, _, logits in _logits(q, k, bias, block_bytes):
        per_key[h] += logits.softmax(dim=-1).sum(dim=(0, 1))
    return _binned(per_key / (b * L), key_frames, num_frames)


def blocked_frame_mass(q: torch.Tensor, blocks: Callable[[], Iterable[KeyBlock]], num_frames: int,
                       block_bytes: int = BLOCK_BYTES) -> torch.Tensor:
    """:func:`frame_mass` over keys given in blocks, holding one block's keys at a time.

    One block is :func:`frame_mass` itself. With more, a first pass over the blocks accumulates each query's
    log-sum-exp ``s`` of its logits over every key; a second adds up ``exp(logit - s)``, each key's softmax
    weight, per frame.

    Parameters
    ----------
    q : Tensor, shape ``[B, L, Hg, D]``
    blocks : callable
        Returns the keys as :data:`KeyBlock` s ``(k [B, n_i, Hg, D], frames [n_i], bias [n_i] or None)``; called
        once per pass (a block is read, then let go).
    num_frames, block_bytes :
        As :func:`frame_mass` (``block_bytes`` bounds the logits of one head, some queries, one block).

    Returns
    -------
    Tensor, shape ``[Hg, F]``, float32 on the CPU: mean over batch and queries; rows sum to 1.
    """
    it = iter(blocks())
    first = next(it, None)
    if first is None:
        raise ValueError("attention statistics need at least one block of keys")
    following = next(it, None)
    if following is None:
        k, frames, bias = first
        return frame_mass(q, k, frames, num_frames, block_bytes, bias)
    b, L, hg, _ = q.shape
    lse = torch.full((hg, b, L), -math.inf, dtype=torch.float32, device=q.device)
    for k, _, bias in chain((first, following), it):
        for h, start, logits in _logits(q, k, bias, block_bytes):
            part = lse[h, :, start : start + logits.shape[1]]
            part.copy_(torch.logaddexp(part, logits.logsumexp(dim=-1)))
    del first, following, it
    out = torch.zeros(hg, num_frames, dtype=torch.float32)
    for k, frames, bias in blocks():
        per_key = torch.zeros(hg, k.shape[1], dtype=torch.float32, device=q.device)
        for h, start, logits in _logits(q, k, bias, block_bytes):
            per_key[h] += torch.exp(logits - lse[h, :, start : start + logits.shape[1], None]).sum(dim=(0, 1))
        out += _binned(per_key / (b * L), frames, num_frames)
    return out


def _logits(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None,
            block_bytes: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Float32 logits ``q.k / sqrt(D) + bias`` of one head and a block of queries at a time.

    Parameters
    ----------
    q : Tensor, shape ``[B, L, Hg, D]``
    k : Tensor, shape ``[B, N, Hg, D]``
    bias : Tensor, shape ``[N]``, optional

    Yields
    ------
    h, start, logits : the head, the first query, and ``[B, rows, N]`` float32 (``rows = query_block(B, N,
    block_bytes)``, fewer at the end).
    """
    b, L, hg, d = q.shape
    scale = 1.0 / math.sqrt(d)
    rows = query_block(b, k.shape[1], block_bytes)
    shift = None if bias is None else bias.to(device=q.device, dtype=torch.float32)  # float32 logits whatever its dtype
    for h in range(hg):
        kt = k[:, :, h].float().transpose(-1, -2)  # [B, D, N]: one head's keys in float32
        for start in range(0, L, rows):
            logits = torch.matmul(q[:, start : start + rows, h].float(), kt) * scale
            yield h, start, logits if shift is None else logits + shift


def _binned(per_key: torch.Tensor, key_frames: torch.Tensor, num_frames: int) -> torch.Tensor:
    """``[Hg, N]`` per-key mass summed per source frame: ``[Hg, F]`` float32 on the CPU."""
    out = torch.zeros(per_key.shape[0], num_frames, dtype=torch.float32)
    return out.index_add_(1, key_frames.cpu(), per_key.cpu())
