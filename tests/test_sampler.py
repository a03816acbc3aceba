"""Flow-matching sampler: explicit timesteps, the step rule by hand, every x0 kept, seeds."""

import pytest
import torch

from cmbench.errors import ConfigError
from cmbench.generation.sampler import FlowMatchSampler, renoise
from cmbench.hashing import derive_seed, seeded_generator


def test_levels_and_validation():
    assert FlowMatchSampler().levels == (0.999, 0.957, 0.899, 0.702)
    for bad in ((), (999, 999), (500, 900), (1200,), (0,)):
        with pytest.raises(ConfigError):
            FlowMatchSampler(bad)


def test_deterministic_step_by_hand():
    s = FlowMatchSampler()
    x_t, x0 = torch.tensor([1.0]), torch.tensor([0.5])
    # eps_hat = (1 - 0.5 * 0.5) / 0.5 = 1.5; x_next = 0.75 * 0.5 + 0.25 * 1.5 = 0.75
    assert s.step(x_t, x0, 0.5, 0.25).item() == pytest.approx(0.75)


def test_oracle_denoiser_recovers_x0_and_every_step_is_kept():
    x0 = torch.randn(1, 3, 2, 4, 4)
    noise = torch.randn_like(x0)
    seen = []

    def oracle(x, t, step):
        seen.append((step, t, x.clone()))
        return x0 + step  # a different prediction per step, to check the trace order

    trace = FlowMatchSampler().sample(oracle, noise)
    assert [s for s, _, _ in seen] == [0, 1, 2, 3] and [t for _, t, _ in seen] == [0.999, 0.957, 0.899, 0.702]
    assert all(torch.equal(trace.x0[i], x0 + i) for i in range(4)) and torch.equal(trace.final, x0 + 3)
    assert torch.equal(seen[0][2], noise)
    eps = (noise - 0.001 * x0) / 0.999
    torch.testing.assert_close(seen[1][2], renoise(x0, eps, 0.957))
    # a perfect denoiser walks the straight flow line: the next x is exactly the re-noised x0
    trace = FlowMatchSampler().sample(lambda x, t, step: x0, renoise(x0, noise, 0.999))
    torch.testing.assert_close(trace.final, x0)


def test_stochastic_mode_uses_the_generator():
    s = FlowMatchSampler((999, 500, 100), stochastic=True)
    noise = torch.zeros(1, 2, 1, 2, 2)

    def run(seed):
        return s.sample(lambda x, t, i: torch.zeros_like(x) if i == 0 else x, noise, seeded_generator(seed))

    assert torch.equal(run(1).final, run(1).final)
    assert not torch.equal(run(1).final, run(2).final)


def test_seeds_are_stable():
    assert derive_seed(1, "noise", 2) == 825020071489957392  # fixed forever: records depend on it
    assert derive_seed(1, "noise", 2) != derive_seed(1, "noise", 3)


def test_timesteps_are_stored_as_a_tuple_of_floats():
    """Whatever sequence is given, the sampler keeps the validated tuple of floats it checked."""
    s = FlowMatchSampler([999, 500])
    assert type(s.timesteps) is tuple and s.timesteps == (999.0, 500.0)
    assert all(type(t) is float for t in s.timesteps)
    assert s.levels == (0.999, 0.5)


def test_timestep_bounds_are_open_at_zero_and_closed_at_1000():
    """(0, 1000]: 1000 itself and anything above 0 (even below 1) are fine; above 1000 is refused."""
    assert FlowMatchSampler((1000,)).levels == (1.0,)
    assert FlowMatchSampler((1000, 1.0, 0.5)).levels == (1.0, 0.001, 0.0005)
    for bad in ((1000.5,), (1001,), (500, 0), (500, -1)):
        with pytest.raises(ConfigError):
            FlowMatchSampler(bad)


def test_validation_messages():
    """Each refusal says exactly what is wrong, with the timesteps as floats."""
    with pytest.raises(ConfigError, match=r"^sampler\.timesteps must not be empty$"):
        FlowMatchSampler(())
    with pytest.raises(ConfigError, match=r"^sampler\.timesteps must lie in \(0, 1000\], got \(1200\.0,\)$"):
        FlowMatchSampler((1200,))
    with pytest.raises(ConfigError,
                       match=r"^sampler\.timesteps must be strictly decreasing, got \(500\.0, 900\.0\)$"):
        FlowMatchSampler((500, 900))


def test_every_step_moves_x_including_the_one_before_the_last():
    """Each model call after the first sees the deterministic step from the previous call's x and x0."""
    x0 = torch.randn(1, 2, 1, 2, 2, generator=torch.Generator().manual_seed(3))
    noise = torch.randn(1, 2, 1, 2, 2, generator=torch.Generator().manual_seed(4))
    seen = []

    def denoise(x, t, step):
        seen.append(x.clone())
        return x0 * (step + 1)  # a different x0 per step, so a skipped step shows

    s = FlowMatchSampler()
    s.sample(denoise, noise)
    levels = s.levels
    assert len(seen) == 4
    for i in range(3):
        t, t_next = levels[i], levels[i + 1]
        eps = (seen[i] - (1.0 - t) * x0 * (i + 1)) / t
        torch.testing.assert_close(seen[i + 1], (1.0 - t_next) * x0 * (i + 1) + t_next * eps)
        assert not torch.equal(seen[i + 1], seen[i])


def test_stochastic_noise_follows_the_prediction_dtype():
    """The fresh noise is drawn in float32 and cast to the prediction's dtype, so the step keeps it."""
    s = FlowMatchSampler(stochastic=True)
    x0 = torch.full((1, 2, 1, 2, 2), 0.5, dtype=torch.bfloat16)
    out = s.step(x0, x0, 0.9, 0.5, seeded_generator(7))
    assert out.dtype == torch.bfloat16
    eps = torch.randn(x0.shape, generator=seeded_generator(7), dtype=torch.float32).to(torch.bfloat16)
    assert torch.equal(out, renoise(x0, eps, 0.5))


def test_stochastic_noise_is_float32_whatever_the_default_dtype():
    """A seed gives the same noise under any torch default dtype: it is always drawn as float32
    (a float64 draw from the same generator gives different numbers, not just more digits)."""
    s = FlowMatchSampler(stochastic=True)
    x0 = torch.zeros(1, 2, 2, 4, 4, dtype=torch.float64)  # 64 values
    expected = torch.randn(x0.shape, generator=seeded_generator(7), dtype=torch.float32).double() * 0.5
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = s.step(x0, x0, 0.9, 0.5, seeded_generator(7))
    finally:
        torch.set_default_dtype(old)
    assert out.dtype == torch.float64 and torch.equal(out, expected)
