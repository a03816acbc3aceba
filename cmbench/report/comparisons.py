"""Paired comparisons between leaderboard entries: the same (task, seed) pairs, ``a`` minus ``b``.

By default each entry is compared with FullKV, one direction (:func:`comparison_pairs`): the paper's
reference, so a board of ``n`` methods makes ``n - 1`` comparisons; other pairs are asked for. Pairs
match ``(task_id, seed)`` (``task_id`` alone when a side's seeds are unknown); a comparison gives the
mean difference with its cluster-robust 95% CI (contexts are the clusters: the tasks and seeds of one
context video are not independent), wins / ties / losses, the p-value of the cluster-robust paired
t-test (:mod:`cmbench.report.statistics`) and that p-value adjusted for the table's rows (Bonferroni,
``min(1, m p)`` over its ``m`` rows: the tests one table prints are one family, docs/verdicts.md), and
``verdict``: what the rule says of ``method`` against ``versus`` read as an equivalence claim in that family
("level with", "below/above ... by more than", "not resolved against": :func:`cmbench.report.verdicts.said`).
Two entries whose caches stored their rows in different precisions (``cache_dtype``) are not compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from cmbench.registry import did_you_mean
from cmbench.report.reading import ReportError, RunRecords
from cmbench.report.statistics import clustered_mean_ci, clustered_t_test
from cmbench.report.verdicts import EQUIVALENT, Claim, decide, one_precision, precision_of, said

ALL = "all"
"""``leaderboard.focus=all``: every pair of entries once."""
REFERENCE_METHOD = "fullkv"
"""The entry every other is compared with in ``paired_deltas.csv`` and, by default, ``comparisons.csv``."""


def successful(frame: pd.DataFrame) -> pd.DataFrame:
    """The records of a run that finished (``status == "ok"``)."""
    return frame[frame["status"] == "ok"]


def _pair_keys(a: RunRecords, b: RunRecords) -> list[str]:
    """Pair on (task_id, seed), or on task_id alone when either side's seeds are unknown."""
    seeded = a.frame["seed"].notna().any() and b.frame["seed"].notna().any()
    return ["task_id", "seed"] if seeded else ["task_id"]


def both_finished(a: RunRecords, b: RunRecords) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The successful records of ``a`` and of ``b`` on the pairs both finished, in the same order."""
    keys = _pair_keys(a, b)
    a_ok, b_ok = successful(a.frame), successful(b.frame)
    return a_ok.merge(b_ok[keys], on=keys), b_ok.merge(a_ok[keys], on=keys)


def _paired(a: RunRecords, b: RunRecords) -> dict[str, Any]:
    """``a`` minus ``b`` over the pairs both finished: mean, clustered CI, p-value, wins/ties/losses, pairs and
    contexts; entries of different cache precision raise :class:`cmbench.report.verdicts.VerdictError`."""
    one_precision({r.label: precision_of(r.frame, f"{r.path}") for r in (a, b)}, f"comparing {a.label} with {b.label}")
    keys = _pair_keys(a, b)
    pairs = successful(a.frame).merge(successful(b.frame)[[*keys, "score"]], on=keys, suffixes=("", "_other"))
    delta = (pairs["score"] - pairs["score_other"]).to_numpy(dtype=np.float64)
    clusters = pairs["context_id"].to_numpy()
    mean, ci = clustered_mean_ci(delta, clusters)
    return {"delta": mean, "delta_ci95": ci, "p_value": clustered_t_test(delta, clusters),
            "wins": int((delta > 0).sum()), "ties": int((delta == 0).sum()), "losses": int((delta < 0).sum()),
            "n_pairs": int(len(delta)), "contexts": int(len(set(clusters)))}


def paired_deltas(runs: list[RunRecords]) -> pd.DataFrame:
    """Per entry: mean paired score difference to FullKV (cluster-robust CI, paired t-test p-value) and
    win/tie/loss counts over the (task_id, seed) pairs both finished (task_id alone when a side's
    seeds are unknown)."""
    reference = next((r for r in runs if r.label == REFERENCE_METHOD), None)
    cols = ["method", "metric", "delta_vs_fullkv", "delta_ci95", "wins", "ties", "losses", "n_pairs", "p_value",
            "p_adjusted", "contexts"]
    if reference is None:
        return pd.DataFrame(columns=cols)
    rows = []
    for run in runs:
        if run is not reference:
            stats = _paired(run, reference)
            rows.append({"method": run.label, "metric": run.metric, "delta_vs_fullkv": stats.pop("delta"), **stats})
    return adjusted(pd.DataFrame(rows, columns=cols))


def adjusted(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``p_adjusted``: each row's ``p_value`` times the number of rows with a p-value, at most 1
    (Bonferroni over the table's tests: below 0.05 exactly when the simultaneous interval excludes 0)."""
    m = int(table["p_value"].notna().sum())
    return table.assign(p_adjusted=(table["p_value"] * m).clip(upper=1.0))


