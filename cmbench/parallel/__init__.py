"""One model over several ranks with torch.distributed: Ulysses sequence parallelism in the causal DiT.

With ``P`` ranks in a sequence group, every rank runs the DiT outside attention on its shard of each
chunk's tokens (a ``1/P`` slice of every latent frame's tokens); around self-attention an all-to-all
turns the sequence shard into a head shard (``heads / P`` heads of every token), each rank's KV cache
holds only those heads, and a second all-to-all turns the output back (as Wan2.1's and LingBot-World's
``xdit_context_parallel`` and the authors' runtime do; the cache policy runs after the all-to-all).

- :mod:`cmbench.parallel.sequence`: the sequence group, the shard of a chunk's tokens, the all-to-alls;
- :mod:`cmbench.parallel.cache`: :class:`ShardedKVCache`, the cache of one rank's heads, whose accounting
  (visible tokens, stored bytes), attention statistics and key reads are reduced over the group so a
  method decides, and the PR ledger records, exactly what one process would;
- :mod:`cmbench.parallel.split`: :func:`split_backbone`, which makes a backbone run split.
"""

from cmbench.parallel.cache import ShardedKVCache
from cmbench.parallel.sequence import SequenceGroup, UlyssesAttention, check_heads
from cmbench.parallel.split import split_backbone

__all__ = ["SequenceGroup", "ShardedKVCache", "UlyssesAttention", "check_heads", "split_backbone"]
