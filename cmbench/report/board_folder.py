"""The leaderboard folder (``leaderboard.out``): the files ``leaderboard`` and ``curves`` write there, and
the claim that lets them (:mod:`cmbench.runs.output_folder`: an empty folder, or one CMBench made)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cmbench.report.curves import (AREA_FILE, CURVES_FILE, PLOT_FILE, QUALITY_PLOT_FILE, QUALITY_TABLE_FILE,
                                   REFERENCE_FILE)
from cmbench.runs.output_folder import Legacy, OutputFolder, claim

REPORT_FILES = ("leaderboard.csv", "leaderboard_by_source.csv", "leaderboard_by_type.csv", "leaderboard_by_seed.csv",
                "paired_deltas.csv", "comparisons.csv", "backbone_gate.csv", "leaderboard.md", "pareto.png",
                "leaderboard.json", "families.csv", "families.png")
"""Every file a leaderboard writes (an earlier board's files this one does not write are removed)."""
CURVE_FILES = (CURVES_FILE, AREA_FILE, PLOT_FILE, REFERENCE_FILE, QUALITY_PLOT_FILE, QUALITY_TABLE_FILE)
"""Every file ``curves`` writes beside the board."""
SWEEPS = "sweeps"
"""The sub-folder of the boards of ``run -m`` sweeps, one folder each."""
KIND = "leaderboard"
EARLIER = Legacy(required=(("leaderboard.md", "leaderboard.csv"), (CURVES_FILE, AREA_FILE)),
                 names=(*REPORT_FILES, *CURVE_FILES, SWEEPS))
"""A board folder written before markers existed: its board or its curves; their files are adopted."""
EARLIER_SWEEPS = Legacy(required=((),), names=("*",))
"""The sweeps folder of a board folder that is CMBench's (:func:`sweeps_folder` claims that first): all of it."""


def board_folder(out: str | Path, names: Iterable[str] = REPORT_FILES, option: str = "leaderboard.out") -> OutputFolder:
    """Claim the leaderboard folder ``out`` to write ``names`` there.

    Raises
    ------
    cmbench.runs.output_folder.OutputFolderError
        ``out`` is someone else's folder, another kind of CMBench folder (a run folder), or holds a file
        of ``names`` that CMBench did not write (one line).
    """
    return claim(out, KIND, option, names=names, legacy=EARLIER)


def sweeps_folder(board: Path, name: str) -> Path:
    """Claim ``<board>/sweeps/`` for the sweep board ``name`` (``sweeps`` listed in the board folder's
    marker, ``name`` in the sweeps folder's): the sweep board's own folder, to claim with :func:`board_folder`."""
    board_folder(board, [SWEEPS]).add(SWEEPS)
    claim(board / SWEEPS, SWEEPS, "leaderboard.out", names=[name], legacy=EARLIER_SWEEPS).add(name)
    return board / SWEEPS / name


__all__ = ["CURVE_FILES", "EARLIER", "EARLIER_SWEEPS", "KIND", "REPORT_FILES", "SWEEPS", "board_folder", "sweeps_folder"]
