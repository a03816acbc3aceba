"""A keep pattern recorded from one run and replayed as a fixed mask: the control for online scoring cost.

:class:`KeptIds` is an ``on_chunk_end`` hook of the generation loop that records, after each generated
chunk, the global token ids every bank still stores; :class:`OracleMask` replays them. Both runs then
see exactly the same history, so their time difference is what the recorded method spent deciding.
Neither is a registered method: the oracle needs a recording to exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from cmbench.cache import KVCache
from cmbench.methods.base import ChunkSignals, Method


class KeptIds:
    """``on_chunk_end`` hook: the global ids kept after every generated chunk.

    Attributes
    ----------
    survivors : dict of int to Tensor
        Chunk index -> global token ids ``long [n]`` stored after that chunk's compaction.
    """

    def __init__(self) -> None:
        self.survivors: dict[int, torch.Tensor] = {}

    def __call__(self, cache: KVCache, sig: ChunkSignals) -> None:
        if sig.phase != "generation":
            return
        gids = [b.field("gid").clone() for b in cache.all_banks()]
        if any(not torch.equal(g, gids[0]) for g in gids):
            raise RuntimeError("the oracle replays one mask shared by every bank; this method's banks differ")
        self.survivors[sig.chunk.index] = gids[0]


@dataclass
class OracleMask(Method):
    """Keeps, after each chunk, exactly the history a recorded run kept: a keep pattern with no scoring.

    Parameters
    ----------
    survivors : mapping of int to Tensor
        Chunk index -> global token ids ``long [n]`` still stored after that chunk's compaction
        (:attr:`KeptIds.survivors` of the recorded run).
    """

    name = "oracle_mask"
    description = "Replay of a recorded keep pattern (benchmark control)"

    survivors: Mapping[int, torch.Tensor] = field(default_factory=dict)

    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        keep = self.survivors[sig.chunk.index]
        cache.compact(lambda bank: torch.isin(bank.field("gid"), keep))

