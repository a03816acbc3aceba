"""``python -m cmbench prepare``: make a dataset available (build MiniWorld, fetch the official set), then validate it."""

from __future__ import annotations

from omegaconf import DictConfig

from cmbench.cli.validate import execute as validate
from cmbench.data.adapter import build_adapter


def execute(cfg: DictConfig) -> int:
    """Make ``cfg.data`` available at ``cfg.data.root`` through its adapter, then validate it."""
    build_adapter(cfg.data).prepare()
    return validate(cfg)
