"""The autoregressive loop: prefill a context once (with the re-noise probe), fork per task, continue.

:mod:`cmbench.generation.loop` wires backbone + method + KV cache + PR ledger; it is the only module
that does. :mod:`cmbench.generation.sampler` is the few-step flow-matching sampler.
"""

from cmbench.generation.loop import (
    Continuation,
    GenerationSettings,
    PrefilledContext,
    check_settings,
    continue_task,
    prefill,
)
from cmbench.generation.sampler import FlowMatchSampler, renoise

__all__ = ["Continuation", "FlowMatchSampler", "GenerationSettings", "PrefilledContext", "check_settings",
           "continue_task", "prefill", "renoise"]
