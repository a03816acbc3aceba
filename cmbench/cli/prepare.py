"""``python -m cmbench prepare``: build MiniWorld, or fetch the official CMBench dataset, then validate it."""

from __future__ import annotations

from omegaconf import DictConfig

from cmbench.cli.validate import execute as validate
from cmbench.data.official import fetch_official
from cmbench.errors import CMBenchError


def execute(cfg: DictConfig) -> int:
    """Make ``cfg.data`` available at ``cfg.data.root``: build MiniWorld, or fetch the official set."""
    name = str(cfg.data.name)
    if name == "miniworld":
        from cmbench.miniworld import build_suite

        root = build_suite(cfg.data)
        print(f"miniworld: suite ready at {root}")
        return validate(cfg)
    if name == "cmbench":
        fetch_official(cfg.data)
        return validate(cfg)
    raise CMBenchError(f"data={name}: nothing to prepare (known: miniworld, cmbench)")
