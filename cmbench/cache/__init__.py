"""KV cache runtime: banks with provenance, compaction, the PR ledger and RoPE re-indexing."""

from cmbench.cache.attention_stats import AttentionStats
from cmbench.cache.bank import Bank
from cmbench.cache.kv_cache import ChunkInfo, KVCache
from cmbench.cache.layout import HeadGroup, uniform_layout
from cmbench.cache.ledger import LedgerEntry, PRLedger
from cmbench.cache.store import HostStore, Segment

__all__ = ["AttentionStats", "Bank", "ChunkInfo", "HeadGroup", "HostStore", "KVCache", "LedgerEntry", "PRLedger", "Segment",
           "uniform_layout"]
