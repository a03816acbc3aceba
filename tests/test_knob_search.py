"""Knob search: a knob whose pruning ratio is a known function of it is calibrated to the target."""

from __future__ import annotations

import math

import pytest

from cmbench.calibration.knob_search import search_knob
from cmbench.errors import ConfigError
from cmbench.methods.knobs import Knob


def threshold_pr(gamma: float) -> float:
    """A threshold method: PR rises with gamma over several decades (a logistic in log gamma)."""
    return 0.98 / (1.0 + math.exp(-2.0 * (math.log10(gamma) + 1.0)))


@pytest.mark.parametrize("target", [0.75, 0.80, 0.85, 0.90, 0.95])
def test_a_threshold_is_found_within_half_a_point(target):
    result = search_knob(Knob("gamma", 1e-4, 10.0, increasing=True, log=True), target, threshold_pr, tolerance=0.005)
    assert abs(result.pr - target) <= 0.005 and abs(threshold_pr(result.value) - result.pr) < 1e-12
    assert len(result.log) <= 4  # every probe is a full generation of the calibration tasks


@pytest.mark.parametrize("target", [0.5, 0.75, 0.80, 0.85, 0.90, 0.93])
@pytest.mark.parametrize("start", [0.1, 1e-5, 50.0])
def test_few_probes_from_the_configured_value_even_far_from_the_answer(target, start):
    """DeCoPrune's range and default (gamma 0.1); a start decades away costs a probe or two more."""
    knob = Knob("gamma", 1e-6, 1e2, increasing=True, log=True)
    result = search_knob(knob, target, threshold_pr, tolerance=0.005, start=start)
    assert abs(result.pr - target) <= 0.005 and result.log[0][0] == start
    assert len(result.log) <= (4 if start == 0.1 else 5)


def test_a_steep_curve_that_saturates_still_converges_within_the_probe_limit():
    def steep(gamma: float) -> float:  # PR flat at both ends, a decade of knob in between
        return 0.95 / (1.0 + math.exp(-8.0 * (math.log10(gamma) + 1.5)))

    knob = Knob("gamma", 1e-6, 1e2, increasing=True, log=True)
    for target in (0.5, 0.85, 0.93):
        result = search_knob(knob, target, steep, tolerance=0.005, start=0.1)
        assert abs(result.pr - target) <= 0.005 and len(result.log) <= 10


def test_a_count_knob_that_prunes_less_when_larger():
    tokens = 1000

    def kept_pr(k: float) -> float:
        return 1.0 - k / tokens

    result = search_knob(Knob("k", 0, tokens, increasing=False, integer=True), 0.85, kept_pr)
    assert result.value == 150 and result.pr == pytest.approx(0.85)
    assert all(float(v).is_integer() for v, _ in result.log)


def test_a_coarse_integer_knob_returns_the_closest_it_can():
    def window_pr(recent: float) -> float:
        return 1.0 - (1 + recent) / 48  # sink 1 + recent windows of a 48-chunk history

    result = search_knob(Knob("recent_chunks", 0, 47, increasing=False, integer=True), 0.90, window_pr)
    assert result.value == 4 and abs(result.error) == pytest.approx(abs(window_pr(4) - 0.90))


def test_unreachable_targets_say_what_range_the_knob_reaches():
    with pytest.raises(ConfigError, match=r"target PR 0\.9900 is outside what gamma in \[0\.0001, 10\] reaches.*"
                                          r"gamma=10 gives 0\.9624"):
        search_knob(Knob("gamma", 1e-4, 10.0, log=True), 0.99, threshold_pr)
    calls = []
    with pytest.raises(ConfigError, match=r"target PR 0\.0010 is outside what .*gamma=0\.0001 gives 0\.0024"):
        search_knob(Knob("gamma", 1e-4, 10.0, log=True), 0.001, lambda g: calls.append(g) or threshold_pr(g),
                    tolerance=0.0005)
    assert len(calls) <= 4  # found at the range end it walked to, not by measuring both ends first
    with pytest.raises(ConfigError, match="low > 0"):
        Knob("gamma", 0.0, 1.0, log=True)


def test_probes_of_other_targets_are_reused_and_change_no_answer():
    """A sweep's second target starts from the first's probes: the endpoints and bracket are known, so
    it measures fewer values, and a value already within tolerance is the answer without a measurement."""
    knob = Knob("gamma", 1e-4, 10.0, increasing=True, log=True)
    first = search_knob(knob, 0.80, threshold_pr, tolerance=0.005)
    known = dict(first.log)
    cold = search_knob(knob, 0.85, threshold_pr, tolerance=0.005)
    warm = search_knob(knob, 0.85, threshold_pr, tolerance=0.005, known=known)
    assert abs(warm.pr - 0.85) <= 0.005 and abs(threshold_pr(warm.value) - warm.pr) < 1e-12
    assert not set(dict(warm.log)) & set(known)  # nothing measured twice
    assert len(warm.log) < len(cold.log)
    again = search_knob(knob, 0.80, threshold_pr, tolerance=0.005, known=known)
    assert again.log == [] and (again.value, again.pr) == (first.value, first.pr)
    # the same (value, PR) pairs as known probes or as fresh measurements: one answer
    counts = Knob("k", 0, 1000, increasing=False, integer=True)
    base = search_knob(counts, 0.70, lambda k: 1.0 - k / 1000)
    warm_counts = search_knob(counts, 0.85, lambda k: 1.0 - k / 1000, known=dict(base.log))
    assert warm_counts.value == 150 and warm_counts.pr == pytest.approx(0.85)
