"""Make a backbone run split over a sequence-parallel group."""

from __future__ import annotations

from cmbench.parallel.cache import ShardedKVCache
from cmbench.parallel.sequence import SequenceGroup, check_heads


def split_backbone(backbone, group: SequenceGroup):
    """Run ``backbone``'s DiT with Ulysses sequence parallelism over ``group`` (in place; returns it).

    Its DiT then runs each chunk's token shard on this rank and attends through the all-to-alls, and
    :func:`cmbench.generation.prefill` builds a :class:`ShardedKVCache` of this rank's heads
    (``backbone.make_cache``). Raises a one-line :class:`~cmbench.errors.ConfigError` when the group
    size does not divide the heads or a frame's tokens.
    """
    g = backbone.geometry
    check_heads(g.num_heads, g.tokens_per_frame, group.size)
    backbone.dit.sequence = group if group.size > 1 else None
    backbone.make_cache = ShardedKVCache.factory(group) if group.size > 1 else None
    return backbone
