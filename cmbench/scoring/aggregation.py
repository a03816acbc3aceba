"""A task's score from its references' best scores: their mean (CMBench's default reading) or their max.

Every record carries both (``reference_aggregates``) so a leaderboard can show either
(``leaderboard.reference_aggregation``); docs/protocol.md says why the mean is a reading, not the
authors' rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cmbench.config_schema import REFERENCE_AGGREGATIONS


def aggregate_references(reference_scores: Any, how: str) -> float:
    """A task score from its references' best scores: their ``mean`` or their ``max``
    (:data:`~cmbench.config_schema.REFERENCE_AGGREGATIONS`); 0 when there is none."""
    scores = [float(s) for s in reference_scores]
    if how not in REFERENCE_AGGREGATIONS:
        raise ValueError(f"reference aggregation must be one of {', '.join(REFERENCE_AGGREGATIONS)}, got {how!r}")
    if not scores:
        return 0.0
    return float(np.mean(scores)) if how == "mean" else float(np.max(scores))


def reference_aggregates(reference_scores: Any) -> dict[str, float] | None:
    """``{"mean": ..., "max": ...}`` of a record's ``reference_scores`` (None when it has none)."""
    if reference_scores is None:
        return None
    return {how: aggregate_references(reference_scores, how) for how in REFERENCE_AGGREGATIONS}
