"""The sequence-parallel group and the Ulysses all-to-alls (torch.distributed, any backend: gloo on CPU).

A chunk's tokens are ``[B, L, ...]`` with ``L = f * T`` (``f`` latent frames of ``T`` tokens, frame-major).
Rank ``r`` of ``P`` holds the *sequence shard* ``[B, f * T / P, ...]``: tokens ``r T / P .. (r + 1) T / P - 1``
of every frame, so the DiT's per-frame modulation applies to a shard unchanged. Inside attention the
*head shard* is ``[B, L, H / P, D]``: every token, heads ``r H / P .. (r + 1) H / P - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cmbench.errors import ConfigError


def check_heads(num_heads: int, tokens_per_frame: int, size: int, where: str = "parallel.sequence") -> None:
    """Raise a one-line :class:`ConfigError` unless ``size`` ranks can split the heads and every frame's tokens."""
    if size < 1:
        raise ConfigError(f"{where}={size}: the number of ranks per model must be >= 1")
    if num_heads % size:
        raise ConfigError(f"{where}={size} does not divide the model's {num_heads} attention heads "
                          f"(each rank holds heads / {where} heads of the KV cache)")
    if tokens_per_frame % size:
        raise ConfigError(f"{where}={size} does not divide the {tokens_per_frame} tokens of a latent frame "
                          f"(each rank runs a 1/{size} slice of every frame)")


@dataclass(frozen=True)
class SequenceGroup:
    """The ranks that run one model together.

    Attributes
    ----------
    rank, size : int
        This rank's index in the group and the group's size ``P``.
    group : ProcessGroup or None
        The torch.distributed group (``None``: the default group).
    check_masks : bool
        Debug check: every keep / priority decision is compared across ranks by a checksum (raises on a
        difference); on in tests.
    """

    rank: int
    size: int
    group: Any = None
    check_masks: bool = False

    # ------------------------------------------------------------------ token shards
    def shard(self, x: torch.Tensor, frames: int, dim: int = 1) -> torch.Tensor:
        """This rank's slice of every frame's tokens: ``[..., f * T, ...] -> [..., f * T / P, ...]`` along ``dim``."""
        dim = dim % x.dim()
        per = x.shape[dim] // frames // self.size
        xf = x.unflatten(dim, (frames, self.size, per))
        return xf.select(dim + 1, self.rank).flatten(dim, dim + 1)

    def gather(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        """Every rank's shard back in token order: ``[B, f * T / P, C] -> [B, f * T, C]`` (on every rank)."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        b, ls, c = x.shape
        stacked = torch.stack(parts, 0).reshape(self.size, b, frames, ls // frames, c)
        return stacked.permute(1, 2, 0, 3, 4).reshape(b, frames * self.size * (ls // frames), c)

    # ------------------------------------------------------------------ the all-to-alls
    def to_heads(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        """Sequence shard to head shard: ``[B, f * T / P, H, D] -> [B, f * T, H / P, D]``."""
        b, ls, h, d = x.shape
        p = self.size
        send = x.reshape(b, ls, p, h // p, d).permute(2, 0, 1, 3, 4).contiguous()  # [P (to rank), B, Ls, H/P, D]
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)  # recv[i]: rank i's tokens, my heads
        recv = recv.reshape(p, b, frames, ls // frames, h // p, d).permute(1, 2, 0, 3, 4, 5)
        return recv.reshape(b, frames * p * (ls // frames), h // p, d)

    def to_tokens(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        """Head shard to sequence shard: ``[B, f * T, H / P, D] -> [B, f * T / P, H, D]``."""
        b, length, hl, d = x.shape
        p = self.size
        per = length // frames // p
        send = x.reshape(b, frames, p, per, hl, d).permute(2, 0, 1, 3, 4, 5).contiguous()  # [P (to rank), B, f, T/P, ...]
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)  # recv[i]: my tokens, rank i's heads
        return recv.permute(1, 2, 3, 0, 4, 5).reshape(b, frames * per, p * hl, d)

    # ------------------------------------------------------------------ reductions
    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's ``x`` (same shape on every rank) concatenated along ``dim`` in rank order."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim)

    def sum(self, value: int) -> int:
        """``value`` summed over the group."""
        t = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(t, group=self.group)
        return int(t[0])

    def sum_each(self, values: list[int]) -> list[int]:
        """Each of ``values`` (the same length on every rank) summed over the group."""
        t = torch.tensor(values, dtype=torch.long)
        dist.all_reduce(t, group=self.group)
        return [int(v) for v in t.tolist()]

    def sum_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (the same shape on every rank) summed elementwise over the group, as a new tensor on
        ``x``'s device."""
        out = x.clone()
        dist.all_reduce(out, group=self.group)
        return out

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` (any picklable value) on every rank of the group."""
        box = [obj]
        src = 0 if self.group is None else dist.get_global_rank(self.group, 0)  # torch >= 2.4 takes a global rank
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def check_same(self, what: str, *tensors: torch.Tensor | None) -> None:
        """With ``check_masks``: raise unless ``tensors`` are equal on every rank (compared by a checksum)."""
        if not self.check_masks:
            return
        digest = torch.zeros(2, dtype=torch.float64)
        for i, t in enumerate(x for x in tensors if x is not None):
            flat = t.detach().reshape(-1).double().cpu()
            weights = torch.arange(1, len(flat) + 1, dtype=torch.float64)
            digest += torch.stack([flat.sum() * (i + 1), (flat * weights).sum()])
        every = self.all_gather(digest[None], 0)
        if not bool((every == every[0]).all()):
            raise RuntimeError(f"sequence parallel: {what} differs across ranks (checksums {every.tolist()})")


class UlyssesAttention:
    """The DiT's attention backend on a rank: all-to-all to a head shard, the rank's cache, all-to-all back.

    Parameters
    ----------
    cache : KVCache
        This rank's cache (``heads / P`` heads; a :class:`~cmbench.parallel.cache.ShardedKVCache`).
    group : SequenceGroup
    """

    def __init__(self, cache, group: SequenceGroup) -> None:
        self.cache, self.group = cache, group

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q, k, v [B, f * T / P, H, D]`` (the rank's tokens, every head) -> output of the same shape."""
        info = self.cache.current
        if info is None:
            raise RuntimeError("no open chunk: call begin_chunk first")
        f = info.num_frames
        g = self.group
        out = self.cache.attend(layer, g.to_heads(q, f), g.to_heads(k, f), g.to_heads(v, f))
        return g.to_tokens(out, f)
