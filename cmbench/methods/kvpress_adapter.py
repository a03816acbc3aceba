"""kvpress: NVIDIA's LLM presses (their own ``score``) deciding which history tokens a video DiT keeps.

A kvpress "press" (``pip install 'cmbench[kvpress]'``) is a dataclass whose
``score(module, hidden_states, keys, values, attentions, kwargs)`` returns one score per cached token
and key-value head, shape ``(batch, heads, tokens)``; its ``compress`` keeps the
``int(tokens * (1 - compression_ratio))`` highest. The adapter calls that ``score`` at CMBench's
compaction points and keeps the top tokens under CMBench's shared sink, recent window and PR ledger:

- when a chunk leaves the recent window, every layer's keys and values of that chunk (its candidate
  tokens) go to ``score`` in kvpress's layout ``(B, H, L, D)``; each head keeps its ``n_kept`` highest
  scores (ties: the earlier token), in a bank of its own, so heads choose separately;
- a press that reads the probe (attention weights or hidden states) gets the attention of every query
  of the newest chunk, measured in a probe before its first denoising call (``Needs.query_probe``):
  ``attentions`` ``(B, H, 1, L)`` is the mean over those queries of each query's softmax over the
  candidates' keys (``1 / sqrt(D)`` scaled, renormalised over the candidates: they are what the press
  ranks), computed a head and a block of queries at a time (:func:`probe_attention`); a probe has
  thousands of queries at real shapes, so their ``(B, H, Lq, L)`` weights are never held at once.
  ``hidden_states`` ``(B, 1, H * D)`` is their mean rotated query (no runnable press reads it once
  attention weights are given);
- a press's own normalisation applies only where its geometry holds. ObservedAttentionPress divides
  the summed attention a key receives by ``arange(L, 0, -1)``, the number of queries a causal prefill
  lets see it; every probe query sees every candidate, so its score here is the plain mean over the
  queries (:func:`press_scores`). TOVAPress scores ``attentions[..., -1:, :-1]``, the newest token's
  attention, and pads the last key with the maximum so it is always kept: here the one row is the mean
  over the newest chunk's queries, and the padded key is the candidate chunk's last token (the bottom
  right of its last frame), so each head spends one kept slot of every chunk on that position;
- ``module`` is a :class:`PressModule`: the attributes presses look up on an LLM attention layer
  (``layer_idx``, ``head_dim``, ``config.num_attention_heads`` ...), and nothing else, so a press that
  needs an LLM's projections, rotary module or generation loop fails on it (``ls method`` lists the
  presses that run; docs/methods.md says why each other one cannot).

Scores are computed with the global random state saved and restored around each call, seeded from
the run seed, chunk and layer: a stochastic press is reproducible and cannot shift the sampler's noise.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar, Iterator, Mapping

import torch

from cmbench.cache import Bank, ChunkInfo, HeadGroup, KVCache
from cmbench.cache.attention_stats import frame_mass
from cmbench.errors import ConfigError
from cmbench.hashing import derive_seed
from cmbench.methods.base import BeforeChunk, ChunkSignals, Needs, ScoredMethod, finite_priority
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import register

EXTRA = "pip install -e '.[kvpress]'"  # the optional dependency (README, "kvpress presses")


def import_kvpress() -> Any:
    """The installed ``kvpress`` module; a one-line :class:`ConfigError` naming the extra when absent.

    Importing kvpress wraps every attention function transformers registers (its head-wise masking
    during LLM generation), and the wrapper's signature breaks other models' attention calls (SAM 2 in
    the deep scorer, in the same process). The adapter calls presses' ``score`` alone, never that
    generation path, so the import leaves transformers' attention functions as it found them.
    """
    try:
        with attention_functions_kept():
            return importlib.import_module("kvpress")
    except ImportError as err:
        raise ConfigError(f"method kvpress needs the optional package kvpress ({err}): {EXTRA}") from err


@contextmanager
def attention_functions_kept() -> Iterator[None]:
    """Put back, on leaving, each of transformers' registered attention functions replaced inside."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as functions

    before = dict(functions.items())
    try:
        yield
    finally:
        for name, function in before.items():
            if functions[name] is not function:
                functions[name] = function


