"""ForcingKV: static heads keep sink + recent; dynamic heads add the K least redundant patches.

A *patch* is a contiguous ``1 / patches_per_frame`` slice of a latent frame's tokens (row-major: on
LingBot's 30x52 token grid, 6 patches of 260 tokens = 5 token rows each; near-equal slices when the
frame does not divide evenly, e.g. 11/11/11/11/10/10 tokens of the tiny model's 8x8 grid). After
every chunk (context and continuation) the frame pairs ``(f - 1, f)`` ending in the chunk are scored
once, on layer 1's stored keys (the dynamic heads' keys side by side): a patch's similarity is the
mean over its tokens of the cosine between the token's key in ``f - 1`` and in ``f``, and the patch
of the *earlier* frame is the candidate. The ``k`` least similar candidates are kept: the previous
selection (while its frame is within ``history_chunks`` chunks before the recent window) competes
with the new pairs, and a patch once left out is never reconsidered. The selection is shared by every
layer's dynamic bank. This is the authors' harness (its ForcingKV update); see docs/protocol.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from cmbench.cache import Bank, ChunkInfo, HeadGroup, KVCache
from cmbench.errors import ConfigError
from cmbench.methods.base import ChunkSignals, ScoredMethod
from cmbench.methods.head_map import HeadMap
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import register


def patch_bounds(tokens_per_frame: int, patches: int) -> torch.Tensor:
    """Token offsets ``[P + 1]`` of a frame's contiguous patches: ``P = min(patches, tokens_per_frame)``
    near-equal slices, the larger first."""
    patches = min(patches, tokens_per_frame)
    sizes = torch.full((patches,), tokens_per_frame // patches, dtype=torch.long)
    sizes[: tokens_per_frame % patches] += 1
    return torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])


def adjacent_patch_similarity(keys: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Mean key cosine of each patch between consecutive frames.

    Parameters
    ----------
    keys : Tensor, shape ``[B, f + 1, T, H, D]``
        Keys of ``f + 1`` consecutive frames (heads side by side: one token's key is ``H * D`` values).
    bounds : Tensor, shape ``[P + 1]``
        Patch token offsets (:func:`patch_bounds`).

    Returns
    -------
    Tensor, shape ``[f, P]``, float32: pair ``i`` compares frame ``i`` with frame ``i + 1``; per token
    ``dot / (max(|a|, 1e-8) * max(|b|, 1e-8))``, mean over the batch and the patch's tokens.
    """
    flat = keys.float().flatten(3)  # [B, f+1, T, H*D]
    left, right = flat[:, :-1], flat[:, 1:]
    norms = left.norm(dim=-1).clamp_min(1e-8) * right.norm(dim=-1).clamp_min(1e-8)
    cosine = ((left * right).sum(-1) / norms).mean(0)  # [f, T]
    sizes = (bounds[1:] - bounds[:-1]).to(cosine.device)
    sums = torch.stack([cosine[:, a:b].sum(-1) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())], dim=1)
    return (sums / sizes).cpu()


