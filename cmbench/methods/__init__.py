"""KV-cache compression methods: one file per method, all registered by name.

``build_method(cfg)`` turns a ``configs/method/<name>.yaml`` (plus overrides) into a method;
``describe_methods()`` lists what is registered. See :mod:`cmbench.methods.base` for the contract.
"""

from cmbench.methods import (  # noqa: F401  (importing registers each method)
    decoprune,
    decoprune_hs,
    decoprune_reverse,
    dummyforcing,
    forcingkv,
    fullkv,
    key_retrieval,
    kvpress_adapter,
    kvpress_decoding,
    random_tokens,
    streaming,
    tempcache,
    tempdiff,
    worldkv,
    worldkv_fixed_window,
)
from cmbench.methods.base import BeforeChunk, ChunkSignals, Method, Needs, ScoredMethod
from cmbench.methods.registry import build_method, describe_methods, method_class, method_names, register

__all__ = [
    "BeforeChunk",
    "ChunkSignals",
    "Method",
    "Needs",
    "ScoredMethod",
    "build_method",
    "describe_methods",
    "method_class",
    "method_names",
    "register",
]
