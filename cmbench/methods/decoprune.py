"""DeCoPrune: keep the tokens the retained context could not predict (denoising consistency).

For every token ``p`` of a chunk (one DiT patch, ``C * ph * pw`` latent values)::

    score[p] = mean over the token's values of (x0_hat(tau*)[p] - x_final[p]) ** 2

and the token is kept iff ``score[p] > gamma`` (non-finite scores are kept). Generated chunks reuse
their own trajectory (``x0`` at the probe step); observed context chunks are re-noised to ``tau*``
(noise seeded by the run seed and chunk index) and predicted once against the retained cache. One
mask per chunk, shared by all layers and heads.

Window timing (the paper's "after the recent-window delay"; the authors' harness compacts chunk
``i`` just before chunk ``i + 2w``'s ``t = 0`` pass): with ``w = recent_chunks``, chunk ``i`` is
compacted in :meth:`DeCoPrune.before_clean` of chunk ``i + 2w``, so chunk ``i + 2w``'s denoising
calls and its probe still see chunks ``i .. i + 2w - 1`` dense, and every chunk sees the newest
``2w`` committed chunks dense (the record of the chunk before the window stays dense until the next
compaction). Static banks of head-split subclasses keep the plain window (sink + newest ``w``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from cmbench.cache import Bank, ChunkInfo, KVCache
from cmbench.cache.kv_cache import BankSelector
from cmbench.errors import ConfigError
from cmbench.methods.base import ChunkSignals, Needs, ScoredMethod, finite_priority
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import register

SCORE_TYPES = ("mse", "mse_over_no_context", "chunk_normalised")
EPS = 1e-12


def token_mse(a: torch.Tensor, b: torch.Tensor, geometry) -> torch.Tensor:
    """Mean squared difference per token.

    Parameters
    ----------
    a, b : Tensor, shape ``[B, C, f, h, w]``
    geometry : Geometry

    Returns
    -------
    Tensor, shape ``[f * tokens_per_frame]``, float32: mean over batch and the token's values.
    """
    return geometry.tokenize((a.float() - b.float()) ** 2).mean(dim=(0, 2))


@register
@dataclass
class DeCoPrune(ScoredMethod):
    """Denoising-consistency pruning (paper defaults: probe step 2 of (999, 957, 899, 702), gamma 0.10).

    Parameters
    ----------
    gamma : float
        Keep threshold on the score. Its useful range depends on the backbone's latent scale; use budget
        mode (``quota_pr``) to compare methods at a matched pruning ratio.
    probe_step : int
        Zero-based denoising step whose ``x0`` is the probe (``tau* = timesteps[probe_step]``).
    score : {"mse", "mse_over_no_context", "chunk_normalised"}
        ``mse``: the paper's score. ``mse_over_no_context``: divided by the same error of a prediction
        with no history (one extra call per chunk). ``chunk_normalised``: divided by the chunk's mean
        finite score (gamma becomes relative).
    post_prune : bool
        Probe against the cache as it will be after this chunk's delayed compaction (one extra call per
        generated chunk), so a repeat of a place is not judged redundant against a copy about to go.
    """

    name = "decoprune"
    description = ("tokens whose probe-step `x0` disagrees with the final `x0` (score > gamma), one mask for all "
                   "layers")
    paper = "https://arxiv.org/abs/2609.39096"
    paper_title = "DeCoPrune, arXiv 2609.39096"
    # a larger threshold prunes more; scores are MSEs of latents, whose scale differs by backbone: 8 decades
    knob = Knob("gamma", 1e-6, 1e2, increasing=True, log=True)

    knob_minimums: ClassVar[dict[str, float]] = {"gamma": 0, "probe_step": 0}

    gamma: float = 0.10
    probe_step: int = 2
    score: str = "mse"
    post_prune: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score not in SCORE_TYPES:
            raise ConfigError(f"{self.name}: score must be one of {', '.join(SCORE_TYPES)}, got {self.score!r}")

    def needs(self) -> Needs:
        return Needs(
            probe_step=self.probe_step,
            no_context_probe=self.score == "mse_over_no_context",
            post_prune_probe=self.post_prune,
        )

    def token_scores(self, sig: ChunkSignals) -> torch.Tensor:
        """Score per token of the chunk, ``[L]`` float32 (may hold non-finite values)."""
        if sig.x0_probe is None:
            raise RuntimeError(f"{self.name} needs the probe-step x0 of chunk {sig.chunk.index}")
        score = token_mse(sig.x0_probe, sig.x0_final, sig.geometry)
        if self.score == "mse_over_no_context":
            if sig.x0_no_context is None:
                raise RuntimeError(f"{self.name} needs the no-context prediction of chunk {sig.chunk.index}")
            score = score / (token_mse(sig.x0_no_context, sig.x0_final, sig.geometry) + EPS)
        elif self.score == "chunk_normalised":
            finite = score[torch.isfinite(score)]
            mean = finite.mean() if len(finite) else torch.tensor(1.0)
            score = score / (mean + EPS)
        return score

    def keep_rule(self, score: torch.Tensor) -> torch.Tensor:
        """``bool [L]``: keep high scores; non-finite scores are kept."""
        return ~torch.isfinite(score) | (score > self.gamma)

    def priority(self, score: torch.Tensor) -> torch.Tensor:
        """Keep priority ``[L]`` for quota mode and bounded memory (higher is kept longer)."""
        return finite_priority(score)

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        score = self.token_scores(sig)
        cache.mark(sig.chunk.index, keep=self.keep_rule(score), priority=self.priority(score),
                   banks=self.scored_banks(cache))

    # ------------------------------------------------------------------ window timing
    def window(self, bank: Bank | None = None) -> int:
        """``2 * recent_chunks`` on scored banks (the delayed compaction), ``recent_chunks`` elsewhere."""
        return 2 * self.recent_chunks if bank is None or self.budgeted(bank) else self.recent_chunks

    def selector(self, cache: KVCache, newest: ChunkInfo, incoming: int = 0) -> BankSelector:
        """After a commit: the scored banks were compacted before the chunk's ``t = 0`` pass (kept as
        they are); the others by their rule."""
        inner = super().selector(cache, newest, incoming)
        return lambda bank: torch.ones(bank.n, dtype=torch.bool) if self.budgeted(bank) else inner(bank)

    def delayed_selector(self, cache: KVCache, chunk: ChunkInfo) -> BankSelector:
        """The compaction before the open chunk ``chunk``'s ``t = 0`` pass: chunk ``chunk - 2w`` leaves
        the window of the scored banks (by the keep rule, or decided by the budget); nothing elsewhere."""
        inner = ScoredMethod.selector(self, cache, chunk, chunk.length)
        return lambda bank: inner(bank) if self.budgeted(bank) else torch.ones(bank.n, dtype=torch.bool)

    def before_clean(self, cache: KVCache, chunk: ChunkInfo) -> None:
        cache.compact(self.delayed_selector(cache, chunk))

    def probe_hide(self, cache: KVCache):
        """The post-prune probe hides what :meth:`before_clean` of the open chunk will drop."""
        assert cache.current is not None, "the post-prune probe runs while a chunk is open"
        select = self.delayed_selector(cache, cache.current)
        return lambda bank: ~select(bank)
