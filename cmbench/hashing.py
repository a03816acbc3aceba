"""Seeds and identities in one place: every seed and every hash CMBench derives comes from here.

Seeds are pure functions of their parts, so resumed, sharded and sequential runs draw the same
numbers. Hashes identify what decides a number (a resolved config, array content, a file's bytes)
and never depend on dict order, the machine or the process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch


def derive_seed(*parts: object, bits: int = 63) -> int:
    """A seed of ``bits`` bits from any parts (SHA-256 of the parts joined by ``:``).

    Parameters
    ----------
    *parts : object
        E.g. ``(seed, "noise", chunk)``; each is turned into text with ``str``.
    bits : int
        The seed's width (63 for torch generators, 31 for task seeds written into records).
    """
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << bits) - 1)


def task_seed(global_seed: int, task_id: str) -> int:
    """A task's seed from (global seed, task_id): independent of order, shard and resume (31 bits)."""
    return derive_seed(int(global_seed), task_id, bits=31)


def seeded_generator(*parts: object) -> torch.Generator:
    """A CPU generator seeded with :func:`derive_seed` of ``parts`` (e.g. seed, stream, chunk)."""
    return torch.Generator().manual_seed(derive_seed(*parts))


def sequence_seed(*keys: int) -> int:
    """A 32-bit seed from integer keys via numpy's ``SeedSequence`` (MiniWorld's build tree)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1)[0])


def json_digest(value: Any) -> str:
    """BLAKE2b-128 of a JSON-serialisable value with sorted keys (32 hex digits)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def config_hash(config: Any, digits: int = 10) -> str:
    """Short stable identity of a resolved (JSON-able) config: the first ``digits`` of its digest."""
    return json_digest(config)[:digits]


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
        digest.update(memoryview(array).cast("B"))  # type: ignore[arg-type]  # numpy arrays export the buffer protocol
    return digest.hexdigest()


def frames_hash(batches: Iterable[np.ndarray]) -> str:
    """Hash of a video's frames given in consecutive batches; any batching of the same frames gives
    the same hash, so a video decoded a batch at a time is named without holding it whole.

    Parameters
    ----------
    batches : iterable of ndarray, ``[B_i, H, W, C]``
        The frames in order; every batch has the same dtype and frame shape.

    Returns
    -------
    str
        32 hex digits (BLAKE2b-128 of the dtype, the whole video's shape and the frames' bytes).
    """
    content = hashlib.blake2b(digest_size=16)
    head: tuple[str, tuple[int, ...]] | None = None
    count = 0
    for batch in batches:
        batch = np.ascontiguousarray(batch)
        if head is None:
            head = (batch.dtype.str, batch.shape[1:])
        elif (batch.dtype.str, batch.shape[1:]) != head:
            raise ValueError(f"frame batches differ: {head[0]} {head[1]} then {batch.dtype.str} {batch.shape[1:]}")
        content.update(memoryview(batch).cast("B"))  # type: ignore[arg-type]  # numpy arrays export the buffer protocol
        count += len(batch)
        del batch  # released before the next batch is read
    if head is None:
        raise ValueError("no frames to hash")
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{head[0]}{(count, *head[1])}".encode())
    digest.update(content.digest())
    return digest.hexdigest()


def file_hash(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    """SHA-256 of a file's bytes (64 hex digits), read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()
