"""CMBench: a benchmark and harness for KV-cache compression in autoregressive video diffusion.

``cmbench.evaluate(method=..., limit=...)`` runs a method from Python (:mod:`cmbench.api`); the command
line is ``python -m cmbench``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["evaluate", "Evaluation", "__version__"]


def __getattr__(name: str) -> Any:
    # the API pulls in torch, Hydra and pandas: import it on first use, not with the package
    if name in ("evaluate", "Evaluation"):
        from cmbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'cmbench' has no attribute {name!r}")
