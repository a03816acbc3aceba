"""DeCoPrune-Reverse: the selection ablation that keeps LOW-discrepancy tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cmbench.methods.base import finite_priority
from cmbench.methods.decoprune import DeCoPrune
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import register


@register
@dataclass
class DeCoPruneReverse(DeCoPrune):
    """Keep tokens with ``score <= gamma`` (non-finite scores still kept); quota mode keeps the lowest."""

    name = "decoprune_reverse"
    description = "the ablation: tokens with LOW discrepancy (score <= gamma)"
    paper = "https://arxiv.org/abs/2609.39096"
    paper_title = "DeCoPrune, arXiv 2609.39096"
    knob = Knob("gamma", 1e-6, 1e2, increasing=False, log=True)  # keeps score <= gamma: larger keeps more

    def keep_rule(self, score: torch.Tensor) -> torch.Tensor:
        return ~torch.isfinite(score) | (score <= self.gamma)

    def priority(self, score: torch.Tensor) -> torch.Tensor:
        return finite_priority(-score)
