"""WorldKV with a fixed recent window: CMBench's first reading of WorldKV, kept under its own name.

The device holds the sink, a recent window of ``recent_chunks`` (2) committed chunks and the retrieved
chunks, whatever the phase: there is no device budget that a rolling window fills before retrieval
starts, the candidates reach the recent window, and the chunk being generated is not counted. Its
store, compression and pose retrieval are WorldKV's (:class:`cmbench.methods.worldkv.StoreRetrieval`).
``worldkv`` is the rule as WorldKV's code runs it; docs/protocol.md says where the two differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from cmbench.cache import HeadGroup
from cmbench.methods.registry import register
from cmbench.methods.worldkv import StoreRetrieval


@register
@dataclass
class WorldKVFixedWindow(StoreRetrieval):
    """Sink + a fixed recent window on the device; older chunks compressed into a host store and retrieved
    by camera pose before each chunk.

    Parameters
    ----------
    recent_chunks : int
        Dense recent window of committed chunks (2: WorldKV's 6 frames read as two 3-frame chunks before
        the current one).
    retrieval_frames : int
        Retrieval budget in latent frames: ``retrieval_frames // chunk_frames`` stored chunks are brought
        back per chunk (WorldKV's run script: 18). The device budget knob.
    keep_ratio, store_max_bytes
        As :class:`~cmbench.methods.worldkv.StoreRetrieval`.
    """

    name = "worldkv_fixed_window"
    description = ("sink + a fixed recent window (2 chunks); older chunks compressed against their anchor frame into a "
                   "host store, the chunks nearest the camera pose brought back before each chunk")
    paper = "https://arxiv.org/abs/2605.22718"
    paper_title = "WorldKV, arXiv 2605.22718"

    recent_chunks: int = 2
    retrieval_frames: int = 18

    def layout(self, geometry) -> list[list[HeadGroup]]:
        """One bank per layer sized for the sink, the recent window and the retrieved chunks."""
        chunks = self.sink_chunks + self.recent_chunks + self.retrieved_chunks(geometry)
        return self.bank_layout(geometry, chunks * geometry.tokens_per_chunk)
