"""The claims each published board states, decided by :mod:`cmbench.report.verdicts` (one family per board).

A board is its leaderboard CSV and its paired comparisons CSV (``comparisons.csv`` of ``python -m cmbench
leaderboard``); its claims are what the README and the board's markdown say about its entries:

- **families** (results/miniworld/families_bytes*): each entry against FullKV is an *equivalent* claim ("level
  with FullKV" only where it holds; "below/above FullKV by more than the margin" where it does not; "not
  resolved" otherwise), and at each bytes target (and for the storage formats alone) the top entry's *lead*
  over the runner-up ("best" only where it holds, else "top group (not resolved)"); an entry that scores the same
  as the top on every (task, seed), one setup read twice, is named beside it, never its runner-up;
- **kvpress** (results/miniworld/kvpress_*): each press against Random at DeCoPrune's per-chunk counts is an
  *equivalent* claim, and against DeCoPrune a *deficit* claim;
- **retrieval** (``scripts/retrieval_comparison.py --verdicts``, from the run folders): at each target PR, each
  retrieval method level with FullKV (*equivalent*) and ahead of DeCoPrune at that target (*lead*).

``python scripts/board_verdicts.py`` writes each board's verdict CSV beside it; ``scripts/families_bytes.sh``
does so for the families board it builds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from cmbench.report.comparisons import comparisons
from cmbench.report.families import bytes_target, memory_columns
from cmbench.report.reading import read_records, read_table
from cmbench.report.verdicts import (
    DEFICIT,
    EQUIVALENT,
    LEAD,
    Claim,
    Decided,
    claim_of_pair,
    decide,
    one_precision,
)

REFERENCE = "fullkv"
PAIR_COLUMNS = ("method", "versus", "delta", "delta_ci95", "p_value", "n_pairs")
KVPRESS_RANDOM, KVPRESS_DECOPRUNE = "random@pr85", "decoprune@pr85"
"""The kvpress board's controls: Random at DeCoPrune's per-chunk counts and DeCoPrune, both at PR 0.85."""


def read_board(board_path: Path, pairs_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A board's leaderboard CSV and comparisons CSV, read as data, its entries of one cache precision (the
    ``cache_dtype`` column; absent: every entry float32, boards from before it)."""
    board = read_table(board_path, ("method", "score"), "leaderboard", "leaderboard")
    pairs = read_table(pairs_path, PAIR_COLUMNS, "comparisons", "leaderboard")
    board["score"] = pd.to_numeric(board["score"], errors="raise")
    for column in PAIR_COLUMNS[2:]:
        pairs[column] = pd.to_numeric(pairs[column], errors="raise")
    if "cache_dtype" in board.columns:
        one_precision({str(m): "float32" if pd.isna(d) else str(d) for m, d in zip(board["method"], board["cache_dtype"])},
                      str(board_path))
    return board, pairs


def target_groups(board: pd.DataFrame) -> list[tuple[float | None, pd.DataFrame]]:
    """The board's entries but FullKV by bytes target (largest first; the storage formats alone, no target,
    last), each group sorted by score, highest first. An entry whose realised bytes miss its target by more than
    the landing tolerance (:func:`cmbench.report.families.on_target`) is in no group: it is not ranked there."""
    rows = board[board["method"] != REFERENCE].copy()
    rows["target"] = [bytes_target(str(m)) for m in rows["method"]]
    if "kv_bytes_ratio" in rows.columns:  # where it lands: its device bytes, a store kept on the device included
        rows = rows[memory_columns(board).loc[rows.index, "on_target"].astype(bool)]
    rows["order"] = rows["target"].fillna(-1.0)
    rows = rows.sort_values(["order", "score"], ascending=[False, False], kind="stable")
    return [(None if order < 0 else float(order), group) for order, group in rows.groupby("order", sort=False)]


