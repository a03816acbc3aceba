"""Few-step flow-matching sampler with explicit timesteps.

Flow matching: ``x_t = (1 - t) * x0 + t * eps`` with ``t`` in [0, 1]; timesteps are given on the
0..1000 scale (``t = timestep / 1000``; the real default ``(999, 957, 899, 702)``). The backbone
predicts ``x0``; the sampler moves from one timestep to the next and keeps every step's ``x0``
prediction, so methods can read the one at their probe step. The final ``x0`` is the prediction at
the last timestep; the caller then runs the ``t = 0`` pass that writes the clean chunk's K/V.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from cmbench.errors import ConfigError

DEFAULT_TIMESTEPS = (999.0, 957.0, 899.0, 702.0)


def renoise(x0: torch.Tensor, noise: torch.Tensor, t: float) -> torch.Tensor:
    """``(1 - t) * x0 + t * noise``, any shape."""
    return (1.0 - t) * x0 + t * noise


@dataclass(frozen=True)
class SampleTrace:
    """One chunk's trajectory.

    Attributes
    ----------
    x0 : list of Tensor, each ``[B, C, f, h, w]``
        The ``x0`` prediction of every step, in step order.
    final : Tensor, shape ``[B, C, f, h, w]``
        The clean chunk (the last step's prediction).
    """

    x0: list[torch.Tensor] = field(default_factory=list)

    @property
    def final(self) -> torch.Tensor:
        return self.x0[-1]


@dataclass(frozen=True)
class FlowMatchSampler:
    """Few-step sampler over explicit timesteps.

    Parameters
    ----------
    timesteps : tuple of float
        Strictly decreasing, in ``(0, 1000]``.
    stochastic : bool
        ``False`` (default): the deterministic flow step (DDIM / Euler on the probability-flow ODE),
        ``x_next = (1 - t') * x0 + t' * eps_hat`` with ``eps_hat = (x_t - (1 - t) * x0) / t``.
        ``True``: re-noise the prediction with fresh noise, ``x_next = (1 - t') * x0 + t' * eps``
        (Self-Forcing style).
    """

    timesteps: tuple[float, ...] = DEFAULT_TIMESTEPS
    stochastic: bool = False

    def __post_init__(self) -> None:
        ts = tuple(float(t) for t in self.timesteps)
        object.__setattr__(self, "timesteps", ts)
        if not ts:
            raise ConfigError("sampler.timesteps must not be empty")
        if any(not 0.0 < t <= 1000.0 for t in ts):
            raise ConfigError(f"sampler.timesteps must lie in (0, 1000], got {ts}")
        if any(b >= a for a, b in zip(ts, ts[1:])):
            raise ConfigError(f"sampler.timesteps must be strictly decreasing, got {ts}")

    @property
    def levels(self) -> tuple[float, ...]:
        """Noise levels ``t = timestep / 1000``."""
        return tuple(t / 1000.0 for t in self.timesteps)

    def step(self, x_t: torch.Tensor, x0: torch.Tensor, t: float, t_next: float,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """Move from level ``t`` to ``t_next < t`` given the prediction ``x0`` (shapes ``[B, C, f, h, w]``)."""
        if self.stochastic:
            eps = torch.randn(x0.shape, generator=generator, dtype=torch.float32).to(x0)
        else:
            eps = (x_t - (1.0 - t) * x0) / t
        return renoise(x0, eps, t_next)

    def sample(self, denoise: Callable[[torch.Tensor, float, int], torch.Tensor], noise: torch.Tensor,
               generator: torch.Generator | None = None) -> SampleTrace:
        """Run every step from pure noise.

        Parameters
        ----------
        denoise : callable ``(x_t, t, step_index) -> x0_hat``
            The model call (shapes ``[B, C, f, h, w]``).
        noise : Tensor, shape ``[B, C, f, h, w]``
            The starting point, taken as ``x`` at the first level.
        generator : torch.Generator, optional
            Fresh noise of the stochastic mode.
        """
        trace = SampleTrace()
        x = noise
        levels = self.levels
        for i, t in enumerate(levels):
            x0 = denoise(x, t, i)
            trace.x0.append(x0)
            if i + 1 < len(levels):
                x = self.step(x, x0, t, levels[i + 1], generator)
        return trace