def _label_of(runs: list[RunRecords], name: str, knob: str) -> str:
    labels = [r.label for r in runs]
    if name not in labels:
        raise ReportError(f"leaderboard.{knob}: no method {name!r} on this board.{did_you_mean(name, labels)} "
                          f"On it: {', '.join(labels)}")
    return name


def comparison_pairs(runs: list[RunRecords], focus: Sequence[str] | None = None,
                     compare: Sequence[Any] | None = None) -> list[tuple[str, str]]:
    """The (method, versus) pairs to compare: by default each entry against FullKV (the entry labelled
    :data:`REFERENCE_METHOD`; none when the board has no FullKV), or each focus entry against every other
    entry (``focus=[ALL]``: every pair of entries once, in board order); then the named pairs.

    Parameters
    ----------
    runs : list of RunRecords
    focus : list of str, optional
        Labels compared with every other entry instead of the default pairs (``[]``: only the named pairs;
        ``[ALL]``, unless an entry is labelled so: every pair once, so that any two entries a board's claims
        compare, e.g. a target's top entry and its runner-up, have their paired difference).
    compare : list, optional
        One pair ``[a, b]`` or a list of pairs ``[[a, b], [c, d]]`` of labels.

    Raises
    ------
    ReportError
        A label that is not on the board, or a pair that is not two labels.
    """
    labels = [r.label for r in runs]
    if focus is not None and list([focus] if isinstance(focus, str) else focus) == [ALL] and ALL not in labels:
        pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]]
    elif focus is None:
        pairs = [(label, REFERENCE_METHOD) for label in labels if label != REFERENCE_METHOD] \
            if REFERENCE_METHOD in labels else []
    else:
        chosen = [_label_of(runs, str(f), "focus") for f in ([focus] if isinstance(focus, str) else focus)]
        pairs = [(f, r.label) for f in chosen for r in runs if r.label != f]
    named = list(compare or [])
    if len(named) == 2 and all(isinstance(x, str) for x in named):
        named = [named]
    for pair in named:
        if isinstance(pair, str) or len(pair) != 2:
            raise ReportError(f"leaderboard.compare: {pair!r} is not a pair of methods; write "
                              f"leaderboard.compare=[a,b] or leaderboard.compare=[[a,b],[c,d]]")
        pairs.append((_label_of(runs, str(pair[0]), "compare"), _label_of(runs, str(pair[1]), "compare")))
    return list(dict.fromkeys(pairs))


def comparisons(runs: list[RunRecords], pairs: Iterable[tuple[str, str]]) -> pd.DataFrame:
    """Paired comparisons of ``method`` minus ``versus`` for each pair (see :func:`_paired`)."""
    by_label = {r.label: r for r in runs}
    rows = [{"method": a, "versus": b, "metric": by_label[a].metric, **_paired(by_label[a], by_label[b]),
             "test": "cluster-robust paired t-test"} for a, b in pairs]
    table = adjusted(pd.DataFrame(rows, columns=["method", "versus", "metric", "delta", "delta_ci95", "p_value", "wins",
                                                 "ties", "losses", "n_pairs", "test", "p_adjusted", "contexts"]))
    return table.assign(verdict=verdict_words(table))


def verdict_words(table: pd.DataFrame) -> list[str]:
    """What the verdict rule says of each row's ``method`` against its ``versus``: an equivalence claim per row
    (:data:`cmbench.report.verdicts.EQUIVALENT`, its margin), the table's rows one family."""
    claims = [Claim.of_interval(f"{r.method} level with {r.versus}", EQUIVALENT, float(r.delta), float(r.delta_ci95),
                                int(r.contexts), int(r.n_pairs), a=str(r.method), b=str(r.versus))
              for r in table.itertuples()]
    return [said(d.row(), str(d.claim.b)) for d in decide(claims)]
