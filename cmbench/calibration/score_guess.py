"""Aim a calibration probe with the token scores an earlier probe recorded.

A threshold method (DeCoPrune and its variants: keep a token iff its score passes ``gamma``) scores
every token it decides once per run. A probe that records those scores gives, for free, the share of
them any other threshold would prune (:meth:`ScoredMethod.keep_rule` applied to the recorded scores).
The PR a setting realises is close to proportional to that share (the recent window, the sink and the
first chunks are kept by every setting alike), so from a probe ``(value, PR)`` the value whose pruned
share is ``share(value) * target / PR`` lands near the target on its first measurement, where a search
that only sees PRs spends two or three probes on the shape of a curve that is flat near the window's
ceiling and steep below it.

A calibration to device bytes in a quantized storage format saves a share of FullKV's bytes before
anything is pruned (4-bit KIVI stores about a sixth of full precision's bytes keeping every token): the
searched quantity is then ``floor + slope * pruned share`` rather than proportional to the share, and the
guess aims at ``share(value) * (target - floor) / (measured - floor)``, ``floor`` measured once (FullKV in
the format on the calibration tasks). A PR, or bytes in full precision, has ``floor = 0``.

The scores recorded at one setting are not those another setting would produce (what is kept changes
what later chunks can predict), so the guess aims a probe; the measurement decides
(:func:`cmbench.calibration.knob_search.search_knob` takes the guess only inside its bracket).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cmbench.calibration.knob_search import search_position, search_value
from cmbench.methods.base import Method
from cmbench.methods.knobs import Knob

BISECTION_STEPS = 60  # on the knob's search scale: far below any probe's resolution


def records_scores(method: Method) -> bool:
    """Whether ``method`` decides by a threshold on token scores (``token_scores`` and ``keep_rule``)."""
    return callable(getattr(method, "token_scores", None)) and callable(getattr(method, "keep_rule", None))


class ScoreGuess:
    """Token scores recorded per probe, and the knob value they predict for a target PR.

    Parameters
    ----------
    build : callable ``value -> Method``
        The method with its knob at ``value`` (the calibration's setting otherwise).
    knob : Knob
        The threshold knob (``keep_rule`` depends on it monotonically).
    target_pr : float
        The searched quantity's target (a PR, or the share of FullKV's bytes saved).
    floor : float
        The searched quantity when nothing is pruned (0 for a PR).
    """

    def __init__(self, build: Callable[[float], Method], knob: Knob, target_pr: float, floor: float = 0.0):
        self.build, self.knob, self.target_pr, self.floor = build, knob, float(target_pr), float(floor)
        self.probes: dict[float, tuple[float, torch.Tensor]] = {}  # value -> (PR, every recorded score [N])

    def recording(self, method: Method, value: float) -> Callable[[float], None]:
        """Record every score ``method`` computes while it runs; call the returned function with the
        measured PR when the probe is done."""
        scores: list[torch.Tensor] = []
        token_scores = method.token_scores  # type: ignore[attr-defined]

        def recorded(*args: Any, **kwargs: Any) -> torch.Tensor:
            score = token_scores(*args, **kwargs)
            scores.append(score.detach().flatten().float().cpu())
            return score

        method.token_scores = recorded  # type: ignore[attr-defined]  # this instance only, for this probe

        def done(pr: float) -> None:
            if scores:
                self.probes[float(value)] = (float(pr), torch.cat(scores))

        return done

    def pruned_share(self, value: float, scores: torch.Tensor) -> float:
        """Share of ``scores`` ``[N]`` the method with its knob at ``value`` would not keep."""
        return 1.0 - float(self.build(value).keep_rule(scores).float().mean())  # type: ignore[attr-defined]

    def __call__(self) -> float | None:
        """The knob value predicted for the target from the recorded probe nearest it; None without a
        usable probe (nothing recorded, nothing pruned there, no more saved than at the floor, or a share the
        range cannot reach)."""
        if not self.probes:
            return None
        value, (pr, scores) = min(self.probes.items(), key=lambda item: abs(item[1][0] - self.target_pr))
        share = self.pruned_share(value, scores)
        if pr <= self.floor or share <= 0.0:
            return None
        wanted = share * (self.target_pr - self.floor) / (pr - self.floor)
        if not 0.0 < wanted < 1.0:
            return None
        return self._solve(scores, wanted)

    def _solve(self, scores: torch.Tensor, wanted: float) -> float | None:
        """The knob value whose pruned share of ``scores`` is ``wanted`` (bisection on the knob search's scale,
        :func:`~cmbench.calibration.knob_search.search_position`); None when the range's ends do not bracket it."""
        knob = self.knob
        lo, hi = search_position(knob, knob.low), search_position(knob, knob.high)
        unscale = lambda position: search_value(knob, position)  # noqa: E731
        at_lo, at_hi = self.pruned_share(unscale(lo), scores), self.pruned_share(unscale(hi), scores)
        if not min(at_lo, at_hi) <= wanted <= max(at_lo, at_hi):
            return None
        rising = at_hi >= at_lo
        for _ in range(BISECTION_STEPS):
            mid = (lo + hi) / 2
            if (self.pruned_share(unscale(mid), scores) < wanted) == rising:
                lo = mid
            else:
                hi = mid
        return unscale((lo + hi) / 2)
