"""TempDiff: keep the context blocks that changed most from one frame to the next, chosen once.

The authors' harness (its "patchification" selector, the paper's TempDiff): at the end of the
context, every latent frame is cut into a ``grid_rows x grid_cols`` grid of token blocks (LingBot's
30x52 token grid: 6x13 blocks of 5x4 = 20 tokens); each block of frame ``f`` is compared with the
same block of frame ``f + 1`` by the mean over its tokens of the cosine between their layer-1 keys
(all heads side by side), for every frame between the sink and the recent window; the ``k`` least
similar blocks over the whole context (1,657 in the paper's setting) are kept, with the sink and
recent frames. One selection for every layer and head; generated chunks are never pruned, unless
``update_each_chunk`` (the harness's option of that name, default off) chooses again after every
generated chunk among every stored frame between the sink and the recent window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from cmbench.cache import KVCache
from cmbench.methods.base import ChunkSignals, ScoredMethod
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import register


def split_bounds(length: int, parts: int) -> torch.Tensor:
    """Offsets ``[parts + 1]`` cutting ``length`` into ``parts`` near-equal ranges (larger first)."""
    sizes = torch.full((parts,), length // parts, dtype=torch.long)
    sizes[: length % parts] += 1
    return torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])


def block_index(token_rows: int, token_cols: int, grid_rows: int, grid_cols: int) -> torch.Tensor:
    """Block of every token position of a frame, ``long [token_rows * token_cols]`` (row-major blocks).

    The grid is capped by the token grid (a block holds at least one token) and cut into near-equal
    ranges when it does not divide it (LingBot 30x52 by 6x13: exact 5x4 blocks; the tiny model's 8x8
    by 6x8: blocks of 2 or 1 rows by one column).
    """
    rows, cols = min(grid_rows, token_rows), min(grid_cols, token_cols)
    row_of = torch.bucketize(torch.arange(token_rows), split_bounds(token_rows, rows)[1:], right=True)
    col_of = torch.bucketize(torch.arange(token_cols), split_bounds(token_cols, cols)[1:], right=True)
    return (row_of[:, None] * cols + col_of[None, :]).flatten()


def block_similarity(keys: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Mean key cosine of every block between consecutive frames.

    Parameters
    ----------
    keys : Tensor, shape ``[B, f + 1, T, H, D]``
        Keys of ``f + 1`` consecutive frames (one token's key is its ``H * D`` values).
    blocks : Tensor, shape ``[T]``, long
        Block of each token position (:func:`block_index`).

    Returns
    -------
    Tensor, shape ``[f, n_blocks]``, float32: pair ``i`` compares frame ``i`` with ``i + 1``; per token
    ``dot / (max(|a|, 1e-8) * max(|b|, 1e-8))``, mean over the batch and the block's tokens.
    """
    flat = keys.float().flatten(3)
    left, right = flat[:, :-1], flat[:, 1:]
    cosine = ((left * right).sum(-1) / (left.norm(dim=-1).clamp_min(1e-8) * right.norm(dim=-1).clamp_min(1e-8))).mean(0)
    n_blocks = int(blocks.max()) + 1
    sums = torch.zeros(cosine.shape[0], n_blocks, device=cosine.device).index_add_(1, blocks.to(cosine.device), cosine)
    return (sums / torch.bincount(blocks, minlength=n_blocks).to(cosine.device)).cpu()


