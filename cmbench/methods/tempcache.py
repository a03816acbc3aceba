"""TempCache: merge near-duplicate keys across frames into one row whose logit carries ``log(count)``.

TempCache (arXiv 2602.01801) bounds cache growth by temporal correspondence: a cached key that nearly
repeats a key of an earlier frame is folded into it. When a chunk leaves the recent window, each of its
rows, frame by frame, is matched with its nearest earlier key by cosine (:mod:`cmbench.methods.tempcache_search`):
among the rows still stored of the ``search_frames`` frames before its own, at any in-frame position, as the
paper's nearest-neighbour search does (content that moved with the camera is found where it moved to).
The cosine is over the bank's heads and channels side by side, the lowest over the batch; when it is at
least ``threshold`` the later row is merged into the earlier one (:meth:`KVCache.merge`: values averaged by
count, counts added, ``log(count)`` added to the row's attention logit); otherwise it stays and may absorb
later frames' rows. A row that absorbed others keeps its own key, so a run of repeats is matched with its
first key, never a drifting average.

Keys are cached after RoPE. The merged row keeps the earlier row's key, position and rotation: attention
sees the later token where the earlier one was. Matching is therefore on the keys as stored (``match_on=
rotated``, the default): their cosine is the one the merged logit's error depends on, and identical stored
keys merge exactly. ``match_on=content`` removes each key's temporal rotation before comparing (keys of the
same content at different times compare equal; the spatial rotation stays, since the cache does not know
each token's spatial RoPE position): more merges, each with the error of moving the later token back in
time, which the threshold does not see. docs/methods.md gives what each costs.

``tempcache_samepos`` is the search-free matcher of the same position only (the correspondence of a static
camera): each row is compared with the latest earlier stored row of its own in-frame position.

The paper's other modules, AnnCA and AnnSA (approximate attention over the merged cache by nearest-neighbour
retrieval of the keys each query attends to), change how attention is computed, not what is stored: out of
scope for a benchmark of what the KV cache keeps (docs/methods.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from cmbench.cache import Bank, ChunkInfo, KVCache
from cmbench.cache.rope import RopeSpec, shift_positions
from cmbench.errors import ConfigError
from cmbench.methods.base import ChunkSignals, Method
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import register
from cmbench.methods.tempcache_search import nearest, unit_keys

MATCH_ON = ("rotated", "content")


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
    """Rows of ``chunk`` in ``bank`` to fold into the earlier row of the same in-frame position
    (``tempcache_samepos``).

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


