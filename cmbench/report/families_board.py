"""The families board from existing runs (``python -m cmbench leaderboard ... leaderboard.families=true``): beside the
leaderboard it writes ``families.csv`` (the board with where each entry lands at its bytes target and its total
memory: :func:`cmbench.report.families.memory_columns`) and ``families.png`` (score against device KV bytes, one
curve per family member: :func:`cmbench.report.families.draw`), from the leaderboard just built. Nothing is run and
nothing outside the board's folder is written (``scripts/families_bytes.sh`` reruns every entry and rewrites the
committed results; this is how to look at runs one already has).
"""

from __future__ import annotations

from pathlib import Path

from cmbench.report.families import draw, memory_columns, read_board
from cmbench.report.reading import read_table

TABLE, FIGURE = "families.csv", "families.png"


def write_families(folder: Path) -> list[Path]:
    """Write :data:`TABLE` and :data:`FIGURE` into ``folder`` from its ``leaderboard.csv``; the paths written.

    Raises
    ------
    ValueError, CMBenchError
        The board lacks a column the figure needs (one line naming it), or its CSV cannot be read.
    """
    board = folder / "leaderboard.csv"
    memory_columns(read_table(board, (), "leaderboard", "leaderboard")).to_csv(folder / TABLE, index=False,
                                                                                float_format="%.6g")
    draw(read_board(board), folder / FIGURE)
    return [folder / TABLE, folder / FIGURE]
