"""Content and config hashes that key the feature cache and identify a scorer in every record."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

# Bump when a change of the scoring code changes numbers: it invalidates every cached feature.
SCORER_VERSION = 1


def array_hash(arrays: Iterable[np.ndarray]) -> str:
    """Hash of the content (dtype, shape, bytes) of a sequence of arrays.

    Parameters
    ----------
    arrays : iterable of ndarray
        E.g. one ``uint8 [F, H, W, 3]`` video, or several reference frames ``uint8 [H, W, 3]``.

    Returns
    -------
    str
        32 hex digits (BLAKE2b-128).
    """
    digest = hashlib.blake2b(digest_size=16)
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def json_hash(value: Any) -> str:
    """Hash of a JSON-serialisable value with sorted keys (32 hex digits)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def config_hash(result_config: Mapping[str, Any]) -> str:
    """Identity of a scorer: the knobs that change its numbers plus :data:`SCORER_VERSION`.

    Returns
    -------
    str
        12 hex digits, written into every record and used as the feature-cache folder.
    """
    return json_hash({"scorer_version": SCORER_VERSION, "config": dict(result_config)})[:12]