@dataclass
class PressModule:
    """What a press reads from the attention layer it compresses, for one DiT layer.

    Attributes
    ----------
    layer_idx : int
    head_dim : int
    num_key_value_groups : int
        Query heads per key-value head (1: a DiT has as many key heads as query heads).
    config : SimpleNamespace
        ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``hidden_size``,
        ``num_hidden_layers`` and ``_attn_implementation`` (``"eager"``: attention weights are given).
    """

    layer_idx: int
    head_dim: int
    num_key_value_groups: int
    config: SimpleNamespace

    @classmethod
    def of(cls, layer: int, num_layers: int, num_heads: int, head_dim: int) -> "PressModule":
        config = SimpleNamespace(num_attention_heads=num_heads, num_key_value_heads=num_heads, head_dim=head_dim,
                                 hidden_size=num_heads * head_dim, num_hidden_layers=num_layers,
                                 _attn_implementation="eager")
        return cls(layer, head_dim, 1, config)


def press_class(spec: str) -> type:
    """The press class ``spec`` names: a class exported by kvpress (``KnormPress``) or an import path
    to a user's own (``mypkg.presses.MyPress``); it must have a ``score`` method."""
    if "." in spec:
        module, _, name = spec.rpartition(".")
        try:
            with attention_functions_kept():  # the user's module may import kvpress
                cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"method kvpress: press {spec!r} cannot be imported ({err})") from err
    else:
        kvpress = import_kvpress()
        cls = getattr(kvpress, spec, None)
        if cls is None:
            raise ConfigError(f"method kvpress: kvpress {kvpress_version()} has no press {spec!r}; "
                              f"`python -m cmbench ls method` lists the presses that run")
    if not (isinstance(cls, type) and callable(getattr(cls, "score", None))):
        raise ConfigError(f"method kvpress: press {spec!r} is not a press class with a score method")
    return cls


def build_press(spec: str | Mapping[str, Any], compression_ratio: float) -> Any:
    """A press from a class name or import path, or a mapping ``{_target_: name or path, field: value}``
    of the press's own fields; its ``compression_ratio`` (if it has one) set to ``compression_ratio``."""
    options: dict[str, Any] = dict(spec) if isinstance(spec, Mapping) else {"_target_": spec}
    target = options.pop("_target_", None)
    if not isinstance(target, str) or not target:
        raise ConfigError(f"method kvpress: press {spec!r} needs a '_target_' (a press class name or import path)")
    cls = press_class(target)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if "compression_ratio" in fields:
        options["compression_ratio"] = compression_ratio
    try:
        return cls(**options)
    except (TypeError, ValueError, AssertionError) as err:
        raise ConfigError(f"method kvpress: press {target} cannot be built with {options} ({err})") from err


@dataclass
class Probe:
    """What a press reads of the probe for one layer's candidates.

    Attributes
    ----------
    hidden : Tensor, shape ``[B, 1, H * D]``
        The probe's mean rotated query (``hidden_states``).
    attentions : Tensor, shape ``[B, H, 1, L]``, float32
        The mean over the probe's queries of each one's softmax over the ``L`` candidates' keys.
    """

    hidden: torch.Tensor
    attentions: torch.Tensor

    @classmethod
    def of(cls, queries: torch.Tensor, keys: torch.Tensor) -> "Probe":
        """From every probe query ``[B, Lq, H, D]`` and the candidates' keys ``[B, H, L, D]``."""
        b, _, h, d = queries.shape
        return cls(queries.mean(dim=1).reshape(b, 1, h * d), probe_attention(queries, keys))