@register
@dataclass
class TempDiff(ScoredMethod):
    """The ``k`` context blocks least similar to the same block in the next frame, chosen once at the
    end of the context, plus the sink and the recent window (``sink_chunks`` / ``recent_chunks``: 4
    latent frames each on chunk-4 backbones); the continuation stays dense.

    Each frame pair is scored as soon as its later frame is stored (a frame's keys never change after
    its ``t = 0`` pass, so this equals scoring the whole context at its end); the scores are the
    tokens' priorities (``-similarity``), which quota mode and bounded memory evict by.

    Parameters
    ----------
    k : int
        Blocks kept over the whole context (1,657: the paper's "1,657 cache entries").
    grid_rows, grid_cols : int
        Blocks per frame (6 x 13 on LingBot's 30 x 52 token grid), capped by the token grid.
    update_each_chunk : bool
        After every generated chunk, choose the ``k`` least similar blocks again among every stored
        frame between the sink and the recent window, generated frames included (a block dropped
        earlier is gone for good); off (the paper's TempDiff): the context is chosen once, the
        continuation stays dense.
    """

    name = "tempdiff"
    family = "eviction"
    description = ("the K context blocks (6x13 grid per frame) least similar to the next frame's same block "
                   "(layer-1 keys), chosen once at the end of the context; sink + recent kept, continuation dense")
    paper_title = "TempDiff, as described in DeCoPrune's baselines"
    # blocks kept over the whole context: fewer prune more (tiny model: 48 blocks a frame; LingBot: 78)
    knob = Knob("k", 1, 2**20, increasing=False, log=True, integer=True)

    knob_minimums: ClassVar[dict[str, float]] = {"k": 0, "grid_rows": 1, "grid_cols": 1}

    k: int = 1657
    grid_rows: int = 6
    grid_cols: int = 13
    update_each_chunk: bool = False

    def blocks(self, geometry) -> torch.Tensor:
        """Block of every token position of a frame, ``long [tokens_per_frame]``."""
        return block_index(geometry.token_rows, geometry.token_cols, self.grid_rows, self.grid_cols)

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        info, g = sig.chunk, sig.geometry
        T, blocks = g.tokens_per_frame, self.blocks(g)
        keys = cache.frame_keys(1 if cache.num_layers > 1 else 0, range(info.frame_start - 1, info.frame_end))
        if info.frame_start > 0 and keys is not None:  # pairs (f, f + 1) ending in this chunk: left frames scored
            sim = block_similarity(keys, blocks)  # [f, n_blocks]
            cache.mark_tokens(torch.arange((info.frame_start - 1) * T, (info.frame_end - 1) * T),
                              priority=-sim[:, blocks].flatten())
        if sig.phase == "context" and info.frame_end == sig.context_frames:
            self.select_context(cache, g, sig.context_frames)
        elif sig.phase == "generation" and self.update_each_chunk:
            self.select_context(cache, g, info.frame_end)

    def select_context(self, cache: KVCache, geometry, q0: int) -> None:
        """Keep flags of the first ``q0`` frames (the context, or with ``update_each_chunk`` everything
        stored so far): the sink, the recent frames and the ``k`` least similar stored blocks of the
        frames between them (ties: the earlier block)."""
        T, f = geometry.tokens_per_frame, geometry.chunk_frames
        sink, recent = min(self.sink_chunks * f, q0), max(q0 - self.recent_chunks * f, 0)
        gids = torch.arange(q0 * T)
        frame, blocks = gids // T, self.blocks(geometry)
        candidate = (frame >= sink) & (frame < recent)
        keep = ~candidate
        if bool(candidate.any()):  # block id: (frame - sink) * blocks per frame + block in the frame
            block = (frame - sink) * (int(blocks.max()) + 1) + blocks.repeat(q0)
            bank = cache.banks[0][0]  # every bank holds the same tokens and marks
            rows, index = bank.rows_of_gids(gids[candidate])  # stored candidates (all, unless budget-evicted)
            stored = block[candidate][index]
            sim = torch.full((int(block.max()) + 1,), math.inf)  # unstored blocks: never chosen first
            sim[stored] = -bank.field("priority")[rows]  # one value per block (its tokens share it)
            chosen = torch.zeros_like(sim, dtype=torch.bool)
            chosen[torch.argsort(sim, stable=True)[: min(self.k, len(stored.unique()))]] = True
            keep[candidate] = chosen[block[candidate]]
        cache.mark_tokens(gids, keep=keep)