def same_scores(pairs: pd.DataFrame, a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` scored the same on every (task, seed) they share: their paired difference is 0 with
    no spread. One setup read twice (WorldKV with its store on the host and on the device: the same rows attend),
    or two rules that keep the same tokens; no lead of one over the other can be claimed."""
    rows = pairs[((pairs["method"] == a) & (pairs["versus"] == b)) | ((pairs["method"] == b) & (pairs["versus"] == a))]
    return bool(len(rows)) and all(r.n_pairs > 0 and r.delta == 0 and r.delta_ci95 == 0 for r in rows.itertuples())


def top_and_runner_up(group: Sequence[str], pairs: pd.DataFrame) -> tuple[str, str | None, list[str]]:
    """The top entry of a group sorted by score, its runner-up (None when there is none) and the entries that
    score the same as the top on every (task, seed) (:func:`same_scores`): those are not its runner-up."""
    top, rest = group[0], list(group[1:])
    same = [m for m in rest if same_scores(pairs, top, m)]
    runner = next((m for m in rest if m not in same), None)
    return top, runner, same


def families_claims(board: pd.DataFrame, pairs: pd.DataFrame, where: str) -> list[Claim]:
    """The families board's claims: every entry level with FullKV (off its target or not), then each target's top
    entry ahead of its runner-up among the entries that landed there, an entry that scores the same as the top on
    every (task, seed) not counted as one (:func:`top_and_runner_up`; a pair the comparisons lack is listed,
    untested)."""
    claims = [claim_of_pair(pairs, str(m), REFERENCE, EQUIVALENT, f"{m} level with {REFERENCE}", where)
              for m in board["method"] if str(m) != REFERENCE]
    for _, group in target_groups(board):
        top, runner, _ = top_and_runner_up([str(m) for m in group["method"]], pairs)
        if runner is not None:
            claims.append(claim_of_pair(pairs, top, runner, LEAD, f"{top} ahead of {runner}", where))
    return claims


def kvpress_claims(board: pd.DataFrame, pairs: pd.DataFrame, where: str) -> list[Claim]:
    """The kvpress board's claims: each press level with Random (at DeCoPrune's per-chunk counts), and each press
    below DeCoPrune."""
    presses = [str(m) for m in board.sort_values("score", ascending=False, kind="stable")["method"]
               if str(m).startswith("kvpress_")]
    return [claim_of_pair(pairs, p, KVPRESS_RANDOM, EQUIVALENT, f"{p} level with {KVPRESS_RANDOM}", where)
            for p in presses] + \
        [claim_of_pair(pairs, p, KVPRESS_DECOPRUNE, DEFICIT, f"{p} below {KVPRESS_DECOPRUNE}", where) for p in presses]


BOARDS: dict[str, Callable[[pd.DataFrame, pd.DataFrame, str], list[Claim]]] = {
    "families": families_claims, "kvpress": kvpress_claims}
"""Each board's claims, by its name."""


COMMITTED = {
    "families": tuple(Path(f"results/miniworld/families_bytes{s}.csv") for s in ("", "_comparisons", "_verdicts")),
    "kvpress": tuple(Path(f"results/miniworld/kvpress_{s}.csv") for s in ("leaderboard", "comparisons", "verdicts")),
}
"""Each committed board: its leaderboard CSV, comparisons CSV and verdict CSV (relative to the repository)."""


def board_verdicts(kind: str, board_path: Path, pairs_path: Path) -> list[Decided]:
    """The claims of the board ``kind`` (:data:`BOARDS`) read from its CSVs, decided as one family."""
    board, pairs = read_board(board_path, pairs_path)
    return decide(BOARDS[kind](board, pairs, str(pairs_path)))


RETRIEVAL = ("worldkv", "worldkv_fixed_window", "key_retrieval")
"""The retrieval methods whose claims the retrieval comparison states."""


def retrieval_verdicts(points: Sequence[tuple[str, float, str | Path]], fullkv: str | Path) -> list[Decided]:
    """The retrieval comparison's claims from its run folders, decided as one family: at each target PR, each
    retrieval method level with FullKV and ahead of DeCoPrune calibrated to that target (paired by task and seed
    on the tasks both ran; entries of different cache precision are refused).

    Parameters
    ----------
    points : list of (method, target PR, run folder)
        The points of the comparison's curves.
    fullkv : path
        The FullKV run folder of the same tasks.
    """
    runs = {"fullkv": replace(read_records(fullkv), label=REFERENCE)}
    for method, target, folder in points:
        runs[f"{method}@{target:g}"] = replace(read_records(folder), label=f"{method}@{target:g}")
    wanted = []
    for method, target, _ in points:
        if method in RETRIEVAL:
            label, deco = f"{method}@{target:g}", f"decoprune@{target:g}"
            wanted.append((label, REFERENCE, EQUIVALENT, f"{label} level with {REFERENCE}"))
            if deco in runs:
                wanted.append((label, deco, LEAD, f"{label} ahead of {deco}"))
    table = comparisons(list(runs.values()), [(a, b) for a, b, _, _ in wanted])
    return decide([Claim.of_interval(name, kind, float(row.delta), float(row.delta_ci95), int(row.contexts),
                                     int(row.n_pairs), a=a, b=b)
                   for (a, b, kind, name), row in zip(wanted, table.itertuples())])
