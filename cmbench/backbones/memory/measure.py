"""Measured memory: the peak of allocated tensor bytes on a device, to check the plan against.

On CUDA the caching allocator keeps the numbers (``torch.cuda.max_memory_allocated``). Elsewhere
(CPU, the tests) :class:`PeakMemory` counts them itself: a ``TorchDispatchMode`` sees every tensor an
operator returns, adds the bytes of each new storage (not one of the operator's inputs: views and
in-place results are not allocations) and subtracts them when that storage is freed, so the peak is
exact for tensors made by operators while it is active (it does not see memory an operator uses
internally and frees before returning).
"""

from __future__ import annotations

import weakref
from typing import Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and repeats counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t.device.type == "meta":
            seen[id(t)] = t.numel() * t.element_size()
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())


def module_bytes(*modules: nn.Module) -> int:
    """Bytes of the parameters and buffers of ``modules``."""
    return tensor_bytes(t for m in modules for t in (*m.parameters(), *m.buffers()))


class _Counter(TorchDispatchMode):
    """Counts the live bytes of storages created on ``device`` while active."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.live = 0
        self.peak = 0
        self._tracked: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self._tracked.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.device == self.device}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device != self.device:
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in self._tracked or (storage.nbytes() and storage.data_ptr() in inputs):
                continue  # seen already, or a view / in-place result of an input (no new memory)
            nbytes = storage.nbytes()
            self._tracked.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, key, nbytes)
        return out


class PeakMemory:
    """Peak allocated tensor bytes on ``device`` while the context is active.

    Attributes
    ----------
    peak : int
        CUDA: ``max_memory_allocated`` during the context (everything allocated on the device, the
        bytes held at entry included). Other devices: the bytes held at entry (``baseline``, given by
        the caller, e.g. :func:`module_bytes` of the loaded models) plus the peak of tensors created
        inside the context and still alive at that moment.
    """

    def __init__(self, device: str | torch.device, baseline: int = 0) -> None:
        self.device = torch.device(device)
        self.baseline = int(baseline)
        self.peak = 0
        self._counter: _Counter | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._counter = _Counter(self.device)
            self._counter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
        else:
            assert self._counter is not None
            self._counter.__exit__(*exc)
            self.peak = self.baseline + self._counter.peak
