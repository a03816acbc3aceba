"""TempCache: merge near-duplicate keys across frames into one row whose logit carries ``log(count)``.

TempCache (arXiv 2602.01801) bounds cache growth by temporal correspondence: a cached key that
nearly repeats a key of an earlier frame is folded into it. Here the correspondence is the same
spatial token: when a chunk leaves the recent window, each of its rows is compared, frame by frame,
with the row that currently stands for the same in-frame position (the latest earlier row of that
position still stored: a row that absorbed others keeps its own key, so a run of repeats is always
compared with its first key, never a drifting average). When the cosine similarity of the two keys,
taken over the bank's heads and channels side by side and the lowest over the batch, is at least
``threshold``, the later row is merged into the earlier one (:meth:`KVCache.merge`: values averaged by
count, counts added, ``log(count)`` added to the row's attention logit); otherwise the later row becomes
its position's representative. The paper finds the correspondence by approximate nearest-neighbour
search over the earlier keys; the same position is the exact, search-free correspondence of a static
camera and what the keys' RoPE makes closest (a moved token is compared with a differently rotated key).

Keys are compared as stored, after RoPE: the merged row keeps the earlier key's rotation, so the
cosine bounds the logit error the merge introduces. For identical keys the merge is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from cmbench.cache import Bank, ChunkInfo, KVCache
from cmbench.methods.base import ChunkSignals, Method
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import register


def key_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of paired rows' keys, the lowest over the batch.

    Parameters
    ----------
    a, b : Tensor, shape ``[B, m, Hg, D]``
        Keys of ``m`` row pairs (one row's key is its ``Hg * D`` values).

    Returns
    -------
    Tensor, shape ``[m]``, float32 on the CPU: per pair ``dot / (max(|a|, 1e-12) * max(|b|, 1e-12))``,
    minimum over the batch.
    """
    x, y = a.float().flatten(2), b.float().flatten(2)
    cos = (x * y).sum(-1) / (x.norm(dim=-1).clamp_min(1e-12) * y.norm(dim=-1).clamp_min(1e-12))
    return cos.amin(0).cpu()


def merge_pairs(bank: Bank, chunk: int, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``chunk`` in ``bank`` to fold into the earlier row of the same in-frame position.

    Frame by frame through the chunk, each row is compared with its position's representative (the
    latest earlier stored row of that position, or a row of this chunk not merged); it merges when
    :func:`key_cosine` is at least ``threshold``, else it becomes the representative.

    Returns
    -------
    into, rows : Tensor, shape ``[m]``, long
        Row ``into[i]`` absorbs row ``rows[i]`` (:meth:`Bank.merge`).
    """
    chunk_of, pos, frame = bank.field("chunk"), bank.field("pos"), bank.field("frame")
    leaving = (chunk_of == chunk).nonzero().squeeze(1)
    empty = torch.zeros(0, dtype=torch.long)
    if not len(leaving):
        return empty, empty
    first = int(leaving[0])
    rep = torch.full((int(pos.max()) + 1,), -1, dtype=torch.long)  # position -> its representative row
    rep.scatter_reduce_(0, pos[:first], torch.arange(first), "amax")
    into, rows = [], []
    for f in frame[leaving].unique().tolist():
        these = leaving[frame[leaving] == f]
        target = rep[pos[these]]
        has = target >= 0
        merged = torch.zeros(len(these), dtype=torch.bool)
        if bool(has.any()):
            keys = bank.gather(torch.cat([these[has], target[has]]))[0]
            m = int(has.sum())
            merged[has] = key_cosine(keys[:, :m], keys[:, m:]) >= threshold
        into.append(target[merged])
        rows.append(these[merged])
        rep[pos[these[~merged]]] = these[~merged]
    return torch.cat(into), torch.cat(rows)


@register
@dataclass
class TempCache(Method):
    """Merge a history row into the earlier row of the same in-frame position when their keys' cosine
    is at least ``threshold``; the sink and the recent window are never merged.

    Each chunk is merged once, when it leaves the recent window, in every layer and head group on its
    own keys. A merged row counts as a dropped token in the PR ledger (the ledger counts stored rows:
    the row that absorbs stands for one visible key, whatever its count).

    Parameters
    ----------
    threshold : float
        Lowest key cosine (over a bank's heads and channels, the minimum over the batch) at which a
        row is merged into its position's earlier row; above 1 nothing merges, at -1 every repeat of a
        position does.
    """

    name = "tempcache"
    family = "merging"
    description = ("merges a history key into the earlier key of the same position when their cosine >= threshold "
                   "(values averaged, log(count) added to its logit); sink + recent kept")
    paper = "https://arxiv.org/abs/2602.01801"
    paper_title = "TempCache, arXiv 2602.01801"
    knob = Knob("threshold", -1.0, 1.0, increasing=False)  # a lower threshold merges more

    knob_minimums: ClassVar[dict[str, float]] = {"threshold": -1}

    threshold: float = 0.9

    def merge_selector(self, newest: ChunkInfo):
        """``bank -> (into, rows)``: the merges of the chunk leaving the window after ``newest``
        (none while it is a sink chunk or none has left)."""
        leaving = newest.index - self.window()
        empty = torch.zeros(0, dtype=torch.long)
        if leaving < self.sink_chunks:
            return lambda bank: (empty, empty)
        return lambda bank: merge_pairs(bank, leaving, self.threshold)

    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        """Merge the chunk leaving the window, then compact and enforce limits as every method does."""
        cache.merge(self.merge_selector(sig.chunk))
        super().after_chunk(cache, sig)
