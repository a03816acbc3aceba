"""Calibration aimed by recorded token scores: the guess, and the knob search that takes it."""

from __future__ import annotations

import math

import pytest
import torch

from cmbench.calibration.knob_search import search_knob
from cmbench.calibration.score_guess import ScoreGuess, records_scores
from cmbench.methods.registry import build_method

# the tokens' scores of a run (log-uniform over four decades), the same at every setting here
SCORES = torch.exp(torch.empty(4000).uniform_(math.log(1e-4), math.log(1.0), generator=torch.Generator().manual_seed(0)))
CEILING = 0.92  # the window and the sink are never pruned: PR tops out below 1


def build(name: str):
    return lambda value: build_method({"name": name, "gamma": value})


def pruned(name: str, gamma: float) -> float:
    return 1.0 - float(build(name)(gamma).keep_rule(SCORES).float().mean())


def run_pr(name: str, gamma: float) -> float:
    """A run whose PR is the window's ceiling times the share of scored tokens its rule prunes: flat near
    the ceiling and steep below it, like DeCoPrune's on MiniWorld."""
    return CEILING * pruned(name, gamma)


class Calibration:
    """A search over ``run_pr`` whose every probe records ``SCORES`` through the method, as calibrate does."""

    def __init__(self, name: str, target: float, aimed: bool = True):
        knob = build_method({"name": name}).knob
        self.guess = ScoreGuess(build(name), knob, target) if aimed else None
        self.name, self.knob, self.target = name, knob, target

    def probe(self, gamma: float) -> float:
        method = build(self.name)(gamma)
        recorded = self.guess.recording(method, gamma) if self.guess is not None else None
        method.token_scores(None)  # the run scores its tokens (the stand-in ignores the signals)
        pr = run_pr(self.name, gamma)
        if recorded is not None:
            recorded(pr)
        return pr

    def search(self, start: float = 0.1):
        return search_knob(self.knob, self.target, self.probe, tolerance=0.005, start=start, guess=self.guess)


@pytest.fixture(autouse=True)
def scores_of_the_stand_in(monkeypatch):
    """The methods' own scoring needs a model; here every chunk scores ``SCORES``."""
    for name in ("decoprune", "decoprune_reverse"):
        cls = type(build_method({"name": name}))
        monkeypatch.setattr(cls, "token_scores", lambda self, sig: SCORES.clone(), raising=True)


@pytest.mark.parametrize("target", [0.6, 0.85, 0.9])
def test_the_guess_is_the_value_whose_pruned_share_scales_with_the_target(target):
    guess = ScoreGuess(build("decoprune"), build_method({"name": "decoprune"}).knob, target)
    method = build("decoprune")(0.1)
    recorded = guess.recording(method, 0.1)
    method.token_scores(None)
    recorded(run_pr("decoprune", 0.1))
    value = guess()
    assert pruned("decoprune", value) == pytest.approx(pruned("decoprune", 0.1) * target / run_pr("decoprune", 0.1),
                                                       abs=1e-3)
    assert run_pr("decoprune", value) == pytest.approx(target, abs=0.002)


def test_a_knob_that_prunes_less_when_larger_is_guessed_the_other_way():
    calibration = Calibration("decoprune_reverse", 0.7)
    calibration.probe(0.1)
    value = calibration.guess()
    assert value is not None and run_pr("decoprune_reverse", value) == pytest.approx(0.7, abs=0.002)


@pytest.mark.parametrize("target", [0.5, 0.85, 0.9])
def test_an_aimed_search_lands_in_two_probes_where_the_blind_one_needs_more(target):
    aimed = Calibration("decoprune", target).search()
    blind = Calibration("decoprune", target, aimed=False).search()
    assert abs(aimed.pr - target) <= 0.005 and abs(blind.pr - target) <= 0.005
    assert len(aimed.log) == 2 < len(blind.log)


def test_a_guess_outside_the_bracket_is_not_measured():
    calibration = Calibration("decoprune", 0.85, aimed=False)
    far = []

    def wrong() -> float:
        far.append(1e-6)
        return 1e-6  # prunes nothing: below the bracket once a probe under the target is measured

    result = search_knob(calibration.knob, 0.85, calibration.probe, tolerance=0.005, start=0.001, guess=wrong)
    assert far and abs(result.pr - 0.85) <= 0.005
    assert 1e-6 not in [v for v, _ in result.log]  # the first probe (0.001) is already above 1e-6


def test_only_threshold_methods_record_and_only_the_probed_instance_is_wrapped():
    assert records_scores(build_method({"name": "decoprune"}))
    assert not records_scores(build_method({"name": "streaming"}))
    guess = ScoreGuess(build("decoprune"), build_method({"name": "decoprune"}).knob, 0.85)
    probed, other = build("decoprune")(0.1), build("decoprune")(0.1)
    guess.recording(probed, 0.1)
    assert "token_scores" in vars(probed) and "token_scores" not in vars(other)


def test_nothing_pruned_or_an_unreachable_share_gives_no_guess():
    knob = build_method({"name": "decoprune"}).knob
    nothing = ScoreGuess(build("decoprune"), knob, 0.85)
    method = build("decoprune")(1e-6)
    done = nothing.recording(method, 1e-6)
    method.token_scores(None)
    done(0.0)
    assert nothing() is None  # PR 0: no share to scale
    silent = ScoreGuess(build("decoprune"), knob, 0.85)
    silent.recording(build("decoprune")(0.1), 0.1)(0.8)  # a probe that scored nothing records nothing
    assert silent() is None and not silent.probes
    beyond = ScoreGuess(build("decoprune"), knob, 0.95)
    method = build("decoprune")(0.5)
    done = beyond.recording(method, 0.5)
    method.token_scores(None)
    done(0.5)  # a PR as low as this would need a pruned share above 1 for 0.95
    assert beyond() is None
