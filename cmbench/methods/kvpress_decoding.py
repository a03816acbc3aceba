"""kvpress's DecodingPress on a video DiT: the press re-scores the whole history to a fixed size.

kvpress's ``DecodingPress(base_press, compression_interval, target_size)`` (kvpress 0.5,
``presses/decoding_press.py``) compresses during an LLM's generation: every ``compression_interval``
decoding steps of a layer it hands the layer's whole cache (every token, kept ones included) to its base
press's ``compress`` with the compression ratio at which ``int(n * (1 - ratio))`` is ``target_size``,
so a token kept at one compression can be evicted at a later one. Here a chunk is the step: at the commit
of every chunk whose timeline index plus one is a multiple of ``compression_interval``, each layer's
history outside the sink and the recent window (the chunks that left the window, what earlier
re-scorings kept and what left since) goes to the press's ``score`` as :mod:`cmbench.methods.kvpress_adapter`
feeds it, and each head keeps the highest ones so that it holds ``target_size`` history tokens, sink and
window included (kvpress's target counts the whole cache). Between re-scorings the chunks that leave the
window are kept whole, as the cache grows between DecodingPress's compressions. Evicted tokens are gone
from the banks: the PR ledger counts them as pruned at every chunk after the re-scoring.

What differs from kvpress, and why: the sink and recent window are CMBench's shared ones (DecodingPress
protects nothing; its base press may); context chunks are re-scored like generated ones (kvpress leaves
the prompt to a prefill press, ``PrefillDecodingPress``; a CMBench context is chunks of frames run through
the same loop); the probe a press reads is the newest chunk's queries, not a buffer of the last
``hidden_states_buffer_size`` tokens' hidden states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from cmbench.cache import Bank, ChunkInfo, HeadGroup, KVCache
from cmbench.errors import ConfigError
from cmbench.methods.knobs import Knob
from cmbench.methods.kvpress_adapter import KVPress, kept_count
from cmbench.methods.registry import register


def ratio_keeping(tokens: int, kept: int) -> float:
    """The compression ratio at which a press keeps ``kept`` of ``tokens`` (:func:`kept_count`: the integer
    part of ``tokens * (1 - ratio)``), as DecodingPress sets its base press's ratio; 0 when ``kept >= tokens``.

    ``1 - kept / tokens``, lowered by the least float steps that make the integer part exact (rounding can
    leave ``tokens * (1 - ratio)`` just under ``kept``, never a whole token over it).
    """
    if kept >= tokens:
        return 0.0
    ratio = 1.0 - kept / tokens
    while kept_count(tokens, ratio) < kept:
        ratio = math.nextafter(ratio, 0.0)
    return ratio


@register
@dataclass
class KVPressDecoding(KVPress):
    """A kvpress press re-scores every history token outside the sink and window to a fixed size, as
    kvpress's DecodingPress does.

    Parameters
    ----------
    press : str or mapping
        As :class:`~cmbench.methods.kvpress_adapter.KVPress` (DecodingPress's ``base_press``).
    target_size : int
        History tokens each head holds after a re-scoring, sink and recent window included (kvpress's
        default 2048); above what the sink and window hold.
    compression_interval : int
        Chunks between re-scorings (1: at every commit).
    compression_ratio : float
        Set by each re-scoring from ``target_size`` (left at 0, as DecodingPress overrides its base press's).
    """

    name = "kvpress_decoding"
    description = ("kvpress's DecodingPress: every `compression_interval` chunks a press re-scores the whole history "
                   "outside sink and window, kept tokens included, and each head keeps `target_size` tokens")
    paper = "https://github.com/NVIDIA/kvpress"
    paper_title = "NVIDIA kvpress (DecodingPress)"
    knob = Knob("target_size", 1, 1e6, increasing=False, log=True, integer=True)
    knob_minimums: ClassVar[dict[str, float]] = {"target_size": 1, "compression_interval": 1}

    compression_ratio: float = 0.0
    target_size: int = 2048
    compression_interval: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compression_ratio != 0:
            raise ConfigError(f"method kvpress_decoding: compression_ratio is set at each re-scoring from target_size "
                              f"(got {self.compression_ratio}); leave it out")
        if self.max_history_tokens is not None:
            raise ConfigError("method kvpress_decoding: target_size (or a quota) is its budget; leave out "
                              "max_history_tokens")

    def layout(self, geometry) -> list[list[HeadGroup]]:
        """One bank per head; refuses a ``target_size`` the sink and recent window alone fill (outside quota mode)."""
        window = self.window_size(geometry)
        if not self.quota_mode and self.target_size <= window:
            raise ConfigError(f"method kvpress_decoding: method.target_size={self.target_size} leaves no re-scored "
                              f"token: the sink and recent window hold {window} tokens per head; give more")
        return super().layout(geometry)

    def scored_chunks(self, cache: KVCache, index: int) -> tuple[ChunkInfo, ChunkInfo] | None:
        """Every chunk from the first after the sink to the one leaving the window, at a re-scoring."""
        leaving = index - self.window()
        if (index + 1) % self.compression_interval or leaving < self.sink_chunks:
            return None
        return cache.chunk(self.sink_chunks), cache.chunk(leaving)

    def kept(self, cache: KVCache, bank: Bank, first: ChunkInfo, last: ChunkInfo, held: int) -> tuple[int, float]:
        """What fills the bank to its target beside its sink and window rows (0 to ``held``), and the ratio
        the press scores at (:func:`ratio_keeping`; when none is kept, the ratio keeping one: a press keeps
        at least one).

        The target is ``target_size``; in quota mode the allowance (``quota_pr``'s share of FullKV's history
        at this commit, or ``quota_tokens``), so the budget is met at every re-scoring.
        """
        target = self.allowance(cache, cache.chunks[-1]) if self.quota_mode else self.target_size
        n_kept = max(0, min(held, target - (bank.n - held)))
        return n_kept, ratio_keeping(held, max(1, n_kept))

    def selector(self, cache: KVCache, newest: ChunkInfo, incoming: int = 0):
        """Every bank by its keep flags, in quota mode too (the quota is the re-scorings' target, :meth:`kept`)."""
        return lambda bank: self.select(bank, newest)
