"""``SequenceGroup.gather``: every rank's sequence shard back in token order, for a batch of several videos.

The split runs in tests/test_parallel.py use one video per batch, where the batch and rank axes of the
gathered tensor cannot be told apart; here the batch holds two different videos. ``dist.all_gather`` is
replaced by one that hands each rank the shards :meth:`SequenceGroup.shard` cut from the unsplit tensor,
as a real group would, so the check needs no process group.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from cmbench.parallel import SequenceGroup


def fake_all_gather(shards: list[torch.Tensor], rank: int):
    """An ``all_gather`` of a group whose rank ``i`` contributes ``shards[i]``.

    Parameters
    ----------
    shards : list of Tensor
        Every rank's shard, in rank order.
    rank : int
        The calling rank (its own contribution must be its shard).

    Returns
    -------
    callable
        ``(parts, tensor, group=None) -> None`` filling ``parts`` in rank order, as ``dist.all_gather``.
    """
    def all_gather(parts, tensor, group=None):
        assert torch.equal(tensor, shards[rank]), "the rank sent something other than its own shard"
        for part, shard in zip(parts, shards, strict=True):
            part.copy_(shard)
    return all_gather


@pytest.mark.parametrize("size", [2, 4])
def test_gather_of_a_batch_of_two_restores_every_videos_tokens_on_every_rank(monkeypatch, size):
    """Gathering the shards of a ``[B=2, f*T, C]`` chunk gives the unsplit chunk back on every rank: each
    video's tokens, frame-major, none of the other video's."""
    batch, frames, tokens, channels = 2, 3, 8, 5
    x = torch.randn(batch, frames * tokens, channels, generator=torch.Generator().manual_seed(0))
    shards = [SequenceGroup(r, size).shard(x, frames) for r in range(size)]
    assert all(s.shape == (batch, frames * tokens // size, channels) for s in shards)
    for rank in range(size):
        monkeypatch.setattr(dist, "all_gather", fake_all_gather(shards, rank))
        got = SequenceGroup(rank, size).gather(shards[rank], frames)
        assert got.shape == x.shape
        torch.testing.assert_close(got, x, rtol=0, atol=0)


def test_gather_inverts_the_shard_of_each_frame_by_hand(monkeypatch):
    """Two ranks, two videos, two frames of four tokens: rank 0 holds tokens 0-1 of each frame, rank 1
    tokens 2-3; the gather interleaves them frame by frame, each video apart."""
    # token value = 100 * video + 10 * frame + token: readable when it fails
    x = torch.tensor([[[100.0 * b + 10 * f + t] for f in range(2) for t in range(4)] for b in range(2)])
    rank0 = torch.tensor([[[100.0 * b + 10 * f + t] for f in range(2) for t in (0, 1)] for b in range(2)])
    rank1 = torch.tensor([[[100.0 * b + 10 * f + t] for f in range(2) for t in (2, 3)] for b in range(2)])
    torch.testing.assert_close(SequenceGroup(0, 2).shard(x, 2), rank0, rtol=0, atol=0)
    torch.testing.assert_close(SequenceGroup(1, 2).shard(x, 2), rank1, rtol=0, atol=0)
    monkeypatch.setattr(dist, "all_gather", fake_all_gather([rank0, rank1], 1))
    got = SequenceGroup(1, 2).gather(rank1, 2)
    assert got[..., 0].tolist() == x[..., 0].tolist()