def nearest_pairs(bank: Bank, chunk: int, threshold: float, search_frames: int, exact_limit: int,
                  rope: RopeSpec | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``chunk`` in ``bank`` to fold into their nearest earlier key (``tempcache``'s correspondence search).

    Frame by frame through the chunk, each row's key is matched with the most similar key
    (:func:`~cmbench.methods.tempcache_search.nearest`: exact top-1 while rows x candidates is at most
    ``exact_limit``, a FAISS HNSW shortlist re-scored exactly above) among the stored rows of frames
    ``f - search_frames .. f - 1`` at any position, rows merged in this pass left out; it merges when that
    cosine is at least ``threshold``.

    Parameters
    ----------
    rope : RopeSpec or None
        Compare the keys with their temporal rotation removed (rotated back to time 0 by their ``tpos``);
        ``None``: as stored.

    Returns
    -------
    into, rows : Tensor, shape ``[m]``, long
        Row ``into[i]`` absorbs row ``rows[i]`` (:meth:`Bank.merge`; every ``into`` is of an earlier frame, so
        an earlier row).
    """
    frame = bank.field("frame")
    leaving = (bank.field("chunk") == chunk).nonzero().squeeze(1)
    empty = torch.zeros(0, dtype=torch.long)
    absorbed = torch.zeros(bank.n, dtype=torch.bool)
    into, rows = [empty], [empty]
    for f in frame[leaving].unique().tolist():
        these = leaving[frame[leaving] == f]
        window = ((frame >= f - search_frames) & (frame < f) & ~absorbed).nonzero().squeeze(1)
        if not len(window):
            continue
        both = torch.cat([these, window])
        keys = bank.gather(both)[0]  # [B, m + n, Hg, D]
        if rope is not None:
            keys = shift_positions(keys, rope, -bank.field("tpos")[both])
        unit = unit_keys(keys)
        index, cosine = nearest(unit[:, : len(these)], unit[:, len(these) :], exact_limit)
        merged = cosine >= threshold
        into.append(window[index[merged]])
        rows.append(these[merged])
        absorbed[these[merged]] = True
    return torch.cat(into), torch.cat(rows)


@register
@dataclass
class SamePositionTempCache(Method):
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

    name = "tempcache_samepos"
    family = "merging"
    description = ("TempCache with the same-position matcher only: merges a history key into the earlier key of the "
                   "same position when their cosine >= threshold (values averaged, log(count) added to its logit)")
    paper = "https://arxiv.org/abs/2602.01801"
    paper_title = "TempCache, arXiv 2602.01801"
    knob = Knob("threshold", -1.0, 1.0, increasing=False)  # a lower threshold merges more

    knob_minimums: ClassVar[dict[str, float]] = {"threshold": -1}

    threshold: float = 0.9

    def pairs(self, bank: Bank, chunk: int, rope: RopeSpec | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(into, rows)``: the merges of ``chunk``'s rows in ``bank`` (``rope``: the cache's)."""
        return merge_pairs(bank, chunk, self.threshold)

    def merge_selector(self, newest: ChunkInfo, rope: RopeSpec | None = None):
        """``bank -> (into, rows)``: the merges of the chunk leaving the window after ``newest``
        (none while it is a sink chunk or none has left); ``rope``: the cache's rotary layout."""
        leaving = newest.index - self.window()
        empty = torch.zeros(0, dtype=torch.long)
        if leaving < self.sink_chunks:
            return lambda bank: (empty, empty)
        return lambda bank: self.pairs(bank, leaving, rope)

    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        """Merge the chunk leaving the window, then compact and enforce limits as every method does."""
        cache.merge(self.merge_selector(sig.chunk, cache.rope))
        super().after_chunk(cache, sig)


@register
@dataclass
class TempCache(SamePositionTempCache):
    """Merge a history row into its nearest earlier key, at any in-frame position of the ``search_frames``
    frames before its own, when their cosine is at least ``threshold``; the sink and the recent window are
    never merged (:func:`nearest_pairs`).

    Parameters
    ----------
    threshold : float
        Lowest key cosine (over a bank's heads and channels, the minimum over the batch) at which a row is
        merged into its nearest earlier key.
    search_frames : int
        Earlier frames searched (>= 1).
    match_on : {"rotated", "content"}
        Compare the keys as stored (``rotated``) or with their temporal rotation removed (``content``).
    exact_limit : int
        Largest rows x candidates of one frame searched exactly; above it, a FAISS HNSW index shortlists.
    """

    name = "tempcache"
    description = ("merges a history key into its nearest earlier key (cosine, any position of the search_frames "
                   "frames before) when their cosine >= threshold (values averaged, log(count) added to its logit); "
                   "sink + recent kept")
    knob_minimums: ClassVar[dict[str, float]] = {"threshold": -1, "search_frames": 1, "exact_limit": 0}

    search_frames: int = 4
    match_on: str = "rotated"
    exact_limit: int = 2**26

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.match_on not in MATCH_ON:
            raise ConfigError(f"method tempcache: match_on={self.match_on!r}: expected one of {', '.join(MATCH_ON)}")

    def pairs(self, bank: Bank, chunk: int, rope: RopeSpec | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.match_on == "content" and rope is None:
            raise ValueError("tempcache: match_on=content needs the cache's rotary layout")
        return nearest_pairs(bank, chunk, self.threshold, self.search_frames, self.exact_limit,
                             rope if self.match_on == "content" else None)
