"""FullKV: keep every token (the uncompressed reference)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cmbench.cache import Bank, ChunkInfo
from cmbench.methods.base import Method
from cmbench.methods.registry import register


@register
@dataclass
class FullKV(Method):
    """Keep the whole history (with ``max_history_tokens`` set it evicts the oldest tokens first)."""

    name = "fullkv"
    family = "none"
    description = "every history token (uncompressed reference)"

    def rule(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        return torch.ones(bank.n, dtype=torch.bool)
