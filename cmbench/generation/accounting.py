"""Attention work of a continuation, counted at every model call: deterministic, unlike seconds.

:class:`CallRecorder` stands in for a backbone and logs, at each ``denoise`` call, the history keys
every layer-head reads (what the PR ledger logs once per chunk, here for every call, the method's
extra probe calls included) and the tokens of the chunk being denoised. From that log:

- :func:`attention_flops`: ``4 B L D (n + L)`` per layer-head and call (``Q K^T`` and ``P V``), with
  ``n`` the head's visible history keys and ``L`` the chunk's tokens;
- :func:`keys_per_token`: keys read per generated token, summed over layers, heads and calls.

Both depend only on what the method kept, never on the machine, so two runs of one config give the
same numbers and a method's cost ratio to FullKV is a speed-up figure no machine load can move.
"""

from __future__ import annotations

from typing import Any

from cmbench.cache import KVCache


class CallRecorder:
    """A backbone proxy that logs, for every ``denoise`` call, the history keys each head reads.

    Attributes
    ----------
    calls : list of int
        Per call, the visible history tokens summed over layer-heads (the chunk being denoised
        excluded).
    lengths : list of int
        Per call, the tokens ``L`` of the chunk being denoised (its queries, and its own keys).

    Every other attribute is the wrapped backbone's.
    """

    def __init__(self, backbone: Any) -> None:
        self.inner = backbone
        self.geometry = backbone.geometry
        self.calls: list[int] = []
        self.lengths: list[int] = []

    def denoise(self, x_t, t, cache: KVCache, frame_start, cond):
        self.calls.append(sum(len(cache.visible_history(b)) * b.num_heads for b in cache.all_banks()))
        self.lengths.append(cache.current.length if cache.current is not None else 0)
        return self.inner.denoise(x_t, t, cache, frame_start, cond)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _pairs(calls: list[int], geometry, lengths: list[int] | None) -> list[tuple[int, int]]:
    lengths = [geometry.tokens_per_chunk] * len(calls) if lengths is None else lengths
    if len(lengths) != len(calls):
        raise ValueError(f"{len(calls)} calls but {len(lengths)} chunk lengths")
    return list(zip(calls, lengths))


def attention_flops(calls: list[int], geometry, batch: int, lengths: list[int] | None = None) -> float:
    """``4 B L D`` per (query, key) pair (``Q K^T`` and ``P V``), over every layer-head and call.

    Parameters
    ----------
    calls : list of int
        :attr:`CallRecorder.calls`.
    geometry : cmbench.backbones.base.Geometry
    batch : int
    lengths : list of int, optional
        :attr:`CallRecorder.lengths` (default: full chunks, ``geometry.tokens_per_chunk``).
    """
    heads = geometry.num_layers * geometry.num_heads
    return float(sum(4 * batch * L * geometry.head_dim * (c + L * heads) for c, L in _pairs(calls, geometry, lengths)))


def keys_per_token(calls: list[int], geometry, generated_tokens: int, lengths: list[int] | None = None) -> float:
    """Keys read per generated token: ``sum over calls of L (n_total + L * layers * heads)`` divided
    by the tokens generated (per batch element), ``n_total`` the call's visible history summed over
    layer-heads."""
    if generated_tokens <= 0:
        raise ValueError(f"generated_tokens must be positive, got {generated_tokens}")
    heads = geometry.num_layers * geometry.num_heads
    return float(sum(L * (c + L * heads) for c, L in _pairs(calls, geometry, lengths))) / generated_tokens
