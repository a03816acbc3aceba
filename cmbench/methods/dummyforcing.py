"""DummyForcing: online head classification; half the heads become "dummy" and see only the last frames."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cmbench.cache import Bank, ChunkInfo, HeadGroup, KVCache, uniform_layout
from cmbench.errors import ConfigError
from cmbench.methods.base import ChunkSignals, Method, Needs
from cmbench.methods.registry import register

ROLES = ("dummy", "first", "middle")


@register
@dataclass
class DummyForcing(Method):
    """Heterogeneous per-head memory, classified once from attention.

    Before classification every head keeps the first ``first_frames`` latent frames and the newest
    ``middle_frames + last_frames``. At the first denoising call of generated chunk
    ``classify_chunk`` (0-based; 2 = the third chunk) the attention mass of every layer-head on three
    history segments is recorded: *first* (frames ``< first_frames``), *last* (the newest
    ``last_frames`` history frames plus the chunk itself) and *middle* (the rest). The
    ``dummy_fraction`` of all layer-heads with the largest *last* share become ``"dummy"`` heads that
    keep only the newest ``last_frames``; each other head keeps the newest ``last_frames`` plus, by its
    larger share, the first frames (``"first"``) or the ``middle_frames`` before them (``"middle"``).
    Heads of one role share a physical bank. ``sink_chunks`` / ``recent_chunks`` only bound what
    bounded-memory eviction may drop.

    Parameters
    ----------
    first_frames, middle_frames, last_frames : int
        Segment sizes in latent frames (paper setting 4 / 8 / 4).
    classify_chunk : int
        Generated chunk whose first call classifies the heads.
    dummy_fraction : float
        Fraction of all layer-heads that become dummy.
    """

    name = "dummyforcing"
    description = ("heads classified online from attention: half become \"dummy\" (last frames only), others keep "
                   "the first frames or a short window")
    paper = "https://arxiv.org/abs/2601.20499"
    paper_title = "Dummy Forcing, arXiv 2601.20499"

    first_frames: int = 4
    middle_frames: int = 8
    last_frames: int = 4
    classify_chunk: int = 2
    dummy_fraction: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.first_frames, self.middle_frames, self.last_frames, self.classify_chunk) < 0:
            raise ConfigError(f"{self.name}: frame counts and classify_chunk must be >= 0")
        if not 0.0 <= self.dummy_fraction <= 1.0:
            raise ConfigError(f"{self.name}: dummy_fraction must be in [0, 1], got {self.dummy_fraction}")

    def needs(self) -> Needs:
        return Needs(attention_chunk=self.classify_chunk)

    def role_frames(self, role: str) -> int:
        """Configured size of a role's bank, in latent frames."""
        return {
            "unclassified": self.first_frames + self.middle_frames + self.last_frames,
            "first": self.first_frames + self.last_frames,
            "middle": self.middle_frames + self.last_frames,
            "dummy": self.last_frames,
        }[role]

    def layout(self, geometry) -> list[list[HeadGroup]]:
        return uniform_layout(geometry.num_layers, geometry.num_heads, "unclassified",
                              self.role_frames("unclassified") * geometry.tokens_per_frame)

    def rule(self, bank: Bank, newest: ChunkInfo) -> torch.Tensor:
        frame = bank.field("frame")
        end = newest.frame_end
        first = frame < self.first_frames
        last = frame >= end - self.last_frames
        window = frame >= end - self.last_frames - self.middle_frames
        return {"unclassified": first | window, "first": first | last, "middle": window, "dummy": last}[bank.role]

    def classify(self, attention, frame_start: int) -> torch.Tensor:
        """Role index per layer-head (into :data:`ROLES`), ``[num_layers, num_heads]``.

        Parameters
        ----------
        attention : AttentionStats
            Mass per absolute frame, ``[H, F]`` per layer, recorded at the chunk starting at ``frame_start``.
        """
        mass = attention.stacked()  # [layers, H, F]
        split = max(frame_start - self.last_frames, self.first_frames)
        first = mass[..., : self.first_frames].sum(-1)
        middle = mass[..., self.first_frames : split].sum(-1)
        last = mass[..., split:].sum(-1)
        roles = torch.where(first >= middle, 1, 2)
        n_dummy = round(self.dummy_fraction * last.numel())
        dummy = last.flatten().argsort(descending=True, stable=True)[:n_dummy]
        roles.view(-1)[dummy] = 0
        return roles

    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        if sig.phase == "generation" and sig.generated_index == self.classify_chunk:
            if sig.attention is None:
                raise RuntimeError(f"{self.name} needs the attention of generated chunk {self.classify_chunk}")
            roles = self.classify(sig.attention, sig.chunk.frame_start)
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
