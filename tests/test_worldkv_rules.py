"""WorldKV's numeric rules: the anchor-novelty compression ranks tokens by cosine similarity (not by dot
product), a chunk's pose is the mean over all of its frames, and the retrieval budget is
``retrieval_frames // chunk_frames`` chunks (rounded down)."""

from __future__ import annotations

import math

import pytest
import torch

from cmbench.cache import KVCache
from cmbench.methods import BeforeChunk
from cmbench.methods.worldkv import WorldKV, anchor_novelty_keep, pose_distance
from fakes import fake_geometry


def write_chunks(cache: KVCache, geometry, chunks: range) -> None:
    """Commit chunks of seeded random K/V into ``cache``.

    Parameters
    ----------
    cache : KVCache
    geometry : Geometry
        The cache's geometry (chunks of ``geometry.chunk_frames`` frames, chunk ``c`` starting at frame
        ``c * chunk_frames``).
    chunks : range
        Chunk indices to write, in order.
    """
    for c in chunks:
        info = cache.begin_chunk(c, c * geometry.chunk_frames, geometry.chunk_frames)
        for layer in range(geometry.num_layers):
            gen = torch.Generator().manual_seed(10 * c + layer)
            k, v = (torch.randn(1, info.length, geometry.num_heads, geometry.head_dim, generator=gen) for _ in range(2))
            cache.attend(layer, k, k, v)
        cache.commit_chunk()


def poses_from_x(xs: list[float]) -> torch.Tensor:
    """Camera-to-world poses ``[F, 4, 4]`` (float64): identity rotations, camera at ``(x, 0, 0)``.

    Parameters
    ----------
    xs : list of float
        Camera position along x of each latent frame.
    """
    poses = torch.eye(4, dtype=torch.float64).repeat(len(xs), 1, 1)
    poses[:, 0, 3] = torch.tensor(xs, dtype=torch.float64)
    return poses


def retrieval_setup(method: WorldKV, geometry) -> tuple[KVCache, object]:
    """A cache with chunks 0..5 written, chunks 1..3 moved to the host store, chunk 6 open.

    With ``sink_chunks=1`` and ``recent_chunks=1``, chunks 1, 2 and 3 are the retrieval candidates (the
    device keeps the sink and chunks 4 and 5). The banks are unbounded, so the test reads the retrieval
    rule alone, not the device budget's size.

    Returns
    -------
    cache : KVCache
    info : ChunkInfo
        The open chunk 6.
    """
    cache = KVCache.from_geometry(geometry, store=method.host_store())
    write_chunks(cache, geometry, range(6))
    cache.compact(lambda bank: (bank.field("chunk") == 0) | (bank.field("chunk") >= 4), to_store=True)
    info = cache.begin_chunk(6, 6 * geometry.chunk_frames, geometry.chunk_frames)
    return cache, info


def restored_chunks(cache: KVCache) -> list[list[int]]:
    """Source chunks brought back into each bank of ``cache`` (the sink and chunks 4, 5 left out), sorted,
    one list per bank."""
    return [sorted(set(bank.field("chunk").tolist()) - {0, 4, 5}) for bank in cache.all_banks()]


# ------------------------------------------------------------------ anchor novelty: cosine, not dot product
def test_anchor_novelty_ranks_by_cosine_so_a_long_key_pointing_away_is_kept_over_a_short_aligned_one():
    """The store keeps the tokens least similar *in direction* to the anchor frame's mean key: a token's
    norm must not decide. Here the far-pointing tokens are long, so a dot product would keep the others."""
    T = 4
    keys = torch.zeros(1, 2, T, 1, 2)  # anchor frame + one frame of 4 tokens, one head, 2 channels
    keys[0, 0, :, 0] = torch.tensor([3.0, 0.0])  # anchor frame: mean key along x (norm 3)
    angles = torch.tensor([1.4, 1.2, 0.3, 0.1])  # far from x ... close to x
    norms = torch.tensor([20.0, 10.0, 0.1, 0.05])  # long ... short: dot products 10.2, 10.9, 0.29, 0.15
    keys[0, 1, :, 0, 0], keys[0, 1, :, 0, 1] = norms * angles.cos(), norms * angles.sin()
    keep = anchor_novelty_keep(keys, 0.5)  # 2 of the frame's 4 tokens
    assert keep[:T].all()  # the anchor frame whole
    assert keep[T:].nonzero().squeeze(1).tolist() == [0, 1]  # the two pointing away (angles 1.4 and 1.2)


