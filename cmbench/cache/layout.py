"""How each layer's heads are split into physical KV banks (head groups)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from cmbench.errors import ConfigError


@dataclass(frozen=True)
class HeadGroup:
    """Heads of one layer that share one physical bank (one history, one keep decision).

    Parameters
    ----------
    heads : tuple of int
        Head indices of the group, strictly increasing.
    role : str
        A label methods use to pick their rule for this bank (e.g. ``"all"``, ``"static"``, ``"dynamic"``).
    max_tokens : int or None
        Configured size: the most history tokens the bank may hold when a chunk begins.
    """

    heads: tuple[int, ...]
    role: str = "all"
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        heads = tuple(int(h) for h in self.heads)
        object.__setattr__(self, "heads", heads)
        if not heads:
            raise ConfigError("a head group needs at least one head")
        if any(b <= a for a, b in zip(heads, heads[1:])):
            raise ConfigError(f"head group heads must be strictly increasing, got {heads}")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ConfigError(f"head group max_tokens must be >= 0, got {self.max_tokens}")


Layout = Sequence[Sequence[HeadGroup]]
"""One sequence of :class:`HeadGroup` per layer; the groups of a layer partition its heads."""


def uniform_layout(num_layers: int, num_heads: int, role: str = "all", max_tokens: int | None = None) -> list[list[HeadGroup]]:
    """One bank per layer holding every head."""
    group = HeadGroup(tuple(range(num_heads)), role, max_tokens)
    return [[group] for _ in range(num_layers)]


def check_partition(groups: Sequence[HeadGroup], num_heads: int, where: str) -> None:
    """Raise :class:`ConfigError` unless ``groups`` partition ``range(num_heads)``."""
    seen = sorted(h for g in groups for h in g.heads)
    if seen != list(range(num_heads)):
        raise ConfigError(f"{where}: head groups must partition heads 0..{num_heads - 1} exactly once, got {seen}")
