"""DummyForcing: heads classified once from attention; half become "dummy" and see only the last frames.

The authors' harness: the cache stays dense until timeline chunk ``classify_chunk`` (2: the third
chunk, during the context replay, so every continuation chunk runs with the classified layout). At
that chunk's ``t = 0`` pass every layer-head's attention is measured over a packed key layout (the
first frame of chunk 0, then chunks 1 .. ``classify_chunk``, the last being the chunk itself) and
summed over three regions of it: *first* = the first ``chunk_frames`` frames of the packed layout,
*last* = the chunk itself, *middle* = what lies between. The first and middle masses are normalised
over all layer-heads; the ``dummy_fraction`` of layer-heads with the lowest ``max(first, middle)``
become *dummy*, the others *middle* where their normalised middle mass exceeds their first mass, else
*first*. From then on each role keeps, after every chunk:

- *first*: latent frames ``0 .. first_frames - 1``;
- *middle*: a fixed bank of ``middle_frames`` frames centred between the first frames and the recent
  ones at classification time, plus the newest ``recent_frames``;
- *dummy*: the newest ``last_frames``.

Heads of one role share a physical bank. ``sink_chunks`` / ``recent_chunks`` only bound what
bounded-memory eviction may drop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from cmbench.cache import Bank, ChunkInfo, HeadGroup, KVCache, uniform_layout
from cmbench.errors import ConfigError
from cmbench.methods.base import ChunkSignals, Method, Needs
from cmbench.methods.registry import register

ROLES = ("first", "middle", "dummy")


@register
@dataclass
class DummyForcing(Method):
    """Heterogeneous per-head memory, classified once from attention (paper setting 4 / 4 + 4 / 4).

    Parameters
    ----------
    first_frames : int
        Frames the *first* heads keep from the start of the video.
    middle_frames : int
        Frames of the *middle* heads' fixed bank (placed at classification time).
    recent_frames : int
        Newest frames the *middle* heads keep besides their bank.
    last_frames : int
        Newest frames the *dummy* heads keep.
    classify_chunk : int
        Timeline chunk (context chunks first) whose ``t = 0`` pass classifies the heads; at least 2.
    dummy_fraction : float
        Fraction of all layer-heads that become dummy.
    """

    name = "dummyforcing"
    family = "eviction"
    description = ("heads classified at the third chunk from attention: half become \"dummy\" (last 4 frames), the "
                   "others keep the first 4 frames or a centre bank + the newest 4")
    paper = "https://arxiv.org/abs/2601.20499"
    paper_title = "Dummy Forcing, arXiv 2601.20499"

    knob_minimums: ClassVar[dict[str, float]] = {"first_frames": 0, "middle_frames": 0, "recent_frames": 0,
                                                  "last_frames": 0}

    first_frames: int = 4
    middle_frames: int = 4
    recent_frames: int = 4
    last_frames: int = 4
    classify_chunk: int = 2
    dummy_fraction: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.classify_chunk < 2:
            raise ConfigError(f"{self.name}: classify_chunk must be >= 2 (the packed layout needs a first region "
                              f"before the classifying chunk's own)")
        if not 0.0 <= self.dummy_fraction <= 1.0:
            raise ConfigError(f"{self.name}: dummy_fraction must be in [0, 1], got {self.dummy_fraction}")

    def needs(self) -> Needs:
        return Needs(attention_chunk=self.classify_chunk)

    def attention_key_frames(self, geometry, chunk: ChunkInfo) -> tuple[int, ...]:
        """The packed layout: the first frame, then every frame of chunks 1 .. the classifying one."""
        return (0, *range(geometry.chunk_frames, chunk.frame_end))

    def regions(self, geometry, chunk: ChunkInfo) -> dict[str, tuple[int, ...]]:
        """Source frames of the *first*, *middle* and *last* regions of the packed layout."""
        packed = self.attention_key_frames(geometry, chunk)
        f, own = geometry.chunk_frames, chunk.num_frames
        return {"first": packed[:f], "middle": packed[f:-own], "last": packed[-own:]}

    def centre_bank(self, frames_seen: int, chunk_frames: int) -> tuple[int, int]:
        """``[start, end)`` of the *middle* heads' fixed bank when ``frames_seen`` frames exist: whole
        chunks centred between the first frames and the newest ``recent_frames``."""
        start = min(frames_seen, self.first_frames)
        available = max(start, frames_seen - self.recent_frames) - start
        size = min(self.middle_frames, available // chunk_frames * chunk_frames)
        slack = (available - size) // chunk_frames if size else 0
        begin = start + slack // 2 * chunk_frames
        return begin, begin + size

    def role_frames(self, role: str) -> int:
        """Configured size of a role's bank, in latent frames."""
        return {"first": self.first_frames, "middle": self.middle_frames + self.recent_frames,
                "dummy": self.last_frames}[role]

    def layout(self, geometry) -> list[list[HeadGroup]]:
        return uniform_layout(geometry.num_layers, geometry.num_heads, "unclassified")

    def classify(self, mass: torch.Tensor, regions: dict[str, tuple[int, ...]]) -> torch.Tensor:
        """Role index per layer-head (into :data:`ROLES`), ``[num_layers, num_heads]``.

        Parameters
        ----------
        mass : Tensor, shape ``[num_layers, num_heads, F]``
            Attention mass per source frame (over the packed keys).
        regions : dict
            Frames of ``"first"``, ``"middle"`` (and ``"last"``) from :meth:`regions`.
        """
        first = mass[..., list(regions["first"])].sum(-1)
        middle = mass[..., list(regions["middle"])].sum(-1)
        first, middle = first / first.sum().clamp_min(1e-30), middle / middle.sum().clamp_min(1e-30)
        roles = torch.where(first < middle, 1, 0)
        n_dummy = round(self.dummy_fraction * roles.numel())
        cost = torch.maximum(first, middle).flatten()
        roles.view(-1)[torch.argsort(cost, stable=True)[:n_dummy]] = 2  # ties: the lower layer-head
        return roles

    def rule(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        frame = bank.field("frame")
        end = newest.frame_end
        if bank.role == "first":
            return frame < self.first_frames
        if bank.role == "dummy":
            return frame >= end - self.last_frames
        if bank.role == "middle":  # chunks are all of newest's size: classification saw (classify_chunk + 1) of them
            begin, stop = self.centre_bank((self.classify_chunk + 1) * newest.num_frames, newest.num_frames)
            return ((frame >= begin) & (frame < stop)) | (frame >= end - self.recent_frames)
        return torch.ones(bank.n, dtype=torch.bool)  # unclassified: dense

    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        if sig.chunk.index == self.classify_chunk:
            if sig.attention is None:
                raise RuntimeError(f"{self.name} needs the attention of chunk {self.classify_chunk}")
            roles = self.classify(sig.attention.stacked(), self.regions(sig.geometry, sig.chunk))
            T = sig.geometry.tokens_per_frame
            for layer in range(cache.num_layers):
                groups = [
                    HeadGroup(tuple(int(h) for h in (roles[layer] == r).nonzero().flatten()), ROLES[r],
                              self.role_frames(ROLES[r]) * T)
                    for r in range(len(ROLES))
                    if bool((roles[layer] == r).any())
                ]
                cache.regroup(layer, groups)
        super().after_chunk(cache, sig)
