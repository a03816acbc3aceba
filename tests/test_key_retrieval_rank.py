"""Key retrieval brings back the stored chunks whose keys the open chunk's queries score HIGHEST (mean
attention logit), each layer on its own queries."""

from __future__ import annotations

import torch

from cmbench.cache import KVCache
from cmbench.methods import BeforeChunk
from cmbench.methods.key_retrieval import KeyRetrieval
from fakes import fake_geometry

G = fake_geometry(num_layers=2, num_heads=2, head_dim=6)  # chunks of 2 frames x 4 tokens = 8
AXIS = torch.eye(G.head_dim)[0]  # the direction every query and key lies along


def key_scale(chunk: int) -> float:
    """Signed length along :data:`AXIS` of every key of ``chunk``: its logit against a unit query.

    Chunk 1 points against the axis, chunk 2 along it (the longest), chunk 3 along it but short; the
    chunks kept on the device (the sink 0, chunks 4 and 5) never compete.
    """
    return {0: 0.0, 1: -1.0, 2: 2.0, 3: 0.5, 4: 0.0, 5: 0.0}[chunk]


def stored_cache(method: KeyRetrieval) -> tuple[KVCache, object]:
    """Chunks 0..5 written with keys ``key_scale(chunk) * AXIS`` (plus a little noise), chunks 1..3 in
    the host store (the retrieval candidates), chunk 6 open. The banks are unbounded, so the test reads
    the ranking alone, not the device budget's size.

    Returns
    -------
    cache : KVCache
    info : ChunkInfo
        The open chunk 6.
    """
    cache = KVCache.from_geometry(G, store=method.host_store())
    for c in range(6):
        info = cache.begin_chunk(c, c * G.chunk_frames, G.chunk_frames)
        for layer in range(G.num_layers):
            gen = torch.Generator().manual_seed(10 * c + layer)
            noise = 0.01 * torch.randn(1, info.length, G.num_heads, G.head_dim, generator=gen)
            k = key_scale(c) * AXIS + noise
            cache.attend(layer, k, k, torch.randn(k.shape, generator=gen))
        cache.commit_chunk()
    cache.compact(lambda bank: (bank.field("chunk") == 0) | (bank.field("chunk") >= 4), to_store=True)
    return cache, cache.begin_chunk(6, 6 * G.chunk_frames, G.chunk_frames)


def restored(chunks_back: int, signs: list[float]) -> list[list[int]]:
    """Stored chunks each layer's bank holds after key retrieval for chunk 6.

    Parameters
    ----------
    chunks_back : int
        Retrieval budget in chunks.
    signs : list of float
        Per layer, the open chunk's mean query is ``sign * AXIS`` on every head.

    Returns
    -------
    list of list of int: per layer, the retrieved chunks (those kept on the device left out), sorted.
    """
    method = KeyRetrieval(recent_chunks=1, retrieval_frames=chunks_back * G.chunk_frames)
    cache, info = stored_cache(method)
    queries = {layer: (s * AXIS).expand(1, G.num_heads, G.head_dim).clone() for layer, s in enumerate(signs)}
    method.before_denoise(cache, BeforeChunk(geometry=G, chunk=info, phase="generation", queries=queries))
    return [sorted(set(bank.field("chunk").tolist()) - {0, 4, 5}) for bank in cache.all_banks()]


def test_the_most_relevant_stored_chunk_is_the_one_restored():
    """Logits against a query along the axis: chunk 1 -1, chunk 2 +2, chunk 3 +0.5. One chunk back
    restores chunk 2 (the highest), never chunk 1 (the lowest)."""
    assert restored(1, [1.0, 1.0]) == [[2], [2]]


def test_two_chunks_back_are_the_two_highest_scoring():
    """Two chunks back: chunks 2 and 3 (logits 2 and 0.5), leaving out chunk 1 (logit -1)."""
    assert restored(2, [1.0, 1.0]) == [[2, 3], [2, 3]]


def test_each_layer_ranks_the_stored_chunks_by_its_own_queries():
    """Layer 1's queries point against the axis, so its logits flip (chunk 1 +1, chunk 2 -2, chunk 3
    -0.5): it restores chunk 1 while layer 0 restores chunk 2."""
    assert restored(1, [1.0, -1.0]) == [[2], [1]]


def test_equally_relevant_chunks_go_to_the_earlier_ones_however_many_compete():
    """Every stored key is zero, so every candidate scores 0: the earliest candidates are brought back, also
    among 120 (an unstable sort reorders ties once there are many)."""
    method = KeyRetrieval(recent_chunks=1, retrieval_frames=3 * G.chunk_frames)
    cache = KVCache.from_geometry(G, store=method.host_store())
    n = 122
    for c in range(n):
        info = cache.begin_chunk(c, c * G.chunk_frames, G.chunk_frames)
        for layer in range(G.num_layers):
            k = torch.zeros(1, info.length, G.num_heads, G.head_dim)
            cache.attend(layer, k, k, k)
        cache.commit_chunk()
    cache.compact(lambda bank: (bank.field("chunk") == 0) | (bank.field("chunk") == n - 1), to_store=True)
    info = cache.begin_chunk(n, n * G.chunk_frames, G.chunk_frames)
    queries = {layer: AXIS.expand(1, G.num_heads, G.head_dim).clone() for layer in range(G.num_layers)}
    method.before_denoise(cache, BeforeChunk(geometry=G, chunk=info, phase="generation", queries=queries))
    assert [sorted(set(bank.field("chunk").tolist()) - {0, n - 1}) for bank in cache.all_banks()] == [[1, 2, 3]] * 2
