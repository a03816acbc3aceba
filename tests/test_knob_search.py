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


def test_a_target_within_tolerance_of_the_reachable_range_is_accepted():
    """The knob reaches PR 0.10 .. 0.90 here: a target a little past either end (within the tolerance) is the
    end itself, found without refusing; one past the tolerance is refused."""

    def kept_pr(k: float) -> float:
        return 0.9 - 0.8 * k / 100

    knob = Knob("k", 0, 100, increasing=False, integer=True)
    high = search_knob(knob, 0.9015, kept_pr, tolerance=0.002)
    assert high.value == 0 and high.pr == pytest.approx(0.9)
    low = search_knob(knob, 0.0985, kept_pr, tolerance=0.002)
    assert low.value == 100 and low.pr == pytest.approx(0.1)
    with pytest.raises(ConfigError, match=r"target PR 0\.9030 is outside what k in \[0, 100\] reaches"):
        search_knob(knob, 0.903, kept_pr, tolerance=0.002)


def test_the_middle_of_a_bracket_by_hand():
    """Linear: the mean; log: the geometric mean; integer: a whole value strictly inside, or ``a`` when none is."""
    assert Knob("g", 0.0, 8.0).middle(2.0, 6.0) == 4.0
    assert Knob("g", 1e-4, 10.0, log=True).middle(1.0, 100.0) == pytest.approx(10.0)
    count = Knob("k", 0, 100, integer=True)
    assert [count.middle(0, 10), count.middle(0, 3), count.middle(0, 2), count.middle(4, 5)] == [5.0, 1.0, 1.0, 4.0]
    log_count = Knob("k", 1, 100, log=True, integer=True)
    assert log_count.middle(1, 5) == 2.0  # sqrt 5 = 2.24 -> 2
    assert log_count.middle(1, 3) == 2.0  # sqrt 3 = 1.73 -> 1, but 1 is not strictly inside: 2
    assert log_count.middle(1, 2) == 1.0



def test_an_integer_knob_with_fractional_bounds_bisects_between_the_whole_values_inside():
    """Fractional bounds closer than 2 can still hold whole values: the middle is one of them, and the search's
    first probe lies inside the knob's range (not ``low`` rounded down out of it)."""
    narrow = Knob("k", 0.4, 1.6, increasing=False, integer=True)
    assert narrow.middle(0.4, 1.6) == 1.0  # the only whole value inside
    assert Knob("k", 0.5, 2.5, integer=True).middle(0.5, 2.5) == 1.0  # 1 and 2 inside, the mean 1.5 floored
    assert Knob("k", 0.5, 2.5, integer=True).middle(1.2, 1.8) == 1.2  # no whole value inside: a
    seen = []
    assert search_knob(narrow, 0.5, lambda k: seen.append(k) or 0.5).value == 1.0
    assert seen == [1.0]

def test_knob_ranges_and_targets_are_checked_with_the_reason():
    with pytest.raises(ConfigError, match=r"^knob k: low \(3\) must be below high \(3\)$"):
        Knob("k", 3, 3)
    with pytest.raises(ConfigError, match=r"^target PR must be in \[0, 1\), got 1\.0$"):
        search_knob(Knob("k", 0, 10), 1.0, lambda v: v / 10)
    assert search_knob(Knob("k", 0, 10, increasing=True), 0.0, lambda v: v / 10).value == 0.0
    result = search_knob(Knob("k", 0, 10, increasing=True), 0.5, lambda v: v / 10)
    assert result.knob == "k" and result.value == 5.0 and result.target_pr == 0.5


def test_an_integer_knob_measures_whole_values_only_even_from_fractional_bounds():
    seen = []

    def kept_pr(k: float) -> float:
        seen.append(k)
        return 1.0 - k / 100

    result = search_knob(Knob("k", 0.4, 99.6, increasing=False, integer=True), 0.85, kept_pr)
    assert all(float(v).is_integer() for v in seen)
    assert result.value == 15.0
    # a target at the range's ends: the probes stay inside it (99.6 is not rounded up to 100, 0.4 not down to 0)
    for target, end in ((0.01, 99.0), (0.99, 1.0)):
        seen.clear()
        assert search_knob(Knob("k", 0.4, 99.6, increasing=False, integer=True), target, kept_pr).value == end
        assert seen and all(1.0 <= v <= 99.0 for v in seen), seen


def test_ties_go_to_the_smaller_value_and_the_search_stops_within_tolerance():
    """Two whole values equally close to the target: the smaller wins; a PR exactly at the tolerance is close
    enough."""
    linear = lambda v: 0.25 + v / 16  # noqa: E731  PR 0.25 .. 0.75 over [0, 8]
    close = search_knob(Knob("k", 0, 8, increasing=True, integer=True), 0.5 + 0.0625, linear, tolerance=0.0625)
    assert abs(close.pr - 0.5625) <= 0.0625
    tied = search_knob(Knob("k", 0, 8, increasing=True, integer=True), 0.40625, linear, tolerance=0.01)
    assert tied.value == 2.0 and tied.pr == 0.375  # 2 and 3 are 1/32 away each


def test_ties_go_to_the_smaller_value_on_a_knob_that_prunes_less_when_larger():
    linear = lambda v: 0.75 - v / 16  # noqa: E731  PR 0.75 .. 0.25 over [0, 8]
    tied = search_knob(Knob("k", 0, 8, increasing=False, integer=True), 0.59375, linear, tolerance=0.01)
    assert tied.value == 2.0 and tied.pr == 0.625  # 2 and 3 are 1/32 away each


def test_the_search_stops_after_max_evaluations_and_accepts_a_target_exactly_at_the_tolerance():
    """A PR that jumps never comes within the tolerance: the default budget of 14 evaluations ends the
    search. A target exactly one tolerance past either end of the reachable range (exact binary values) is
    still accepted."""
    jump = search_knob(Knob("g", 0.0, 10.0), 0.5, lambda v: 0.0 if v < 5.0 else 1.0)
    assert len(jump.log) == 14
    linear = lambda v: 0.25 + v / 16  # noqa: E731  PR 0.25 .. 0.75 over [0, 8]
    assert search_knob(Knob("k", 0, 8), 0.875, linear, tolerance=0.125).value == 8.0
    assert search_knob(Knob("k", 0, 8), 0.125, linear, tolerance=0.125).value == 0.0


def test_probes_are_reused_on_a_knob_that_prunes_less_when_larger():
    """The known endpoints of a decreasing knob must not narrow the bracket onto themselves."""
    knob = Knob("k", 0, 1000, increasing=False, integer=True)

    def kept_pr(k: float) -> float:
        return 1.0 - k / 1000

    first = search_knob(knob, 0.80, kept_pr)
    warm = search_knob(knob, 0.85, kept_pr, known=dict(first.log))
    assert abs(warm.pr - 0.85) <= 0.005 and kept_pr(warm.value) == warm.pr  # a measured value within tolerance
    assert not set(dict(warm.log)) & set(dict(first.log))  # nothing measured twice
