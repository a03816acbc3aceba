"""Registered methods that need an optional package (``kvpress``: ``pip install -e '.[kvpress]'``): the
tests that build them run where the package is installed (CI installs it) and skip, naming the extra,
where it is not (the README's test command alone)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

import pytest

from cmbench.methods.registry import method_names

NEEDS = {"kvpress": "kvpress", "kvpress_decoding": "kvpress"}
"""Method name -> the package it imports when built."""


def buildable(name: str) -> bool:
    """Whether ``name`` can be built here (its optional package, if any, is installed)."""
    package = NEEDS.get(name)
    return package is None or importlib.util.find_spec(package) is not None


def method_params(names: Iterable[str] | None = None) -> list:
    """``names`` (default: every registered method) as parameters, each needing a missing package skipped."""
    return [pytest.param(n, marks=pytest.mark.skipif(not buildable(n), reason=f"{NEEDS.get(n)} is not installed: "
                                                     f"pip install -e '.[{NEEDS.get(n)}]'"))
            for n in (method_names() if names is None else names)]
