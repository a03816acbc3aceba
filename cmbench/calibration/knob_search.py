"""Find the value of a method's own knob that gives a target pruning ratio.

A method is compared with another at the same budget by running it with its OWN rule at the knob value
that lands on the target PR (DeCoPrune's threshold gamma, TempDiff's block count, Streaming's window),
found once on calibration data, rather than by forcing a budget onto its decisions. The search treats
PR as a monotone function of the knob, measured by a callable (on a calibration world, see
:mod:`cmbench.calibration.pruning_ratio`), and bisects it: on a log scale for thresholds that span
decades, over integers for counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

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


def search_knob(knob: Knob, target_pr: float, measure: Callable[[float], float], tolerance: float = 0.002,
                max_evaluations: int = 14, known: Mapping[float, float] | None = None) -> SearchResult:
    """Bisect ``knob`` until ``measure(value)`` (the PR) is within ``tolerance`` of ``target_pr``.

    Parameters
    ----------
    knob : Knob
    target_pr : float
        In [0, 1).
    measure : callable ``value -> PR``
        Runs the method with the knob at ``value`` on the calibration data.
    tolerance : float
        Stop once a value's PR is this close to the target (absolute).
    max_evaluations : int
        Stop after this many calls to ``measure`` (integer knobs stop earlier, when the bracket closes).
    known : mapping ``value -> PR``, optional
        PRs measured before with the same ``measure`` (another target of one sweep): they are not measured
        again, they narrow the starting bracket, and one of them is the answer when it is the closest.

    Returns
    -------
    SearchResult
        The value whose PR is closest to the target (measured now or known), and the log of the values
        measured now.

    Raises
    ------
    ConfigError
        When the target lies outside the PRs the knob's range reaches (the message gives that range).
    """
    if not 0.0 <= target_pr < 1.0:
        raise ConfigError(f"target PR must be in [0, 1), got {target_pr}")
    log: list[tuple[float, float]] = []
    seen = {float(v): float(p) for v, p in (known or {}).items()}

    def evaluate(value: float) -> float:
        value = float(round(value)) if knob.integer else value
        if value not in seen:
            seen[value] = float(measure(value))
            log.append((value, seen[value]))
        return seen[value]

    def prunes_too_little(pr: float) -> bool:
        """Whether the answer lies on the pruning side of a value with this PR."""
        return (pr < target_pr) == knob.increasing

    low, high = knob.low, knob.high
    pr_low, pr_high = evaluate(low), evaluate(high)
    lo_pr, hi_pr = (pr_low, pr_high) if knob.increasing else (pr_high, pr_low)
    if not lo_pr - tolerance <= target_pr <= hi_pr + tolerance:
        raise ConfigError(
            f"target PR {target_pr:.4f} is outside what {knob.name} in [{knob.low:g}, {knob.high:g}] reaches on "
            f"the calibration data (PR {min(pr_low, pr_high):.4f} .. {max(pr_low, pr_high):.4f})"
        )
    for value, pr in seen.items():  # known values inside the range narrow the bracket
        if low < value < high:
            low, high = (value, high) if prunes_too_little(pr) else (low, value)
    while len(log) < max_evaluations and min(abs(pr - target_pr) for pr in seen.values()) > tolerance:
        middle = knob.middle(low, high)
        if knob.integer and middle in (low, high):
            break
        pr = evaluate(middle)
        if prunes_too_little(pr):  # move towards the pruning end of the range
            low = middle
        else:
            high = middle
    in_range = [(v, p) for v, p in seen.items() if knob.low <= v <= knob.high]
    value, pr = min(in_range, key=lambda entry: (abs(entry[1] - target_pr), entry[0]))
    return SearchResult(knob.name, value, pr, target_pr, log)
