"""Where the real backbones' 4-step schedules come from (flow matching with a shifted sigma grid).

Both families shift a uniform sigma grid with ``s' = shift * s / (1 + (shift - 1) * s)`` and pick 4
entries; ``t = 1000 * s'`` is the model's timestep.

- LingBot World v2 causal-fast (``FlowUniPCMultistepScheduler``, 1000 steps, shift 5, indices
  ``[0, 179, 358, 679]``): the grid is ``linspace(0.999, 0, 1001)[:-1]``; the model receives the
  timesteps truncated to integers, (999, 957, 899, 702), while the scheduler's noise levels are the
  unrounded sigmas (0.99980, 0.95799, 0.89941, 0.70240).
- Self-Forcing / Causal Forcing / LongLive (``FlowMatchScheduler(shift=5, extra_one_step=True)``,
  ``denoising_step_list [1000, 750, 500, 250]`` warped): grid ``linspace(1, 0, 1001)[:-1]``, entry
  ``1000 - step``: timesteps (1000, 937.5, 833.33, 625), noise level ``t / 1000`` exactly.

CMBench's sampler takes ``t = timestep / 1000`` as the noise level, which is exact for the second
family and within 1e-3 of LingBot's sigmas.
"""

from __future__ import annotations

import numpy as np


def shift_sigmas(sigmas: np.ndarray, shift: float) -> np.ndarray:
    """``shift * s / (1 + (shift - 1) * s)``, element-wise."""
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def lingbot_schedule(indices=(0, 179, 358, 679), shift: float = 5.0,
                     steps: int = 1000) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """LingBot World's few-step schedule.

    Returns
    -------
    timesteps : tuple of int
        What the model is fed ((999, 957, 899, 702) by default).
    sigmas : tuple of float
        The noise levels the scheduler uses at those steps.
    """
    grid = np.linspace(1.0 - 1.0 / steps, 0.0, steps + 1)[:-1]
    sig = shift_sigmas(grid, shift)[list(indices)]
    return tuple(int(v) for v in sig * steps), tuple(float(v) for v in sig)


def self_forcing_schedule(step_list=(1000, 750, 500, 250), shift: float = 5.0,
                          steps: int = 1000) -> tuple[float, ...]:
    """Self-Forcing's warped denoising steps: timesteps (1000, 937.5, 833.33, 625) by default."""
    grid = shift_sigmas(np.linspace(1.0, 0.0, steps + 1)[:-1], shift) * steps
    return tuple(float(grid[steps - s]) for s in step_list)
