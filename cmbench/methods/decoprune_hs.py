"""DeCoPrune-HS: DeCoPrune on dynamic heads, streaming on static heads, from an offline head map."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cmbench.cache import Bank, ChunkInfo, HeadGroup
from cmbench.methods.decoprune import DeCoPrune
from cmbench.methods.head_map import HeadMap
from cmbench.methods.registry import register


@register
@dataclass
class DeCoPruneHS(DeCoPrune):
    """Head-specialised DeCoPrune.

    Each layer's heads live in two physical banks: ``"dynamic"`` (DeCoPrune's shared mask) and
    ``"static"`` (sink + recent window only). Layer 0 is all dynamic whatever the map says. Quota mode
    calibrates the dynamic banks so the total over *all* heads meets the target.

    Parameters
    ----------
    head_map : str
        Path of a head-map JSON (ForcingKV's format; ``scripts/build_head_map.py`` writes one).
    """

    name = "decoprune_hs"
    description = "DeCoPrune on dynamic heads, sink + recent on static heads (offline head map, layer 0 dynamic)"
    paper = "https://arxiv.org/abs/2609.39096"
    paper_title = "DeCoPrune, arXiv 2609.39096"

    head_map: str | None = None

    def layout(self, geometry) -> list[list[HeadGroup]]:
        hmap = HeadMap.load_for(self.head_map, geometry, self.name)
        return hmap.layout(self.max_history_tokens, self.window_size(geometry), dynamic_layers=(0,))

    def budgeted(self, bank: Bank) -> bool:
        return bank.role == "dynamic"

    def rule(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        if bank.role == "static":
            return self.protected(bank, newest)
        return super().rule(bank, newest)