def probe_attention(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Mean over queries of each query's softmax attention over the candidates.

    Computed one batch row, head and block of queries at a time (:func:`~cmbench.cache.attention_stats.frame_mass`
    with one bin per key): the float32 logits held at once stay under its ``BLOCK_BYTES``.

    Parameters
    ----------
    queries : Tensor, shape ``[B, Lq, H, D]``
        Every rotated query of the probe.
    keys : Tensor, shape ``[B, H, L, D]``
        The candidates' keys (moved to the queries' device).

    Returns
    -------
    Tensor, shape ``[B, H, 1, L]``, float32 on the CPU: each ``[b, h, 0]`` row sums to 1.
    """
    b, h, n, _ = keys.shape
    per_key = torch.arange(n)
    k = keys.to(queries.device).transpose(1, 2)  # [B, L, H, D], frame_mass's layout
    rows = [frame_mass(queries[i : i + 1], k[i : i + 1], per_key, n) for i in range(b)]  # [H, L] each
    return torch.stack(rows).unsqueeze(2)


def press_scores(press: Any, module: PressModule, keys: torch.Tensor, values: torch.Tensor,
                 probe: Probe | None, seed: int) -> torch.Tensor:
    """The press's own scores of the candidate tokens.

    Parameters
    ----------
    press : a kvpress press
    module : PressModule
    keys, values : Tensor, shape ``[B, H, L, D]``
        The candidates, in token order.
    probe : Probe or None
        ``hidden_states`` and ``attentions``; ``None``: both are ``None``.
    seed : int
        Seeds the global random state for the call (restored afterwards).

    Returns
    -------
    Tensor, shape ``[B, H, L]``, float32 on the CPU. A press scoring with kvpress's own
    ObservedAttentionPress ``score`` gets the plain mean over the probe's queries, ``attentions[:, :, 0]``:
    its causal-prefill normaliser ``arange(L, 0, -1)`` counts the queries that see each key under a causal
    mask, and every probe query sees every candidate.
    """
    b, h, n, d = keys.shape
    hidden = attentions = None
    if probe is not None:
        hidden = probe.hidden.to(keys.device, keys.dtype)
        attentions = probe.attentions.to(keys.device, keys.dtype)
    with torch.random.fork_rng(devices=[keys.device] if keys.device.type == "cuda" else []):
        torch.manual_seed(seed)
        if attentions is not None and scores_with_causal_normaliser(press):
            scores = attentions.sum(dim=2)  # [B, H, L]: one row, the mean over the probe's queries
        else:
            scores = press.score(module, hidden, keys, values, attentions, {})
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (b, h, n):
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ConfigError(f"method kvpress: {type(press).__name__}.score returned {shape}, expected {(b, h, n)} "
                          f"(batch, heads, tokens)")
    return scores.detach().float().cpu()


def scores_with_causal_normaliser(press: Any) -> bool:
    """Whether ``press`` scores with kvpress's own ObservedAttentionPress ``score`` (its class or a subclass
    that keeps it), which divides by the causal prefill's ``arange(L, 0, -1)``."""
    observed = observed_attention_score()
    return observed is not None and getattr(type(press), "score", None) is observed


@functools.cache
def observed_attention_score() -> Any:
    """kvpress's ObservedAttentionPress ``score`` function (``None`` without kvpress or that press)."""
    try:
        return getattr(getattr(import_kvpress(), "ObservedAttentionPress", None), "score", None)
    except ConfigError:
        return None


def top_tokens(scores: torch.Tensor, n_kept: int) -> torch.Tensor:
    """Keep mask ``bool [..., L]`` of the ``n_kept`` highest ``scores [..., L]`` (ties: the earlier token;
    NaN and +inf rank first, -inf last)."""
    order = torch.sort(finite_priority(scores), dim=-1, descending=True, stable=True).indices
    keep = torch.zeros(scores.shape, dtype=torch.bool)
    return keep.scatter_(-1, order[..., :n_kept], True)


def kept_count(tokens: int, compression_ratio: float) -> int:
    """Tokens a press keeps of ``tokens`` at ``compression_ratio``, as kvpress counts: the integer part
    of ``tokens * (1 - compression_ratio)``, at least one (``tokens`` when nothing is compressed)."""
    return tokens if compression_ratio <= 0 else max(1, int(tokens * (1 - compression_ratio)))