@register
@dataclass
class ForcingKV(ScoredMethod):
    """Static heads: sink + recent window. Dynamic heads: also the ``k`` patches least similar to the
    same patch in the following frame, among the ``history_chunks`` chunks before the recent window.

    Parameters
    ----------
    head_map : str or None
        Head-map JSON (static / dynamic heads, used as given); ``None``: every head dynamic.
    layer_zero : {"streaming", "map"}
        ``"streaming"``: every head of layer 0 keeps the sink + recent window only (a static bank),
        whatever the head map says (the authors' harness: ``layer_zero_policy = "streaming"``);
        ``"map"``: layer 0 as the head map has it. A one-layer model keeps its layer dynamic.
    k : int
        Patches kept per dynamic head beyond the sink and recent window (LingBot: 256 patches of 260
        tokens, about 43 latent frames).
    history_chunks : int
        Candidates lie in the ``history_chunks`` chunks before the recent window.
    patches_per_frame : int
        Contiguous patches a latent frame is cut into (6, the authors' harness; at most one per token).
    """

    name = "forcingkv"
    family = "eviction"
    description = ("static heads: sink + recent; dynamic heads: + K patches (1/6 frame) with the lowest layer-1 key "
                   "cosine to the next frame")
    paper = "https://arxiv.org/abs/2605.09681"
    paper_title = "ForcingKV, arXiv 2605.09681"
    # patches kept per dynamic head: fewer prune more (at most history_chunks * frames * patches candidates)
    knob = Knob("k", 1, 2**16, increasing=False, log=True, integer=True)

    knob_minimums: ClassVar[dict[str, float]] = {"k": 0, "history_chunks": 0, "patches_per_frame": 1}

    head_map: str | None = None
    k: int = 256
    history_chunks: int = 32
    patches_per_frame: int = 6
    layer_zero: str = "streaming"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_zero not in ("streaming", "map"):
            raise ConfigError(f"{self.name}: layer_zero must be 'streaming' or 'map', got {self.layer_zero!r}")
        if self.recent_chunks < 1:
            raise ConfigError(f"{self.name}: needs recent_chunks >= 1 (the previous frame's keys must still be stored)")

    def layout(self, geometry) -> list[list[HeadGroup]]:
        static_size = self.window_size(geometry)
        largest = int((patch_bounds(geometry.tokens_per_frame, self.patches_per_frame).diff()).max())
        dyn_size = None if self.quota_mode else static_size + self.k * largest
        if self.max_history_tokens is not None:
            dyn_size = self.max_history_tokens if dyn_size is None else min(dyn_size, self.max_history_tokens)
        if self.head_map:
            hmap = HeadMap.load_for(self.head_map, geometry, self.name)
        else:
            hmap = HeadMap.all_dynamic(geometry.num_layers, geometry.num_heads)
        if self.layer_zero == "streaming" and geometry.num_layers > 1:
            hmap = hmap.with_static_layer(0)
        return hmap.layout(dyn_size, static_size)

    def budgeted(self, bank: Bank) -> bool:
        return bank.role == "dynamic"

    def reference_layer(self, geometry) -> int:
        """Layer 1 (layer 0 in a one-layer model), or the next layer that has dynamic heads (read from the
        method's layout of every head, so every rank of a split model, holding only some heads, picks the
        same layer)."""
        layout = self.layout(geometry)
        start = 1 if len(layout) > 1 else 0
        for layer in [*range(start, len(layout)), *range(start)]:
            if any(g.role == "dynamic" for g in layout[layer]):
                return layer
        return start

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        info, g = sig.chunk, sig.geometry
        T = g.tokens_per_frame
        bounds = patch_bounds(T, self.patches_per_frame)
        P = len(bounds) - 1
        dynamic = self.scored_banks(cache)
        if not dynamic:
            return
        keys = cache.frame_keys(self.reference_layer(g), range(info.frame_start - 1, info.frame_end), "dynamic")
        new_ids = torch.zeros(0, dtype=torch.long)
        new_sim = torch.zeros(0)
        if info.frame_start > 0 and keys is not None:
            new_sim = adjacent_patch_similarity(keys, bounds).flatten()
            new_ids = torch.arange((info.frame_start - 1) * P, (info.frame_end - 1) * P)
        old_ids, old_sim = self.selected_patches(dynamic[0], bounds)
        start = info.frame_end - (self.recent_chunks + self.history_chunks) * g.chunk_frames
        in_window = old_ids >= start * P
        ids = torch.cat([old_ids[in_window], new_ids])
        sim = torch.cat([old_sim[in_window], new_sim])
        order = torch.argsort(sim, stable=True)[: self.k]  # ids ascend, so ties keep the earlier patch
        chosen = torch.isin(torch.cat([old_ids, new_ids]), ids[order])
        gids, index = patch_tokens(torch.cat([old_ids, new_ids]), bounds, T)
        cache.mark_tokens(gids, keep=chosen[index], priority=-torch.cat([old_sim, new_sim])[index], banks=dynamic)

    @staticmethod
    def selected_patches(bank: Bank, bounds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The current selection: patch ids ``frame * P + patch`` (ascending) and their similarities."""
        rows = (bank.field("keep") & torch.isfinite(bank.field("priority"))).nonzero().squeeze(1)
        patch = torch.bucketize(bank.field("pos")[rows], bounds[1:], right=True)
        ids = bank.field("frame")[rows] * (len(bounds) - 1) + patch
        unique, counts = torch.unique_consecutive(ids, return_counts=True)  # rows ascend by token id
        return unique, -bank.field("priority")[rows][counts.cumsum(0) - counts]

    def rule(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        keep = self.protected(bank, newest)
        if bank.role == "static":
            return keep
        return keep | (bank.field("keep") & torch.isfinite(bank.field("priority")))


def patch_tokens(ids: torch.Tensor, bounds: torch.Tensor, tokens_per_frame: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global token ids of patches ``ids`` (``frame * P + patch``) and, per token, its patch's index in
    ``ids``; sorted by token id.

    Returns
    -------
    (Tensor ``[m]`` long, Tensor ``[m]`` long)
    """
    P = len(bounds) - 1
    frame, patch = ids // P, ids % P
    starts = frame * tokens_per_frame + bounds[patch]
    sizes = bounds[patch + 1] - bounds[patch]
    index = torch.repeat_interleave(torch.arange(len(ids)), sizes)
    offsets = torch.arange(len(index)) - torch.repeat_interleave(sizes.cumsum(0) - sizes, sizes)
    gids = starts[index] + offsets
    order = torch.argsort(gids)
    return gids[order], index[order]
