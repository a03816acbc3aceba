"""Streaming: the sink and the recent window, nothing else (StreamingLLM-style attention sinks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cmbench.cache import Bank, ChunkInfo, HeadGroup, uniform_layout
from cmbench.methods.base import Method
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import register


@register
@dataclass
class Streaming(Method):
    """Keep the first ``sink_chunks`` and the newest ``recent_chunks`` chunks.

    The paper's setting is sink 4 + local 8 latent frames: one sink chunk and two recent chunks of 4
    frames (docs/protocol.md: why 4 + 8 rather than upstream's 4 + 4). ``recent_chunks=0`` with a
    sink is the "no context" control (sink only).
    """

    name = "streaming"
    family = "eviction"
    description = "sink chunks + recent window only; `recent_chunks=0` is the sink-only \"no context\" control"
    paper = "https://arxiv.org/abs/2309.17453"
    paper_title = "StreamingLLM, arXiv 2309.17453"

    knob = Knob("recent_chunks", 0, 512, increasing=False, integer=True)  # a longer window prunes less

    recent_chunks: int = 2

    def rule(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        return self.protected(bank, newest)

    def layout(self, geometry) -> list[list[HeadGroup]]:
        return uniform_layout(geometry.num_layers, geometry.num_heads, "all", self.window_size(geometry))