def held_kv(banks: list[Bank], first: ChunkInfo, last: ChunkInfo,
            num_heads: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Keys and values of the tokens of chunks ``first`` to ``last`` each bank of one layer still holds,
    in kvpress's layout.

    Returns
    -------
    (keys, values, gids): keys and values ``[B, H, n, D]`` in head order and token order, and each bank's
    token ids ``long [n]`` (increasing).

    Raises
    ------
    RuntimeError
        The banks hold different numbers of those tokens (kvpress scores one length for every head).
    """
    keys: list[torch.Tensor | None] = [None] * num_heads
    values: list[torch.Tensor | None] = [None] * num_heads
    held = []
    for bank in banks:
        gid = bank.field("gid")
        rows = ((gid >= first.gid_start) & (gid < last.gid_start + last.length)).nonzero().flatten()
        held.append(gid[rows])
        k, v = bank.gather(rows)  # [B, n, Hg, D]
        for i, head in enumerate(bank.group.heads):
            keys[head], values[head] = k[:, :, i], v[:, :, i]
    if len({len(g) for g in held}) > 1:
        raise RuntimeError(f"kvpress: layer {banks[0].layer}'s heads hold {sorted({len(g) for g in held})} tokens of "
                           f"chunks {first.index}-{last.index}: a press scores one length for every head")
    return torch.stack(keys, dim=1), torch.stack(values, dim=1), held  # type: ignore[arg-type]


@contextmanager
def ratio_set(press: Any, ratio: float) -> Iterator[None]:
    """The press's ``compression_ratio`` (when it has one) set to ``ratio`` inside, put back on leaving."""
    if not hasattr(press, "compression_ratio"):
        yield
        return
    before = press.compression_ratio
    press.compression_ratio = ratio
    try:
        yield
    finally:
        press.compression_ratio = before


def trial_chunk(heads: int = 8, tokens: int = 64, head_dim: int = 4) -> tuple[torch.Tensor, ...]:
    """A small random chunk to try a press on (its own generator: the global random state is untouched).

    Returns
    -------
    (keys, values, queries): ``[1, heads, tokens, head_dim]`` twice and the probe's ``[1, tokens, heads, head_dim]``.
    """
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(1, heads, tokens, head_dim, generator=gen), torch.randn(1, heads, tokens, head_dim, generator=gen),
            torch.randn(1, tokens, heads, head_dim, generator=gen))


def try_press(press: Any) -> tuple[str | None, bool]:
    """``(why it cannot run or None, whether it reads the probe)`` for ``press`` on :func:`trial_chunk`:
    it runs when its score works with a probe query, and reads the probe when it fails without one."""
    keys, values, queries = trial_chunk()
    module = PressModule.of(0, 1, keys.shape[1], keys.shape[3])
    try:
        press_scores(press, module, keys, values, Probe.of(queries, keys), 0)
    except Exception as err:  # noqa: BLE001 - a press that cannot run on a DiT fails in its own way
        return f"{type(err).__name__}: {err}".splitlines()[0], True
    try:
        press_scores(press, module, keys, values, None, 0)
    except Exception:  # noqa: BLE001 - whatever a press raises without the probe
        return None, True
    return None, False


def runnable_presses() -> tuple[str, list[str]]:
    """``(kvpress version, names)``: the presses of kvpress's exported list that the adapter runs, each
    built with its defaults (:func:`try_press`)."""
    kvpress = import_kvpress()
    names = []
    for name in kvpress.__all__:
        try:
            press = build_press(name, 0.5)
        except ConfigError:
            continue
        if try_press(press)[0] is None:
            names.append(name)
    return kvpress_version(), names


def kvpress_version() -> str:
    """The installed kvpress's version."""
    from importlib.metadata import version

    return version("kvpress")


