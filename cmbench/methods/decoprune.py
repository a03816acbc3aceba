"""DeCoPrune: keep the tokens the retained context could not predict (denoising consistency).

For every token ``p`` of a chunk (one DiT patch, ``C * ph * pw`` latent values)::

    score[p] = mean over the token's values of (x0_hat(tau*)[p] - x_final[p]) ** 2

and the token is kept iff ``score[p] > gamma`` (non-finite scores are kept). Generated chunks reuse
their own trajectory (``x0`` at the probe step); observed context chunks are re-noised to ``tau*``
(noise seeded by the run seed and chunk index) and predicted once against the retained cache. One
mask per chunk, shared by all layers and heads.

The probe may be the last step (the paper's probe-step ablation runs steps 1, 2 and 3 of
(999, 957, 899, 702)): a context chunk is then probed at 702 like at any level, while a generated
chunk's ``x0`` at the last step *is* its final ``x0``, so every score is 0 (``cosine``: 1) and the
threshold keeps none of its tokens once it leaves the dense window, as the authors' harness does
(docs/protocol.md); with ``post_prune`` the probe is its own call against the pruned cache, not 0.

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
from cmbench.methods.tempdiff import TempDiff

SCORE_TYPES = ("mse", "mse_over_no_context", "chunk_normalised", "normalized_mse", "cosine")
SIMILARITY_SCORES = ("cosine",)  # a high score means consistent: kept iff score <= gamma
CONTEXT_SELECTIONS = ("decoprune", "tempdiff")  # who chooses the context's tokens
EPS = 1e-12


def token_cosine(a: torch.Tensor, b: torch.Tensor, geometry) -> torch.Tensor:
    """Cosine similarity per token between its values in ``a`` and in ``b``.

    Parameters
    ----------
    a, b : Tensor, shape ``[B, C, f, h, w]``
    geometry : Geometry

    Returns
    -------
    Tensor, shape ``[f * tokens_per_frame]``, float32: over the token's values, batch entries side by side.
    """
    ta, tb = geometry.tokenize(a.float()), geometry.tokenize(b.float())  # [B, L, D]
    flat = lambda t: t.permute(1, 0, 2).reshape(t.shape[1], -1)  # noqa: E731
    return torch.nn.functional.cosine_similarity(flat(ta), flat(tb), dim=1, eps=1e-8)


def spatial_floor(keep: torch.Tensor, score: torch.Tensor, geometry, minimum: int, block: int,
                  floor_threshold: float) -> torch.Tensor:
    """Keep at least ``minimum`` tokens in every ``block x block`` block of token positions of every frame.

    In a block with fewer kept tokens, whose highest score is above ``floor_threshold``, the unkept
    tokens with the highest scores (ties: lower index) are kept too, as the authors' harness does
    (``methods/consistency.py``, ``apply_spatial_floor``).

    Parameters
    ----------
    keep : Tensor ``bool [L]``
        The rule's mask of one chunk, ``L = f * tokens_per_frame`` (frame-major, then row, then column).
    score : Tensor ``float [L]``
    geometry : Geometry
    minimum, block : int
    floor_threshold : float

    Returns
    -------
    Tensor ``bool [L]``: ``keep`` with the floor's tokens added.
    """
    rows, cols = geometry.token_rows, geometry.token_cols
    out = keep.clone()
    grid = torch.arange(len(keep)).reshape(-1, rows, cols)
    for frame in grid:
        for y in range(0, rows, block):
            for x in range(0, cols, block):
                idx = frame[y : y + block, x : x + block].reshape(-1)
                missing = minimum - int(out[idx].sum())
                values = score[idx]
                if missing <= 0 or not bool((values > floor_threshold).any()):
                    continue
                candidates = idx[~out[idx]]
                order = sorted(candidates.tolist(), key=lambda i: (-float(score[i]), i))
                out[order[:missing]] = True
    return out


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
        Zero-based denoising step whose ``x0`` is the probe (``tau* = timesteps[probe_step]``); any step of
        the schedule, the last included (a generated chunk then scores 0 everywhere, see above).
    score : {"mse", "mse_over_no_context", "chunk_normalised", "normalized_mse", "cosine"}
        ``mse``: the paper's score. ``mse_over_no_context``: divided by the same error of a prediction
        with no history (one extra call per chunk). ``chunk_normalised``: divided by the chunk's mean
        finite score (gamma becomes relative). The authors' harness's options
        (``methods/consistency.py``): ``normalized_mse``, divided by the token's energy in the final
        ``x0`` (mean of its squared values, at least 1e-8); ``cosine``, the cosine similarity of the
        token's probe and final values, kept iff ``score <= gamma`` (low agreement is kept).
    min_keep_per_block : int
        At least this many tokens kept in every ``block_tokens x block_tokens`` block of token
        positions of every frame (:func:`spatial_floor`; the harness's ``min_keep_per_spatial_block``);
        0 (default) is off.
    block_tokens : int
        Side of those blocks, in tokens (the harness's block size, 4).
    floor_threshold : float or None
        A block is topped up only when its highest score is above this (the harness's
        ``spatial_floor_threshold``); None: every block.
    context_only : bool
        Prune the context only: every generated chunk stays dense (the scores of generated chunks
        are still computed, unused).
    context_selection : {"decoprune", "tempdiff"}
        Who chooses the context's tokens: DeCoPrune's rule (default), or TempDiff's selection at its
        defaults (:class:`cmbench.methods.tempdiff.TempDiff`: the 1,657 least similar blocks, chosen at
        the end of the context), so the continuation policy alone differs from TempDiff's (the
        authors' "matched context" experiment, ``configs/experiment/matched_context.yaml``). The
        chosen context tokens leave DeCoPrune's delayed window as usual.
    post_prune : bool
        Probe against the cache as it will be after this chunk's delayed compaction (one extra call per
        generated chunk), so a repeat of a place is not judged redundant against a copy about to go.
    """

    name = "decoprune"
    family = "eviction"
    description = ("tokens whose probe-step `x0` disagrees with the final `x0` (score > gamma), one mask for all "
                   "layers")
    paper = "https://arxiv.org/abs/2609.39096"
    paper_title = "DeCoPrune, arXiv 2609.39096"
    # a larger threshold prunes more; scores are MSEs of latents, whose scale differs by backbone: 8 decades
    knob = Knob("gamma", 1e-6, 1e2, increasing=True, log=True)

    knob_minimums: ClassVar[dict[str, float]] = {"gamma": 0, "probe_step": 0, "min_keep_per_block": 0, "block_tokens": 1}

    gamma: float = 0.10
    probe_step: int = 2
    score: str = "mse"
    post_prune: bool = False
    min_keep_per_block: int = 0
    block_tokens: int = 4
    floor_threshold: float | None = None
    context_only: bool = False
    context_selection: str = "decoprune"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score not in SCORE_TYPES:
            raise ConfigError(f"{self.name}: score must be one of {', '.join(SCORE_TYPES)}, got {self.score!r}")
        if self.context_selection not in CONTEXT_SELECTIONS:
            raise ConfigError(f"{self.name}: context_selection must be one of {', '.join(CONTEXT_SELECTIONS)}, "
                              f"got {self.context_selection!r}")

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
        if self.score == "cosine":
            return token_cosine(sig.x0_probe, sig.x0_final, sig.geometry)
        score = token_mse(sig.x0_probe, sig.x0_final, sig.geometry)
        if self.score == "normalized_mse":
            energy = token_mse(sig.x0_final, torch.zeros_like(sig.x0_final), sig.geometry)
            score = score / energy.clamp_min(1e-8)
        elif self.score == "mse_over_no_context":
            if sig.x0_no_context is None:
                raise RuntimeError(f"{self.name} needs the no-context prediction of chunk {sig.chunk.index}")
            score = score / (token_mse(sig.x0_no_context, sig.x0_final, sig.geometry) + EPS)
        elif self.score == "chunk_normalised":
            finite = score[torch.isfinite(score)]
            mean = finite.mean() if len(finite) else torch.tensor(1.0)
            score = score / (mean + EPS)
        return score

    def keep_rule(self, score: torch.Tensor) -> torch.Tensor:
        """``bool [L]``: keep high scores (low ones for a similarity score); non-finite scores are kept."""
        if self.score in SIMILARITY_SCORES:
            return ~torch.isfinite(score) | (score <= self.gamma)
        return ~torch.isfinite(score) | (score > self.gamma)

    def keep_mask(self, score: torch.Tensor, sig: ChunkSignals) -> torch.Tensor:
        """``bool [L]``: the chunk's mask: every token of a generated chunk with ``context_only``, else
        :meth:`keep_rule` topped up by the spatial floor (``min_keep_per_block``)."""
        if self.context_only and sig.phase == "generation":
            return torch.ones(len(score), dtype=torch.bool)
        keep = self.keep_rule(score)
        if self.min_keep_per_block:
            floor = float("-inf") if self.floor_threshold is None else float(self.floor_threshold)
            keep = spatial_floor(keep, score, sig.geometry, self.min_keep_per_block, self.block_tokens, floor)
        return keep

    def priority(self, score: torch.Tensor) -> torch.Tensor:
        """Keep priority ``[L]`` for quota mode and bounded memory (higher is kept longer)."""
        return finite_priority(-score if self.score in SIMILARITY_SCORES else score)

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        if self.context_selection == "tempdiff" and sig.phase == "context":  # the context is TempDiff's choice
            TempDiff(sink_chunks=self.sink_chunks, recent_chunks=self.recent_chunks).decide(cache, sig)
            return
        score = self.token_scores(sig)
        cache.mark(sig.chunk.index, keep=self.keep_mask(score, sig), priority=self.priority(score),
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
