"""The AR generation loop: the only module that wires backbone + method + KV cache + ledger.

Two calls per context and task (two tasks share one context)::

    prefilled = prefill(backbone, method, context_latents, cond, seed)          # once per context
    result = continue_task(backbone, prefilled, cond, n_frames, seed)           # once per task

``prefill`` writes the context chunk by chunk (the clean K/V of each chunk by a ``t = 0`` call; the
method's re-noise probe first, where it wants one), lets the method compact after every chunk, and
re-indexes the temporal RoPE of the cached keys at the end.

Three method hooks per chunk, in timeline order: ``before_denoise(cache, before)`` with the chunk open
before its first model call (a retrieval method restores stored tokens here; with
``Needs.query_probe`` the first call is first run in a probe to give it the chunk's queries; the PR
ledger records right after it, so restored tokens count as seen); ``before_clean(cache, chunk)`` once the chunk's
denoising calls and probes are done, right before its ``t = 0`` pass (the chunk is open: e.g.
DeCoPrune compacts the chunk two back here, so this chunk's denoising and probe still saw it dense);
then ``after_chunk(cache, signals)`` once the chunk is committed. ``continue_task`` forks the prefilled
cache and generates the continuation chunk by chunk with the sampler; the PR ledger records what each
chunk saw. Prefill and continuation are timed separately (the paper's FPS counts the continuation).

Seeds: the context probe's noise comes from ``(seed, "context-probe", chunk)``; a generated chunk's
starting noise from ``(seed, "noise", chunk)`` and stochastic-sampler noise from ``(seed, "step", chunk)``.

Hooks: both calls take ``on_chunk_end(cache, signals)``, called after the method has decided and the
cache has been compacted for every committed chunk (as diffusers pipelines call
``callback_on_step_end``), and ``on_before_clean(cache, chunk)``, called right before every chunk's
``t = 0`` pass (after the method's own ``before_clean``), and ``on_before_denoise(cache, chunk)``, called
after the method's ``before_denoise``, so instruments (a keep-pattern recorder,
invariant checks) observe the loop without patching the method. The loop also times the method's decisions (``decide_seconds``).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from cmbench.cache import AttentionStats, ChunkInfo, KVCache, PRLedger
from cmbench.cache.quantized import StorageFormat
from cmbench.errors import ConfigError
from cmbench.methods.base import BeforeChunk, ChunkSignals, Method, Needs
from cmbench.generation.sampler import FlowMatchSampler, renoise
from cmbench.hashing import seeded_generator


ChunkHook = Callable[[KVCache, ChunkSignals], None]
"""``on_chunk_end(cache, signals)``: called after each committed chunk's decision and compaction."""

CleanHook = Callable[[KVCache, ChunkInfo], None]
"""``on_before_clean(cache, chunk)``: called with the chunk open, after the method's ``before_clean``,
right before the chunk's ``t = 0`` pass."""


@dataclass(frozen=True)
class GenerationSettings:
    """Knobs of the loop shared by every method.

    Parameters
    ----------
    sampler : FlowMatchSampler
        Timesteps (and mode) of every generated chunk; the probe level comes from its timesteps.
    reindex : bool
        Apply the temporal RoPE re-index to the cached context keys at the context -> generation
        boundary (``False`` for the ablation).
    reindex_recent : int
        ``N_r``: context frames nearest the boundary that keep their true positions.
    reindex_virtual_length : float
        ``L_virt``: the whole context is squeezed into this many frames.
    compute_attention : bool
        ``False``: the cache stores, compacts and accounts exactly as usual but skips the attention
        arithmetic (its outputs are zeros): PR and memory at a real model's scale on a CPU
        (:mod:`cmbench.benchmarks.pr_at_scale`), never for generating video.
    storage : StorageFormat
        How the cache's banks store history (``fp``: the model's dtype; ``kivi``, ``qvg``: quantized,
        :mod:`cmbench.cache.quantized`), whatever the method.
    cache_dtype : str or None
        The precision the cache stores its full-precision rows in (``"bfloat16"``, ``"float16"``,
        ``"float32"``: :meth:`KVCache.store_in`); ``None``: the model's compute precision.
    """

    sampler: FlowMatchSampler = field(default_factory=FlowMatchSampler)
    reindex: bool = True
    reindex_recent: int = 8
    reindex_virtual_length: float = 17.0
    compute_attention: bool = True
    storage: StorageFormat = StorageFormat()
    cache_dtype: str | None = None