@register
@dataclass
class KVPress(ScoredMethod):
    """A kvpress press's own ``score`` ranks each chunk's tokens per head when it leaves the recent window.

    Each head of each layer keeps ``int(L * (1 - compression_ratio))`` of the chunk's ``L`` tokens (at
    least one), the highest by the press's score on that layer's keys and values; sink and window as
    every method, one bank per head.

    Parameters
    ----------
    press : str or mapping
        A press class exported by kvpress (``KnormPress``), an import path to your own press class
        (``mypkg.presses.MyPress``), or a mapping ``{_target_: <either>, <press field>: value}``.
    compression_ratio : float
        Fraction of each chunk's tokens pruned when it leaves the window (also set on the press).
    """

    name = "kvpress"
    family = "eviction"
    description = ("a kvpress press's own `score` ranks each chunk's tokens per head as it leaves the window; "
                   "`compression_ratio` of them are pruned (`method.press=KnormPress`)")
    paper = "https://github.com/NVIDIA/kvpress"
    paper_title = "NVIDIA kvpress"
    knob = Knob("compression_ratio", 0.0, 0.999)  # a larger ratio prunes more
    knob_minimums: ClassVar[dict[str, float]] = {"compression_ratio": 0}

    press: Any = "KnormPress"
    compression_ratio: float = 0.5
    recent_chunks: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.compression_ratio < 1:
            raise ConfigError(f"method {self.name}: compression_ratio must be below 1, got {self.compression_ratio}")
        self._press = build_press(self.press, self.compression_ratio)
        why, self._reads_probe = try_press(self._press)
        if why is not None:
            raise ConfigError(f"method {self.name}: method.press: press {type(self._press).__name__} cannot run on a DiT ({why}); "
                              f"`python -m cmbench ls method` lists the presses that do (docs/methods.md: why not)")
        self._probe: tuple[int, dict[int, Probe]] | None = None

    def needs(self) -> Needs:
        """The newest chunk's queries, when the press reads the probe."""
        return Needs(query_probe=self._reads_probe)

    def layout(self, geometry) -> list[list[HeadGroup]]:
        """One bank per head: each head keeps its own tokens."""
        return [[HeadGroup((h,), "all", self.max_history_tokens) for h in range(geometry.num_heads)]
                for _ in range(geometry.num_layers)]

    def before_denoise(self, cache: KVCache, sig: BeforeChunk) -> None:
        """With a press that reads the probe: the attention of every probe query over the tokens the press
        scores at this chunk's commit (:meth:`scored_chunks`, already held as they will be), per layer
        (:class:`Probe`)."""
        if not self._reads_probe:
            return
        if sig.probe_queries is None:
            raise RuntimeError(f"kvpress: no probe queries for chunk {sig.chunk.index}")
        span = self.scored_chunks(cache, sig.chunk.index)
        if span is None:
            return
        self._probe = (sig.chunk.index, {layer: Probe.of(sig.probe_queries[layer], held_kv(banks, *span, cache.num_heads)[0])
                                         for layer, banks in enumerate(cache.banks)})

    def scored_chunks(self, cache: KVCache, index: int) -> tuple[ChunkInfo, ChunkInfo] | None:
        """``(first, last)``: the chunks whose held tokens the press scores at the commit of chunk ``index``
        (the one leaving the window; ``None``: none, a sink chunk or before the window fills)."""
        leaving = index - self.window()
        return None if leaving < self.sink_chunks else (cache.chunk(leaving), cache.chunk(leaving))

    def kept(self, cache: KVCache, bank: Bank, first: ChunkInfo, last: ChunkInfo, held: int) -> tuple[int, float]:
        """``(tokens kept per head, the press's compression_ratio while it scores)`` of the ``held`` candidates
        in ``bank``: ``int(held * (1 - compression_ratio))``, at least one.

        Raises
        ------
        RuntimeError
            The bank does not hold the whole chunk (it was compacted before it left the window).
        """
        if held != last.length:
            raise RuntimeError(f"kvpress: layer {bank.layer} heads {bank.group.heads} hold {held} of chunk "
                               f"{last.index}'s {last.length} tokens when it leaves the window")
        return kept_count(held, self.compression_ratio), self.compression_ratio

    def decide(self, cache: KVCache, sig: ChunkSignals) -> None:
        """Mark the tokens of :meth:`scored_chunks` with the press's scores (keep flags and priorities, per head)."""
        span = self.scored_chunks(cache, sig.chunk.index)
        if span is None:
            return
        probes = None
        if self._reads_probe:
            if self._probe is None or self._probe[0] != sig.chunk.index:
                raise RuntimeError(f"kvpress: no probe queries for chunk {sig.chunk.index}")
            probes = self._probe[1]
        for layer, banks in enumerate(cache.banks):
            keys, values, held = held_kv(banks, *span, cache.num_heads)
            n_kept, ratio = self.kept(cache, banks[0], *span, len(held[0]))
            module = PressModule.of(layer, cache.num_layers, cache.num_heads, cache.head_dim)
            probe = None if probes is None else probes[layer]
            if probe is not None and probe.attentions.shape[-1] != keys.shape[2]:
                raise RuntimeError(f"kvpress: layer {layer} holds {keys.shape[2]} candidates at chunk {sig.chunk.index}'s "
                                   f"commit, its probe scored {probe.attentions.shape[-1]}")
            seed = derive_seed("kvpress", sig.seed, span[1].index, layer)
            with ratio_set(self._press, ratio):
                scores = press_scores(self._press, module, keys, values, probe, seed).mean(dim=0)  # [H, n]
            for bank, gids in zip(banks, held):
                score = scores[list(bank.group.heads)].mean(dim=0)  # [n]: one decision per bank
                cache.mark_tokens(gids, keep=top_tokens(score, n_kept), priority=finite_priority(score), banks=[bank])
