"""Exceptions a user can act on, and how their messages name what is in the way. The CLI prints their
message without a traceback."""

from __future__ import annotations

from collections.abc import Sequence


def some(names: Sequence[str], most: int = 3) -> str:
    """The first ``most`` of ``names`` for a one-line message: ``a, b, c and 4 more``."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


class CMBenchError(Exception):
    """Base class of errors caused by input (manifest, video, config), not by a bug."""


class ConfigError(CMBenchError):
    """A configuration value is missing or invalid."""
