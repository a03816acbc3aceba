"""Exceptions a user can act on. The CLI prints their message without a traceback."""


class CMBenchError(Exception):
    """Base class of errors caused by input (manifest, video, config), not by a bug."""


class ConfigError(CMBenchError):
    """A configuration value is missing or invalid."""
