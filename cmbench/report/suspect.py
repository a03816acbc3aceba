"""Suspect continuations on a board: counted per entry, marked, and left out of the ranking unless asked.

A record is suspect when its continuation breaks continuity (:mod:`cmbench.scoring.continuity`: its
``suspect`` reason, or a ``continuity`` error over :data:`~cmbench.scoring.continuity.CONTINUITY_THRESHOLD`
in a record written without the reason). An entry with a suspect record keeps its row, marked ``§`` with
the count in ``suspect_tasks``, but is listed after every entry without one whatever its score (not ranked
among them); ``leaderboard.allow_suspect=true`` ranks it by score like the others.
"""

from __future__ import annotations

import pandas as pd

from cmbench.report.text import markdown_text
from cmbench.scoring.continuity import CONTINUITY_THRESHOLD

SUSPECT_COLUMN = "suspect_tasks"
SUSPECT_MARK = "§"


def suspect_count(frame: pd.DataFrame) -> int:
    """How many of an entry's records are suspect (records without the fields, older ones, are not)."""
    reason = frame["suspect"].notna() if "suspect" in frame else pd.Series(False, frame.index)
    error = pd.to_numeric(frame["continuity"], errors="coerce") if "continuity" in frame else pd.Series(dtype=float)
    over = error.reindex(frame.index).gt(CONTINUITY_THRESHOLD)
    return int((reason | over).sum())


def suspect_entries(board: pd.DataFrame) -> pd.Series:
    """Whether each row of a board has a suspect record (False for a board written before the column)."""
    if SUSPECT_COLUMN not in board.columns:
        return pd.Series(False, board.index)
    return pd.to_numeric(board[SUSPECT_COLUMN], errors="coerce").fillna(0).gt(0)


def ranked(board: pd.DataFrame, allow_suspect: bool = False) -> pd.DataFrame:
    """The board by score, best first, with a ``ranked`` column: rows with a suspect record come after all the
    others (by score among themselves) and are not ranked, unless ``allow_suspect``. The index is reset."""
    left_out = (suspect_entries(board) & (not allow_suspect)).to_numpy()
    order = board.assign(ranked=~left_out).sort_values(["ranked", "score"], ascending=[False, False], kind="stable")
    return order.reset_index(drop=True)


def suspect_note(board: pd.DataFrame) -> str:
    """The board's note on its suspect entries (markdown), or "" when it has none."""
    flagged = suspect_entries(board)
    if not flagged.any():
        return ""
    names = ", ".join(f"{markdown_text(str(m))} ({int(n)})" for m, n in
                      zip(board.loc[flagged, "method"], board.loc[flagged, SUSPECT_COLUMN]))
    asked = "ranked" in board.columns and bool(board.loc[flagged, "ranked"].astype(bool).all())
    placed = ("ranked by score as asked (`leaderboard.allow_suspect=true`)" if asked else
              "listed after the ranked entries whatever their score, not ranked (`leaderboard.allow_suspect=true` "
              "ranks them)")
    return (f"{SUSPECT_MARK} suspect continuations (their frames do not continue the context's last frame as the "
            f"task's camera moves: continuity error over {CONTINUITY_THRESHOLD}, docs/scoring.md#continuity): "
            f"{names}; {placed}. See `{SUSPECT_COLUMN}` in leaderboard.csv and each record's `suspect`.")