def test_anchor_novelty_matches_a_cosine_reference_over_heads_and_channels():
    """Several frames, heads and widely spread norms: the kept tokens are the ``(f - 1) * ceil(r * T)``
    lowest cosines (over heads and channels) to the anchor frame's mean key, pooled over the frames."""
    gen = torch.Generator().manual_seed(3)
    f, T, H, D = 3, 6, 2, 3
    keys = torch.randn(1, f, T, H, D, generator=gen) + 1.5  # mostly positive cosines to the anchor's mean
    keys = keys * torch.logspace(-2, 2, f * T)[torch.randperm(f * T, generator=gen)].reshape(1, f, T, 1, 1)
    centroid = keys[0, 0].mean(dim=0).flatten()
    rest = keys[0, 1:].reshape((f - 1) * T, H * D)
    cosine = torch.nn.functional.cosine_similarity(rest, centroid[None], dim=1)
    dot = rest @ centroid
    per_frame = math.ceil(0.34 * T)  # 3
    by_cosine = sorted((T + torch.argsort(cosine)[: (f - 1) * per_frame]).tolist())
    by_dot = sorted((T + torch.argsort(dot)[: (f - 1) * per_frame]).tolist())
    assert by_cosine != by_dot  # the case tells the two rules apart
    keep = anchor_novelty_keep(keys, 0.34)
    assert keep.nonzero().squeeze(1).tolist() == list(range(T)) + by_cosine


# ------------------------------------------------------------------ pose: the mean over every frame of a chunk
@pytest.mark.parametrize("chunk_frames", [2, 3])
def test_a_chunks_pose_is_the_mean_over_all_its_frames_including_the_last(chunk_frames):
    """Each chunk's frames share one camera position except the last. Averaging over all frames, chunk 2
    sits exactly at the open chunk's mean position; leaving out the last frame (of the stored chunks, of
    the open chunk, or of both) makes chunk 1 the nearest instead."""
    g = fake_geometry(chunk_frames=chunk_frames)
    f = chunk_frames

    def chunk(first: float, mean: float) -> list[float]:  # f - 1 frames at ``first``, the last one so the mean is ``mean``
        return [first] * (f - 1) + [f * mean - (f - 1) * first]

    xs = (chunk(0.0, 0.0)  # chunk 0 (sink)
          + chunk(0.0, 0.0)  # chunk 1: mean 0, first frames 0
          + chunk(5.0, 2.0)  # chunk 2: mean 2, first frames 5
          + chunk(10.0, 10.0)  # chunk 3: far
          + chunk(0.0, 0.0)  # chunk 4 (on the device)
          + chunk(0.0, 0.0)  # chunk 5 (recent)
          + chunk(0.0, 2.0))  # chunk 6 (open): mean 2, first frames 0
    method = WorldKV(recent_chunks=1, retrieval_frames=f)  # one chunk back
    cache, info = retrieval_setup(method, g)
    method.before_denoise(cache, BeforeChunk(geometry=g, chunk=info, phase="generation", poses=poses_from_x(xs)))
    assert restored_chunks(cache) == [[2]] * g.num_layers


# ------------------------------------------------------------------ budget: retrieval_frames // chunk_frames
@pytest.mark.parametrize(("retrieval_frames", "chunks"), [(1, 0), (2, 1), (3, 1), (5, 2), (6, 3)])
def test_the_retrieval_budget_rounds_down_to_whole_chunks(retrieval_frames, chunks):
    """A budget of ``retrieval_frames`` latent frames brings back ``retrieval_frames // chunk_frames``
    whole chunks (2-frame chunks: 3 frames are one chunk, 1 frame is none) and restores exactly that many."""
    g = fake_geometry()  # chunks of 2 frames, 8 tokens
    method = WorldKV(recent_chunks=1, retrieval_frames=retrieval_frames)
    assert method.retrieved_chunks(g) == chunks
    xs = [0.0] * 2 + [1.0] * 2 + [2.0] * 2 + [3.0] * 2 + [9.0] * 4 + [0.0] * 2  # chunk 1 nearest, then 2, then 3
    cache, info = retrieval_setup(method, g)
    method.before_denoise(cache, BeforeChunk(geometry=g, chunk=info, phase="generation", poses=poses_from_x(xs)))
    assert restored_chunks(cache) == [list(range(1, 1 + chunks))] * g.num_layers


def test_a_candidate_at_the_current_pose_is_at_distance_zero_even_when_rounding_lifts_the_trace_above_3():
    """``R^T R`` of a float32 rotation can have a trace just above 3 (3.0000002): the angle's cosine
    is clamped to 1, so the candidate at the current pose is at distance 0, not NaN (a NaN would sort
    anywhere and the nearest chunk could go unretrieved)."""
    def turned(axis: int, angle: float) -> torch.Tensor:
        c, s = math.cos(angle), math.sin(angle)
        i, j = [k for k in range(3) if k != axis]
        r = torch.eye(3)
        r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
        return r

    turns = (turned(0, 0.1 * k) @ turned(1, 0.37 * k) @ turned(2, 0.73 * k) for k in range(200))
    rotation = next(r for r in turns if float((r.T @ r).diagonal().sum()) > 3.0)  # what the clamp is for
    current, other = torch.eye(4), torch.eye(4)
    current[:3, :3] = rotation
    other[:3, 3] = torch.tensor([1.0, 0.0, 0.0])
    distance = pose_distance(current, torch.stack([current, other]))
    assert torch.isfinite(distance).all() and float(distance[0]) == 0.0 and float(distance[1]) > 0.0
