"""Errors of the scorer a user can act on (bad scorer config, missing model, missing backend)."""

from __future__ import annotations

from cmbench.errors import CMBenchError, ConfigError


class ScorerConfigError(ConfigError):
    """A scorer config names an unknown backend or passes a knob the backend does not take."""


class ModelLoadError(CMBenchError):
    """A detection / segmentation / embedding model could not be loaded from a hub id or path."""


class BackendUnavailableError(CMBenchError):
    """An optional scorer backend (e.g. the official ``sam2`` package) is not installed."""
