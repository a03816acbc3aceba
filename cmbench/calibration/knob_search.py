"""Find the value of a method's own knob that gives a target pruning ratio.

A method is compared with another at the same budget by running it with its OWN rule at the knob value
that lands on the target PR (DeCoPrune's threshold gamma, TempDiff's block count, Streaming's window),
found once on calibration data, rather than by forcing a budget onto its decisions. The search treats
PR as a monotone function of the knob, measured by a callable (on a calibration world, see
:mod:`cmbench.calibration.pruning_ratio`); every measurement is a full generation of the calibration
tasks, so the search spends as few as it can:

- it starts at the method's configured value (or at the known probe nearest the target) instead of
  measuring both ends of the range;
- until the target is bracketed it steps a quarter of the range (on a log scale for thresholds that
  span decades), or extrapolates the line through the last two probes when it has them;
- once bracketed it interpolates (regula falsi with the Illinois safeguard: a side kept twice is
  bisected), which lands within the tolerance in a probe or two where PR is smooth in the knob;
- given a guess (a threshold method's recorded token scores, :mod:`cmbench.calibration.score_guess`),
  it measures the guessed value first whenever it lies inside the bracket (or nothing is bracketed
  yet), and falls back to the steps above when the guess is outside or already measured;
- it stops as soon as a probe is within the tolerance, when an integer bracket closes, or at a range
  end that still misses the target (an unreachable target: a one-line error naming the PRs reached).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cmbench.calibration.target_quantity import PR, TargetQuantity
from cmbench.errors import ConfigError
from cmbench.methods.knobs import Knob


@dataclass
class SearchResult:
    """The outcome of :func:`search_knob`.

    Attributes
    ----------
    knob : str
    value : float
        The chosen value (the evaluated one whose PR is closest to the target).
    pr : float
        Its measured PR.
    target_pr : float
    log : list of (value, pr)
        Every evaluation, in order.
    """

    knob: str
    value: float
    pr: float
    target_pr: float
    log: list[tuple[float, float]] = field(default_factory=list)

    @property
    def error(self) -> float:
        return self.pr - self.target_pr


def search_position(knob: Knob, value: float) -> float:
    """``value``'s position on the knob's search scale (log for thresholds and counts that span decades)."""
    return math.log(max(value, knob.low if knob.low > 0 else 1.0)) if knob.log else value


def search_value(knob: Knob, position: float) -> float:
    """The knob value at a position of its search scale (:func:`search_position`, inverted)."""
    return math.exp(position) if knob.log else position


def search_knob(knob: Knob, target_pr: float, measure: Callable[[float], float], tolerance: float = 0.002,
                max_evaluations: int = 14, known: Mapping[float, float] | None = None,
                start: float | None = None, guess: Callable[[], float | None] | None = None,
                quantity: TargetQuantity = PR) -> SearchResult:
    """Find a value of ``knob`` whose ``measure(value)`` (the PR) is within ``tolerance`` of ``target_pr``.

    Parameters
    ----------
    knob : Knob
    target_pr : float
        In [0, 1).
    measure : callable ``value -> PR``
        Runs the method with the knob at ``value`` on the calibration data; PR is monotone in the value.
    tolerance : float
        Stop once a value's PR is this close to the target (absolute).
    max_evaluations : int
        Stop after this many calls to ``measure`` (integer knobs stop earlier, when the bracket closes).
    known : mapping ``value -> PR``, optional
        PRs measured before with the same ``measure`` (another target of one sweep): they are not measured
        again, they bracket the target, and one of them is the answer when it is the closest.
    start : float, optional
        The first value to measure when nothing is known (default: the middle of the range); the method's
        configured value is a good guess.
    guess : callable ``() -> value or None``, optional
        Asked before every step after the first probe: a value predicted for the target from what the
        probes so far recorded (:class:`cmbench.calibration.score_guess.ScoreGuess`), or None.
    quantity : TargetQuantity
        What ``target_pr`` and the measurements are the searched values of (a PR, or the share of FullKV's
        device bytes saved): how an error states them.

    Returns
    -------
    SearchResult
        The value whose PR is closest to the target (measured now or known), and the log of the values
        measured now.

    Raises
    ------
    ConfigError
        When the target lies outside the PRs the knob's range reaches (the message gives the PRs measured).
    """
    if not 0.0 <= target_pr < 1.0:
        raise ConfigError(f"target PR must be in [0, 1), got {target_pr}")
    log: list[tuple[float, float]] = []
    seen = {float(v): float(p) for v, p in (known or {}).items() if knob.low <= float(v) <= knob.high}
    sign = 1.0 if knob.increasing else -1.0

    def clip(value: float) -> float:
        if knob.integer:  # the whole values inside the range, also when its bounds are fractional
            return float(min(max(round(value), math.ceil(knob.low)), math.floor(knob.high)))
        return float(min(max(value, knob.low), knob.high))

    def evaluate(value: float) -> None:
        value = clip(value)
        if value not in seen:
            seen[value] = float(measure(value))
            log.append((value, seen[value]))

    def x(value: float) -> float:
        return search_position(knob, value)

    def value_at(position: float) -> float:
        return search_value(knob, position)

    def logit(pr: float) -> float:
        pr = min(max(pr, 1e-4), 1 - 1e-4)
        return math.log(pr / (1 - pr))

    def gap(pr: float) -> float:
        """Increasing in the knob: negative below the target's knob value, positive above; on the logit
        scale, where PR is close to a line in the (log) knob for thresholds and counts alike."""
        return sign * (logit(pr) - logit(target_pr))

    def done() -> bool:
        return bool(seen) and min(abs(p - target_pr) for p in seen.values()) <= tolerance

    width = x(knob.high) - x(knob.low)
    kept: tuple[float, int] = (math.nan, 0)  # (end, times kept in a row): the Illinois safeguard
    if not seen:
        evaluate(knob.middle(knob.low, knob.high) if start is None else start)
    while len(log) < max_evaluations and not done():
        below = [(v, p) for v, p in seen.items() if gap(p) < 0]
        above = [(v, p) for v, p in seen.items() if gap(p) > 0]
        aimed = guess() if guess is not None else None
        if aimed is not None and math.isfinite(aimed):
            aimed = clip(aimed)
            inside = (not below or aimed > max(below)[0]) and (not above or aimed < min(above)[0])
            if inside and aimed not in seen:
                evaluate(aimed)
                continue
        if below and above:
            (lo, p_lo), (hi, p_hi) = max(below), min(above)
            if knob.integer and hi - lo <= 1:
                break
            g_lo, g_hi = gap(p_lo), gap(p_hi)
            if kept[1] >= 2:  # an end kept again: halve its weight each time (Illinois), so the bracket closes
                weight = 0.5 ** (kept[1] - 1)
                g_lo, g_hi = (g_lo * weight, g_hi) if kept[0] == lo else (g_lo, g_hi * weight)
            t = min(max(g_lo / (g_lo - g_hi), 0.02), 0.98)  # regula falsi on the search scale
            candidate = clip(value_at(x(lo) + t * (x(hi) - x(lo))))
            if candidate in seen:  # nothing new there (whole values, a float step too small): bisect
                candidate = clip(knob.middle(lo, hi))
                if candidate in seen:
                    break
            evaluate(candidate)
            end = hi if gap(seen[clip(candidate)]) < 0 else lo
            kept = (end, kept[1] + 1 if kept[0] == end else 1)
            continue
        # not bracketed yet: move towards the target from the probe nearest it, by the slope of the two
        # nearest probes when they have one, else assuming a unit slope (logit PR per e-fold of the knob)
        above.sort()
        below.sort()
        end = knob.low if above else knob.high
        nearest, pr = above[0] if above else below[-1]
        if nearest == end:  # the range end itself misses the target
            measured = sorted(quantity.shown(p) for p in seen.values())
            raise ConfigError(
                f"target {quantity.text(target_pr)} is outside what {knob.name} in [{knob.low:g}, {knob.high:g}] "
                f"reaches on the calibration data ({quantity.label} {measured[0]:.4f} .. {measured[-1]:.4f} measured, "
                f"{knob.name}={end:g} gives {quantity.shown(pr):.4f})"
            )
        direction = -1.0 if above else 1.0
        side = above if above else below
        slope = 1.0 if knob.log else 8.0 / width
        if len(side) >= 2:
            (v2, p2) = side[1] if above else side[-2]
            measured_slope = (gap(pr) - gap(p2)) / (x(nearest) - x(v2))
            slope = measured_slope if measured_slope > 0 else slope
        step = min(max(1.2 * abs(gap(pr)) / slope, width / 32), width / 4)  # overshoot a little: bracket it
        candidate = clip(value_at(x(nearest) + direction * step))
        if candidate in seen:
            candidate = end
        evaluate(candidate)
    value, pr = min(seen.items(), key=lambda entry: (abs(entry[1] - target_pr), entry[0]))
    return SearchResult(knob.name, value, pr, target_pr, log)