@dataclass(kw_only=True)
class PrefilledContext:
    """A context written into a cache, ready to be forked per task (built with keyword arguments only).

    Attributes
    ----------
    cache : KVCache
        After the last context chunk's compaction and the re-index.
    method : Method
    settings : GenerationSettings
    context_frames : int
        ``q0``, latent frames of the context.
    next_chunk : int
        Index of the first generated chunk.
    last_chunk : Tensor or None, shape ``[B, C, f, h, w]``
        The last context chunk (methods that compare with the previous chunk read it).
    batch : int
    like : Tensor
        A scalar with the context's dtype and device (generated latents follow it).
    ledger : PRLedger
        Context phase.
    kept_tokens : dict[int, int]
        Tokens of each context chunk still stored (in layer 0's first bank) after prefill.
    seconds : float
        Wall time of the prefill.
    seed : int
    decide_seconds : float
        Of ``seconds``, the time the method spent deciding and compacting.
    """

    cache: KVCache
    method: Method
    settings: GenerationSettings
    context_frames: int
    next_chunk: int
    last_chunk: torch.Tensor | None
    batch: int
    like: torch.Tensor
    ledger: PRLedger
    kept_tokens: dict[int, int]
    seconds: float
    seed: int
    decide_seconds: float = 0.0


@dataclass
class Continuation:
    """One task's continuation.

    Attributes
    ----------
    latents : Tensor, shape ``[B, C, n_frames, h, w]``
    ledger : PRLedger
        Generation phase: PR (Eq. 4) and peak stored K/V bytes (the prefilled history included).
    kept_tokens : dict[int, int]
        Tokens of every chunk (context and generated) still stored in layer 0's first bank at the end,
        e.g. to give :class:`RandomTokens` another method's per-chunk counts.
    seconds : float
        Wall time of the continuation only (no prefill, no decoding).
    cache : KVCache
        The task's cache after the last chunk (drop it to free its memory).
    attention : dict[int, AttentionStats]
        Attention recorded at the first call of the generated chunks listed in ``record_attention_at``.
    decide_seconds : float
        Of ``seconds``, the time the method spent deciding and compacting.
    """

    latents: torch.Tensor
    ledger: PRLedger
    kept_tokens: dict[int, int]
    seconds: float
    cache: KVCache
    attention: dict[int, AttentionStats] = field(default_factory=dict)
    decide_seconds: float = 0.0

    def summary(self, method: Method | None = None) -> dict[str, Any]:
        """JSON-ready: realised PR (and the budget target, if any), peak bytes, seconds, per-chunk rows."""
        out = self.ledger.summary()
        out["continuation_seconds"] = self.seconds
        out["latent_frames"] = int(self.latents.shape[2])
        quota_pr = getattr(method, "quota_pr", None)  # quota-mode methods only
        if quota_pr is not None:
            out["quota_pr"] = quota_pr
        return out


