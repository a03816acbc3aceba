"""TempDiff: keep the patches that changed most since the preceding frame."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cmbench.cache import KVCache
from cmbench.errors import ConfigError
from cmbench.methods.base import ChunkSignals, ScoredMethod
from cmbench.methods.registry import register


def temporal_dissimilarity(x0: torch.Tensor, previous: torch.Tensor | None, geometry) -> torch.Tensor:
    """``1 - cos`` between each token and the same token one latent frame earlier.

    Parameters
    ----------
    x0 : Tensor, shape ``[B, C, f, h, w]``
        The chunk's clean latents.
    previous : Tensor or None, shape ``[B, C, f', h, w]``
        The previous chunk's clean latents (its last frame is used); ``None`` for the first chunk,
        whose first frame then scores ``+inf``.

    Returns
    -------
    Tensor, shape ``[f * tokens_per_frame]``: in ``[0, 2]`` (or ``+inf``), mean over the batch.
    """
    T = geometry.tokens_per_frame
    tokens = geometry.tokenize(x0).float()  # [B, f*T, P]
    if previous is None:
        before = torch.cat([torch.full_like(tokens[:, :T], float("nan")), tokens[:, :-T]], dim=1)
    else:
        before = torch.cat([geometry.tokenize(previous[:, :, -1:]).float(), tokens[:, :-T]], dim=1)
    score = (1.0 - F.cosine_similarity(tokens, before, dim=-1, eps=1e-8)).mean(0)
    return torch.nan_to_num(score, nan=float("inf"))


@register
@dataclass
class TempDiff(ScoredMethod):
    """Per frame, keep the ``round(keep_ratio * tokens_per_frame)`` tokens least similar (cosine of their
    clean latent values) to the same token in the preceding frame. One mask for all layers.

    Parameters
    ----------
    keep_ratio : float
        Fraction of each frame's tokens kept (K per frame, scale-free across backbones).
    """

    name = "tempdiff"
    description = "per frame, the K patches least similar to the same patch in the previous frame"
    paper_title = "TempDiff, as described in DeCoPrune's baselines"

    keep_ratio: float = 0.14

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.keep_ratio <= 1.0:
            raise ConfigError(f"{self.name}: keep_ratio must be in [0, 1], got {self.keep_ratio}")

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        g = sig.geometry
        T = g.tokens_per_frame
        score = temporal_dissimilarity(sig.x0_final, sig.previous_final, g)
        per_frame = score.reshape(-1, T)
        k = round(self.keep_ratio * T)
        top = per_frame.argsort(dim=1, descending=True, stable=True)[:, :k]
        keep = torch.zeros_like(per_frame, dtype=torch.bool).scatter_(1, top, True).reshape(-1)
        cache.mark(sig.chunk.index, keep=keep, priority=score)
