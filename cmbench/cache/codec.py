"""The row-encoding interface of the quantized storage formats: a :class:`Codec` encodes one side (keys or
values) of a bank's history rows into ``uint8`` rows, and a :class:`Table` holds the parameters that several
rows share (:mod:`cmbench.cache.quantized` builds the formats' codecs on it, :mod:`cmbench.cache.lowrank`
its low-rank keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import torch

PARAM = torch.float16  # zero points, scales, means, centroids


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    """``float16 [..., P]`` -> ``uint8 [..., 2 P]``."""
    return x.contiguous().view(torch.uint8)


def from_bytes(raw: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., 2 P]`` -> ``float16 [..., P]``."""
    return raw.contiguous().view(PARAM)


@dataclass(frozen=True)
class Table:
    """Parameters shared by rows: ``keys long [g]`` (sorted, CPU) and ``data float16 [B, g, Hg, P, D]``."""

    keys: torch.Tensor
    data: torch.Tensor | None

    @staticmethod
    def empty() -> "Table":
        return Table(torch.zeros(0, dtype=torch.long), None)

    def nbytes(self) -> int:
        return 0 if self.data is None else self.data.numel() * self.data.element_size()

    def rows(self, keys: torch.Tensor) -> torch.Tensor:
        """Entries of these keys (``long [m]``, each present) in ``float32``: ``[B, m, Hg, P, D]`` (converted
        before they are repeated per row)."""
        assert self.data is not None
        return self.data.index_select(1, torch.searchsorted(self.keys, keys).to(self.data.device)).float()

    def lookup(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct entries of these keys (``long [m]``, each present) in ``float32``,
        ``[B, u, Hg, P, D]``, and each key's entry among them ``long [m]`` (entries not repeated per row)."""
        assert self.data is not None
        unique, inverse = keys.unique(return_inverse=True)
        return self.data.index_select(1, torch.searchsorted(self.keys, unique).to(self.data.device)).float(), inverse

    def only(self, keys: torch.Tensor) -> "Table":
        """The entries of these keys (the others dropped)."""
        if self.data is None:
            return self
        kept = torch.isin(self.keys, keys)
        if bool(kept.all()):
            return self
        idx = kept.nonzero().squeeze(1)
        return Table(self.keys[idx], self.data.index_select(1, idx.to(self.data.device)))

    def merged(self, keys: torch.Tensor, data: torch.Tensor) -> "Table":
        """This table with new entries (``keys [g']`` not present, ``data [B, g', Hg, P, D]``)."""
        if self.data is None:
            order = keys.argsort()
            return Table(keys[order], data.index_select(1, order.to(data.device)))
        all_keys = torch.cat([self.keys, keys])
        order = all_keys.argsort()
        both = torch.cat([self.data, data.to(self.data.device)], dim=1)
        return Table(all_keys[order], both.index_select(1, order.to(both.device)))

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Table":
        return self if self.data is None else Table(self.keys, fn(self.data))


class Codec:
    """How one side (keys or values) of a row is encoded; rows of one table key share its entry."""

    bits: int
    key_kind: ClassVar[str | None] = None
    """What a table entry is shared by: ``"key group"`` (kivi's keys), ``"chunk"``, or ``None`` (no table)."""

    def key(self, prov: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """Table key of each row ``long [m]`` from its provenance, or ``None`` (no table)."""
        return None

    def entry_bytes(self, head_dim: int) -> int:
        """Bytes of one table entry of one head (0: no table)."""
        return 0

    def held(self) -> list[torch.Tensor]:
        """Tensors the codec itself holds for its bank (counted in the bank's bytes)."""
        return []

    def params(self, table: Table, keys: torch.Tensor) -> object:
        """What :meth:`encode` and :meth:`decode` read of ``table`` for rows of these keys (``long [m]``):
        here each row's entry, ``float32 [B, m, Hg, P, D]``."""
        return table.rows(keys)

    def entry_rows(self, tokens_per_frame: int, tokens_per_chunk: int) -> int:
        """Most rows of one bank that share one table entry (1: no table)."""
        return 1

    def fit(self, x: torch.Tensor, index: torch.Tensor, groups: int) -> torch.Tensor:
        """Table entries ``float16 [B, groups, Hg, P, D]`` from rows ``x [B, m, Hg, D]`` of ``index [m]``."""
        raise NotImplementedError

    def width(self, head_dim: int) -> int:
        """Bytes of one row of one head."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor, params: Any) -> torch.Tensor:
        """``x [B, m, Hg, D]`` with what :meth:`params` read for its rows (``None``: no table) ->
        ``uint8 [B, m, Hg, W]``."""
        raise NotImplementedError

    def decode(self, raw: torch.Tensor, params: Any, dtype: torch.dtype) -> torch.Tensor:
        """Inverse of :meth:`encode`: ``uint8 [B, m, Hg, W]`` -> ``[B, m, Hg, D]`` in ``dtype``."""
        raise NotImplementedError