class _Loop:
    """State of one phase: backbone, method, cache, ledger and the signals of the previous chunk."""

    def __init__(self, backbone, method: Method, cache: KVCache, ledger: PRLedger, settings: GenerationSettings,
                 cond: Any, seed: int, context_frames: int, previous: torch.Tensor | None,
                 on_chunk_end: ChunkHook | None, on_before_clean: CleanHook | None = None,
                 on_before_denoise: CleanHook | None = None, poses: torch.Tensor | None = None) -> None:
        self.backbone, self.method, self.cache, self.ledger = backbone, method, cache, ledger
        self.settings, self.cond, self.seed = settings, cond, seed
        self.geometry = backbone.geometry
        self.needs: Needs = method.needs()
        self.context_frames = context_frames
        self.previous = previous
        self.on_chunk_end = on_chunk_end
        self.on_before_clean = on_before_clean
        self.on_before_denoise = on_before_denoise
        self.poses = poses
        self.decide_seconds = 0.0

    def denoise(self, x: torch.Tensor, t: float, frame_start: int) -> torch.Tensor:
        return self.backbone.denoise(x, t, self.cache, frame_start, self.cond)

    def recorder(self, info, wanted: bool):
        """Attention recorder for a call of chunk ``info``: the method's (with its key frames) when it
        asked for this chunk, a plain one when ``wanted``, else none."""
        if self.needs.attention_chunk == info.index:
            return self.cache.record_attention(self.method.attention_key_frames(self.geometry, info))
        return self.cache.record_attention() if wanted else nullcontext()

    def open_chunk(self, chunk: int, frame_start: int, frames: int, first_call: tuple[torch.Tensor, float],
                   phase: str) -> ChunkInfo:
        """Begin a chunk, let the method act before its first model call (``first_call``: that call's
        input and noise level, run in a probe when the method wants the chunk's queries), then record
        what the chunk sees in the ledger."""
        info = self.cache.begin_chunk(chunk, frame_start, frames)
        queries = every = None
        if self.needs.query_probe:
            with self.cache.probe(), self.cache.record_queries() as recorded:
                self.denoise(first_call[0], first_call[1], frame_start)
            every = dict(recorded)
            queries = {layer: q.mean(dim=1) for layer, q in every.items()}
        start = time.perf_counter()
        self.method.before_denoise(self.cache, BeforeChunk(geometry=self.geometry, chunk=info, phase=phase,
                                                           poses=self.poses, queries=queries, probe_queries=every))
        del every  # every query of every layer: let go once the method has read them
        self.decide_seconds += time.perf_counter() - start
        if self.on_before_denoise is not None:
            self.on_before_denoise(self.cache, info)
        self.ledger.record(self.cache)
        return info

    def clean_pass(self, x0: torch.Tensor, info, record: bool) -> AttentionStats | None:
        """The method's ``before_clean`` hook, then the ``t = 0`` pass writing the chunk's clean K/V.

        With ``record`` (context chunks: their only model call) returns the attention the method asked
        for at this chunk, if it did.
        """
        start = time.perf_counter()
        self.method.before_clean(self.cache, info)
        self.decide_seconds += time.perf_counter() - start
        if self.on_before_clean is not None:
            self.on_before_clean(self.cache, info)
        with self.recorder(info, False) if record else nullcontext() as recorded:
            self.denoise(x0, 0.0, info.frame_start)
        return recorded

    def probe_calls(self, x_t: torch.Tensor, t: float, frame_start: int, x0: torch.Tensor | None) -> dict:
        """The probe-step predictions the method needs (``x0`` = the trajectory's own, if any)."""
        out = {}
        if self.needs.post_prune_probe or x0 is None:
            hide = self.method.probe_hide(self.cache) if self.needs.post_prune_probe else None
            with self.cache.probe(hide=hide):
                x0 = self.denoise(x_t, t, frame_start)
        out["x0_probe"] = x0
        if self.needs.no_context_probe:
            with self.cache.probe(history=False):
                out["x0_no_context"] = self.denoise(x_t, t, frame_start)
        return out

    def context_chunk(self, x0: torch.Tensor, chunk: int, frame_start: int) -> None:
        """Observed chunk ``x0 [B, C, f, h, w]``: optional re-noise probe, then the clean write."""
        info = self.open_chunk(chunk, frame_start, x0.shape[2], (x0, 0.0), "context")
        extra = {}
        if self.needs.probe_step is not None:
            t = self.settings.sampler.levels[self.needs.probe_step]
            noise = torch.randn(x0.shape, generator=seeded_generator(self.seed, "context-probe", chunk)).to(x0)
            extra = self.probe_calls(renoise(x0, noise, t), t, frame_start, None)
        attention = self.clean_pass(x0, info, record=True)
        self.finish(ChunkSignals(geometry=self.geometry, chunk=info, phase="context", generated_index=None,
                                 context_frames=self.context_frames, seed=self.seed, x0_final=x0,
                                 previous_final=self.previous, attention=attention, **extra))

    def generated_chunk(self, gen_index: int, chunk: int, frame_start: int, shape: tuple[int, ...],
                        like: torch.Tensor, record_attention: bool) -> tuple[torch.Tensor, AttentionStats | None]:
        """Sample one chunk of ``shape [B, C, f, h, w]``; returns its clean latents and any attention."""
        noise = torch.randn(shape, generator=seeded_generator(self.seed, "noise", chunk)).to(like)
        info = self.open_chunk(chunk, frame_start, shape[2], (noise, self.settings.sampler.levels[0]), "generation")
        extra: dict = {}
        stats: list[AttentionStats] = []

        def call(x: torch.Tensor, t: float, step: int) -> torch.Tensor:
            with self.recorder(info, record_attention) if step == 0 else nullcontext() as recorded:
                x0 = self.denoise(x, t, frame_start)
            if recorded is not None:
                stats.append(recorded)
            if step == self.needs.probe_step:
                extra.update(self.probe_calls(x, t, frame_start, x0))
            return x0

        trace = self.settings.sampler.sample(call, noise, seeded_generator(self.seed, "step", chunk))
        final = trace.final
        self.clean_pass(final, info, record=False)
        attention = stats[0] if stats else None
        self.finish(ChunkSignals(geometry=self.geometry, chunk=info, phase="generation", generated_index=gen_index,
                                 context_frames=self.context_frames, seed=self.seed, x0_final=final,
                                 previous_final=self.previous, attention=attention, **extra))
        return final, attention

    def finish(self, sig: ChunkSignals) -> None:
        self.cache.commit_chunk()
        self.ledger.note_memory(self.cache)
        start = time.perf_counter()
        self.method.after_chunk(self.cache, sig)
        self.decide_seconds += time.perf_counter() - start
        self.ledger.note_memory(self.cache)
        if self.on_chunk_end is not None:
            self.on_chunk_end(self.cache, sig)
        self.previous = sig.x0_final


