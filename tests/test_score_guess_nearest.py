"""The score guess aims from the recorded probe whose measured PR is nearest the target, not from the
latest one: the nearest probe's scores and PR describe the run the target asks for best; and in a storage
format that saves bytes before anything is pruned, it aims from that floor.

DeCoPrune keeps a token iff its score exceeds ``gamma``; with the scores ``0, 1e-4, ..., 1`` the share a
value ``g`` prunes is ``g`` (to one score's spacing), so the guess from a probe ``(value, PR)`` is the value
``value * target / PR``, worked out by hand below.
"""

from __future__ import annotations

import pytest
import torch

from cmbench.calibration.score_guess import ScoreGuess
from cmbench.methods.registry import build_method

SCORES = torch.linspace(0.0, 1.0, 10001)
SPACING = 1e-4


def guess_for(target: float, probes: list[tuple[float, float]], floor: float = 0.0) -> float | None:
    """The guess for ``target`` after DeCoPrune probes ``(gamma, measured PR)``, recorded in this order,
    each having scored :data:`SCORES`.

    Parameters
    ----------
    target : float
    probes : list of (float, float)
    floor : float
        The searched quantity with nothing pruned.

    Returns
    -------
    float or None
    """
    build = lambda value: build_method({"name": "decoprune", "gamma": value})  # noqa: E731
    guess = ScoreGuess(build, build_method({"name": "decoprune"}).knob, target, floor)
    for value, pr in probes:
        method = build(value)
        method.token_scores = lambda *args, **kwargs: SCORES.clone()  # the run's scorer, on this instance
        done = guess.recording(method, value)
        method.token_scores(None)
        done(pr)
    return guess()


@pytest.mark.parametrize("probes", [
    [(0.5, 0.45), (0.2, 0.10)],  # the nearest first, the last far below the target
    [(0.2, 0.10), (0.5, 0.45), (0.9, 0.89)],  # the nearest in the middle, the last far above
])
def test_the_guess_comes_from_the_probe_whose_pr_is_nearest_the_target(probes):
    """Target 40%: the probe at gamma 0.5 measured 45% (nearest) and prunes a share 0.5 of the scores, so
    the guess prunes ``0.5 * 0.40 / 0.45``; the last probe would aim elsewhere (0.8 or ~0.404)."""
    target = 0.40
    got = guess_for(target, probes)
    assert got is not None
    assert got == pytest.approx(0.5 * target / 0.45, abs=2 * SPACING)
    last_value, last_pr = probes[-1]
    assert abs(last_value * target / last_pr - got) > 100 * SPACING  # the case tells the probes apart


def test_a_nearer_probe_recorded_later_aims_the_next_guess():
    """After a far probe (gamma 0.2 at 25%) the guess for a target of 50% is ``0.2 * 0.50 / 0.25``; once a
    nearer one is recorded (gamma 0.6 at 55%) it is ``0.6 * 0.50 / 0.55``."""
    assert guess_for(0.50, [(0.2, 0.25)]) == pytest.approx(0.2 * 0.50 / 0.25, abs=2 * SPACING)
    assert guess_for(0.50, [(0.2, 0.25), (0.6, 0.55)]) == pytest.approx(0.6 * 0.50 / 0.55, abs=2 * SPACING)
    assert guess_for(0.50, [(0.6, 0.55), (0.2, 0.25)]) == pytest.approx(0.6 * 0.50 / 0.55, abs=2 * SPACING)


def test_a_format_that_saves_bytes_unpruned_is_aimed_from_its_floor():
    """A bytes target in a quantized format: FullKV there already saves 0.8 of the bytes (the floor), a
    probe at gamma 0.5 saved 0.9, so saving 0.85 takes half the pruned share, ``0.5 * (0.85 - 0.8) / (0.9 -
    0.8) = 0.25``; read as proportional through 0 the guess would be ``0.5 * 0.85 / 0.9 = 0.472``."""
    assert guess_for(0.85, [(0.5, 0.9)], floor=0.8) == pytest.approx(0.25, abs=2 * SPACING)
    assert guess_for(0.85, [(0.5, 0.9)]) == pytest.approx(0.5 * 0.85 / 0.9, abs=2 * SPACING)
    assert guess_for(0.85, [(0.5, 0.8)], floor=0.8) is None  # the probe saved no more than the floor
