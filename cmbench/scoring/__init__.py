"""Scoring: detect (text or reference) -> segment (box prompt) -> embed -> max cosine over frames.

Entry points: :func:`build_scorer` (from a ``configs/scorer/*.yaml`` mapping), :class:`Scorer`
(``score_task`` on frames in memory), :func:`reference_frames` (pick a task's reference frames out of
its context video), and ``python -m cmbench score`` (:mod:`cmbench.cli.score`, :mod:`cmbench.runs.score_videos`).
"""

from cmbench.scoring.pipeline import Scorer, TaskScore
from cmbench.scoring.references import reference_frames
from cmbench.scoring.registry import build_scorer

__all__ = ["Scorer", "TaskScore", "build_scorer", "reference_frames"]