def check_settings(method: Method, settings: GenerationSettings) -> None:
    """Refuse, with a one-line :class:`ConfigError`, a method whose needs the settings cannot meet (a
    ``probe_step`` that names no step of the sampler's timesteps).

    Every step may probe, the last one included: a context chunk is re-noised to that step's level and
    scored against the observed chunk; a generated chunk's ``x0`` at the last step is its final ``x0``,
    so its score is 0 for every token (as in the authors' harness; docs/protocol.md).

    Called by :func:`prefill` and :func:`continue_task`, and by a run before it loads any data or model.
    """
    needs = method.needs()
    steps = len(settings.sampler.timesteps)
    if needs.probe_step is not None and not 0 <= needs.probe_step < steps:
        raise ConfigError(
            f"{method.name}: method.probe_step={needs.probe_step} names no step of the {steps}-step schedule "
            f"{settings.sampler.timesteps}: it must be 0 .. {steps - 1} (zero-based)"
        )


def _check_latents(latents: torch.Tensor, geometry, what: str) -> None:
    g = geometry
    if latents.dim() != 5 or latents.shape[1] != g.latent_channels or tuple(latents.shape[3:]) != (
        g.latent_height, g.latent_width
    ):
        raise ConfigError(
            f"{what} must be [B, {g.latent_channels}, F, {g.latent_height}, {g.latent_width}], got {tuple(latents.shape)}"
        )
    if latents.shape[2] % g.chunk_frames:
        raise ConfigError(f"{what} has {latents.shape[2]} latent frames, not a multiple of the chunk size {g.chunk_frames}")


