"""Scoring: detect (text or reference) -> segment (box prompt) -> embed -> max cosine over frames.

Entry points: :func:`build_scorer` (from a ``configs/scorer/*.yaml`` mapping), :class:`Scorer`
(``score_task`` on frames in memory), :class:`TaskReferences` (a task's reference frames, named by
content and decoded on demand), :func:`reference_frames` (pick them out of frames in memory), and
``python -m cmbench score`` (:mod:`cmbench.cli.score`).
"""

from cmbench.scoring.pipeline import Scorer, TaskScore
from cmbench.data.references import TaskReferences, reference_frames
from cmbench.scoring.registry import build_scorer

__all__ = ["Scorer", "TaskReferences", "TaskScore", "build_scorer", "reference_frames"]
