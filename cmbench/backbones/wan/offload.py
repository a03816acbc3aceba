"""Host-memory KV offload: the cache lives in host RAM and is staged to the GPU one layer at a time.

A one-minute FullKV context of LingBot World v2 14B is ~300 GB of keys and values (1560 tokens x 40
layers x 20 KiB per latent frame), more than a GPU holds. :class:`HostOffloadAttention` wraps a
:class:`~cmbench.cache.kv_cache.KVCache` whose banks are kept on the host: for each layer's ``attend``
it copies that layer's history (plus room for the current chunk's slot) to the compute device, lets
the cache attend there, writes the slot rows back to the host bank and drops the device copy. Every
other cache operation (commit, compaction, re-index, fork) then runs on the host tensors.

Staging is synchronous: one copy of a layer's history per model call, not overlapped with compute
(the authors' runtime overlaps the next layer's copy with the current layer). Memory on the device
is bounded by one layer's history; PCIe bandwidth bounds the speed.
"""

from __future__ import annotations

import torch

from cmbench.cache.kv_cache import KVCache


class HostOffloadAttention:
    """The :class:`~cmbench.backbones.dit.Attention` backend of a host-resident KV cache.

    Parameters
    ----------
    cache : KVCache
        The cache the generation loop drives; its banks are moved to ``host`` on first use.
    host : str or torch.device
        Where banks are kept between calls (``"cpu"``).
    """

    def __init__(self, cache: KVCache, host: str | torch.device = "cpu") -> None:
        self.cache = cache
        self.host = torch.device(host)
        self.staged_bytes = 0  # bytes copied to the device so far (history + slot rows)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Same contract as :meth:`KVCache.attend`: ``q, k, v`` and the result are ``[B, L, H, D]``."""
        L = q.shape[1]
        banks = self.cache.banks[layer]
        resident = {}
        for bank in banks:
            if bank.k is None:
                continue  # the first write allocates on the compute device; moved to the host below
            bank.unshare()  # a task's fork owns its host rows before they are staged
            bank.reserve(bank.n + L, bank.k)  # host room for history + slot
            host_k, host_v = bank.storage()
            resident[id(bank)] = (host_k, host_v)
            rows = bank.n + L
            bank.k = host_k[:, :rows].to(q.device, copy=True)
            bank.v = host_v[:, :rows].to(q.device, copy=True)
            self.staged_bytes += 2 * bank.k.numel() * bank.k.element_size()
        try:
            out = self.cache.attend(layer, q, k, v)
        finally:
            for bank in banks:
                staged_k, staged_v = bank.k, bank.v
                if staged_k is None or staged_v is None:
                    continue
                if id(bank) in resident:
                    host_k, host_v = resident[id(bank)]
                    host_k[:, bank.n : bank.n + L] = staged_k[:, bank.n : bank.n + L].to(self.host)
                    host_v[:, bank.n : bank.n + L] = staged_v[:, bank.n : bank.n + L].to(self.host)
                    bank.k, bank.v = host_k, host_v
                else:
                    bank.k, bank.v = staged_k.to(self.host, copy=True), staged_v.to(self.host, copy=True)
        return out