def camera_poses(backbone, method: Method, cond: Any) -> torch.Tensor | None:
    """The camera-to-world pose of every latent frame, ``[F, 4, 4]``, when the method needs poses
    (``None`` otherwise); a one-line :class:`ConfigError` when the backbone or the task has none."""
    if not method.needs().poses:
        return None
    read = getattr(backbone, "camera_poses", None)
    poses = None if read is None else read(cond)
    if poses is None:
        raise ConfigError(f"{method.name}: retrieves history by camera pose, but this task has no camera poses "
                          f"(MiniWorld's camera plan or a real task's camera extension gives them); use a pose-free "
                          f"method such as key_retrieval")
    return poses


def _kept_tokens(cache: KVCache) -> dict[int, int]:
    return cache.kept_per_chunk()


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def prefill(backbone, method: Method, context_latents: torch.Tensor, cond: Any, seed: int,
            settings: GenerationSettings | None = None, on_chunk_end: ChunkHook | None = None,
            on_before_clean: CleanHook | None = None, on_before_denoise: CleanHook | None = None) -> PrefilledContext:
    """Write a context into a fresh cache, chunk by chunk, under ``method``.

    Parameters
    ----------
    backbone : Backbone
    method : Method
    context_latents : Tensor, shape ``[B, C, F, h, w]``
        The observed context; ``F`` a multiple of ``geometry.chunk_frames`` (``F = 0`` allowed).
    cond : Any
        ``backbone.condition(task)`` covering at least the context frames.
    seed : int
        Seeds the re-noise probe (per chunk).
    settings : GenerationSettings, optional
    on_chunk_end : callable ``(cache, signals)``, optional
        Called after every context chunk's decision and compaction.
    on_before_clean : callable ``(cache, chunk)``, optional
        Called right before every context chunk's ``t = 0`` pass (after the method's ``before_clean``).
    on_before_denoise : callable ``(cache, chunk)``, optional
        Called before every context chunk's first model call (after the method's ``before_denoise``).

    Returns
    -------
    PrefilledContext
    """
    settings = settings or GenerationSettings()
    g = backbone.geometry
    check_settings(method, settings)
    _check_latents(context_latents, g, "context latents")
    capacity = None if method.max_history_tokens is None else method.max_history_tokens + g.tokens_per_chunk
    make_cache = getattr(backbone, "make_cache", None) or KVCache.from_geometry  # a split backbone's: its heads
    cache = make_cache(g, method.layout(g), capacity_limit=capacity, compute_attention=settings.compute_attention)
    if settings.storage.quantized:
        cache.use_storage(settings.storage)
    if settings.cache_dtype is not None:
        cache.store_in(getattr(torch, settings.cache_dtype))
    cache.store = method.host_store()
    if cache.store is not None:
        cache.store.shares = cache.store_shares()  # a split's bound is the model's
    ledger = PRLedger("context")
    q0, f = context_latents.shape[2], g.chunk_frames
    loop = _Loop(backbone, method, cache, ledger, settings, cond, seed, q0, None, on_chunk_end, on_before_clean,
                 on_before_denoise, camera_poses(backbone, method, cond))
    start = _now(context_latents.device)
    with torch.no_grad():
        for chunk in range(q0 // f):
            loop.context_chunk(context_latents[:, :, chunk * f : (chunk + 1) * f], chunk, chunk * f)
        if settings.reindex and q0:
            cache.reindex(q0, settings.reindex_recent, settings.reindex_virtual_length)
    seconds = _now(context_latents.device) - start
    return PrefilledContext(cache=cache, method=method, settings=settings, context_frames=q0, next_chunk=q0 // f,
                            last_chunk=loop.previous, batch=context_latents.shape[0],
                            like=context_latents.new_zeros(()), ledger=ledger, kept_tokens=_kept_tokens(cache),
                            seconds=seconds, seed=seed, decide_seconds=loop.decide_seconds)


def continue_task(backbone, prefilled: PrefilledContext, cond: Any, n_frames: int, seed: int,
                  method: Method | None = None, record_attention_at: tuple[int, ...] = (),
                  on_chunk_end: ChunkHook | None = None, on_before_clean: CleanHook | None = None,
                  share_prefill: bool = True, on_before_denoise: CleanHook | None = None) -> Continuation:
    """Generate ``n_frames`` latent frames after a prefilled context, on a fork of its cache.

    Parameters
    ----------
    backbone : Backbone
    prefilled : PrefilledContext
        From :func:`prefill` (left unchanged: the cache is forked).
    cond : Any
        ``backbone.condition(task)`` covering context and continuation frames.
    n_frames : int
        Latent frames to generate, a positive multiple of ``geometry.chunk_frames``.
    seed : int
        The task's seed (noise per chunk).
    method : Method, optional
        Task-specific knobs (e.g. :class:`RandomTokens` counts); must be the prefill method's class with
        the same bank layout. Default: the prefill method.
    record_attention_at : tuple of int
        Generated chunks (0-based) whose first denoising call's attention is returned (over every
        visible key; the method's own request, ``Needs.attention_chunk``, is served separately).
    on_chunk_end : callable ``(cache, signals)``, optional
        Called after every generated chunk's decision and compaction.
    on_before_clean : callable ``(cache, chunk)``, optional
        Called right before every generated chunk's ``t = 0`` pass (after the method's ``before_clean``).
    share_prefill : bool
        The fork reads the prefilled K/V in place (``KVCache.fork``); ``False``: a whole copy (the same
        continuation, more memory: for comparisons).
    on_before_denoise : callable ``(cache, chunk)``, optional
        Called before every generated chunk's first model call (after the method's ``before_denoise``).

    Returns
    -------
    Continuation
    """
    g = backbone.geometry
    method = prefilled.method if method is None else method
    if type(method) is not type(prefilled.method) or method.layout(g) != prefilled.method.layout(g):
        raise ConfigError(f"continue_task: method {method.name!r} does not match the prefill's {prefilled.method.name!r}")
    check_settings(method, prefilled.settings)
    f = g.chunk_frames
    if n_frames <= 0 or n_frames % f:
        raise ConfigError(f"continuation length {n_frames} must be a positive multiple of the chunk size {f}")
    cache = prefilled.cache.fork(headroom=n_frames * g.tokens_per_frame, share=share_prefill)
    ledger = PRLedger("generation")
    ledger.note_memory(cache)
    loop = _Loop(backbone, method, cache, ledger, prefilled.settings, cond, seed, prefilled.context_frames,
                 prefilled.last_chunk, on_chunk_end, on_before_clean, on_before_denoise,
                 camera_poses(backbone, method, cond))
    wanted = set(record_attention_at)
    like = prefilled.like
    shape = (prefilled.batch, g.latent_channels, f, g.latent_height, g.latent_width)
    finals, attention = [], {}
    start = _now(like.device)
    with torch.no_grad():
        for j in range(n_frames // f):
            final, stats = loop.generated_chunk(j, prefilled.next_chunk + j, prefilled.context_frames + j * f, shape,
                                                like, j in wanted)
            finals.append(final)
            if stats is not None and j in record_attention_at:
                attention[j] = stats
    seconds = _now(like.device) - start
    return Continuation(latents=torch.cat(finals, dim=2), ledger=ledger, kept_tokens=_kept_tokens(cache),
                        seconds=seconds, cache=cache, attention=attention, decide_seconds=loop.decide_seconds)

