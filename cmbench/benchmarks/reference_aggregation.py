"""How much a leaderboard's ranking moves between the two reference aggregations.

A task with several references scores either the mean or the max of the references' best cosines
(``leaderboard.reference_aggregation``; docs/protocol.md, "Scorer"). :func:`ranking_shift` reads run
directories once per aggregation, as the leaderboard does, and compares each method's score and rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from cmbench.report.leaderboard import leaderboard, load_runs
from cmbench.config_schema import REFERENCE_AGGREGATIONS


def ranking_shift(run_dirs: Iterable[str | Path], allow_mixed: bool = False) -> tuple[pd.DataFrame, dict]:
    """Each method's score and rank under ``mean`` and under ``max``.

    Returns
    -------
    (DataFrame, dict)
        One row per board entry: ``method``, ``score_mean``, ``score_max``, ``rank_mean``, ``rank_max``
        (1 = best; ties share the best rank), ``rank_change``; and a summary: ``methods``, ``tasks``
        (successful (task, seed) records of the first run), ``multi_reference_tasks`` (of those, with
        more than one reference), ``moved`` (methods whose rank changes), ``max_rank_change`` and
        ``kendall_tau`` between the two rankings (1.0: the same order).
    """
    dirs = list(run_dirs)
    columns = {}
    first = None
    for how in REFERENCE_AGGREGATIONS:
        runs = load_runs(dirs, allow_mixed, reference_aggregation=how)
        first = first or runs[0]
        columns[how] = leaderboard(runs).set_index("method")["score"]
    table = pd.DataFrame({f"score_{how}": col for how, col in columns.items()})
    for how in REFERENCE_AGGREGATIONS:
        table[f"rank_{how}"] = table[f"score_{how}"].rank(ascending=False, method="min").astype(int)
    table["rank_change"] = table["rank_max"] - table["rank_mean"]
    table = table.sort_values(["rank_mean", "rank_max"]).reset_index(names="method")
    assert first is not None
    ok = first.frame[first.frame["status"] == "ok"]
    refs = ok["reference_scores"].map(lambda r: len(r) if isinstance(r, list) else 0)
    tau = table["score_mean"].corr(table["score_max"], method="kendall") if len(table) > 1 else 1.0
    summary = {"methods": len(table), "tasks": int(len(ok)), "multi_reference_tasks": int((refs > 1).sum()),
               "moved": int((table["rank_change"] != 0).sum()), "max_rank_change": int(table["rank_change"].abs().max()),
               "kendall_tau": float(tau)}
    return table, summary
