"""Score a folder of saved continuations (``python -m cmbench score``): match, score, record.

Matching: every file under the folder (recursively, the output folder excluded) whose name is
``<task_id>.mkv`` or ``<task_id>.mp4`` (suffix in any case) is the continuation of that task. When a
task has both, the lossless ``.mkv`` (what ``run`` saves beside its mp4 preview) is scored; two files
of the same kind for one task are ambiguous and the task fails naming both. Every other file is
listed as skipped with the reason, never dropped silently.

Each matched task gets one :class:`~cmbench.runs.records.TaskRecord` (``kind="score"``); any
exception while reading or scoring one task (a corrupt video, a CUDA out-of-memory error) is recorded
as that task's failure and scoring goes on.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from cmbench.data import Task
from cmbench.data.video import VideoReader
from cmbench.data.adapter import ContinuationShape, DatasetAdapter
from cmbench.lock import RunLock
from cmbench.runs.records import RecordWriter, TaskRecord, read_task_records, records_path, scored_fields
from cmbench.runs.summary import summarise
from cmbench.scoring.pipeline import Scorer

VIDEO_SUFFIXES = (".mkv", ".mp4")  # preference order: run's lossless copy first


@dataclass
class VideoMatch:
    """Files of a folder paired with tasks.

    Attributes
    ----------
    matched : list of (Task, Path)
        In manifest order.
    ambiguous : dict task_id -> list of Path
        Tasks with several files of the same kind (not scored; recorded as failed).
    missing : list of str
        Task ids without a file.
    extra : list of str
        Video files (relative to the folder) that name no task.
    skipped : list of (str, str)
        Every file not scored (relative path, reason), ``extra`` included.
    """

    matched: list[tuple[Task, Path]] = field(default_factory=list)
    ambiguous: dict[str, list[Path]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def match_videos(tasks: list[Task], videos: Path, exclude: Path | None = None) -> VideoMatch:
    """Pair tasks with ``<task_id>.mkv`` / ``<task_id>.mp4`` files anywhere under ``videos``.

    Parameters
    ----------
    tasks : list of Task
    videos : Path
        The folder, searched recursively.
    exclude : Path or None
        A folder under ``videos`` to leave out (``score``'s own output folder).
    """
    videos = Path(videos)
    found: dict[str, list[Path]] = defaultdict(list)
    result = VideoMatch()
    ids = {t.task_id for t in tasks}
    for path in sorted(p for p in videos.rglob("*") if p.is_file()):
        if exclude is not None and path.is_relative_to(exclude):
            continue
        rel = path.relative_to(videos).as_posix()
        suffix = path.suffix.lower()
        if suffix not in VIDEO_SUFFIXES:
            result.skipped.append((rel, f"not a {' or '.join(VIDEO_SUFFIXES)} video"))
        elif path.stem not in ids:
            result.extra.append(rel)
            result.skipped.append((rel, "names no task of the manifest"))
        else:
            found[path.stem].append(path)
    for task in tasks:
        paths = found.get(task.task_id)
        if not paths:
            result.missing.append(task.task_id)
            continue
        rank = min(VIDEO_SUFFIXES.index(p.suffix.lower()) for p in paths)
        best = [p for p in paths if VIDEO_SUFFIXES.index(p.suffix.lower()) == rank]
        for other in paths:
            if other not in best:
                result.skipped.append((other.relative_to(videos).as_posix(),
                                       f"{best[0].relative_to(videos).as_posix()} is scored instead"))
        if len(best) > 1:
            result.ambiguous[task.task_id] = best
        else:
            result.matched.append((task, best[0]))
    return result


def shape_warning(path: Path, shape: Sequence[int], expected: ContinuationShape) -> str | None:
    """A warning when a video's length or frame size differs from the dataset's continuation shape.

    Parameters
    ----------
    shape : sequence of int
        The video's ``(F, H, W, ...)``.
    """
    count, height, width = shape[:3]
    wrong_size = (height, width) != (expected.height, expected.width)
    wrong_length = expected.frames is not None and count != expected.frames
    if not (wrong_size or wrong_length):
        return None
    want = f"{expected.frames} frames of " if expected.frames is not None else ""
    return f"{path}: {count} frames of {height}x{width}, the task expects {want}{expected.height}x{expected.width}"


def score_folder(
    scorer: Scorer,
    tasks: list[Task],
    adapter: DatasetAdapter,
    videos: Path,
    out: Path,
    *,
    label: str,
    metric: str,
) -> dict[str, Any]:
    """Score every matched video; write ``records.jsonl`` into ``out`` and return the summary.

    Parameters
    ----------
    scorer : Scorer
    tasks : list of Task
        The manifest's tasks.
    adapter : DatasetAdapter
        Names each task's reference frames and decodes them only on a feature-cache miss
        (:meth:`DatasetAdapter.references`), and says what a continuation should look like.
    videos, out : Path
    label : str
        The records' leaderboard name.
    metric : str
        What the scorer measures (:func:`cmbench.runs.records.metric_name`).

    Returns
    -------
    dict
        :func:`cmbench.runs.summary.summarise` of the records, plus ``videos``, ``extra``,
        ``skipped`` (``[path, reason]`` pairs), ``warnings`` and the feature cache's counters.
    """
    match = match_videos(tasks, videos, exclude=out)
    expected = adapter.continuation_shape()
    warnings: list[str] = []
    base = {"kind": "score", "label": label, "scorer": scorer.name, "scorer_hash": scorer.config_hash,
            "metric": metric}
    path = records_path(out)
    with RunLock(path):
        writer = RecordWriter(path, fresh=True)
        for task, video in _in_order(tasks, match):
            fields: dict[str, Any] = {**base, "task_id": task.task_id, "context_id": task.context_id, "source": task.source,
                      "task_type": task.task_type}
            try:
                if video is None:
                    names = ", ".join(p.relative_to(videos).as_posix() for p in match.ambiguous[task.task_id])
                    raise FileExistsError(f"several videos for this task: {names}")
                reader = VideoReader(video)  # streamed: one batch of decoded frames at a time
                scored = scorer.score_task(task, reader, adapter.references(task))
                assert reader.shape is not None  # set by the scorer's pass over the video
                warning = shape_warning(video, reader.shape, expected)
                if warning:
                    warnings.append(warning)
                    print(f"score: warning: {warning}", file=sys.stderr)
                record = TaskRecord(**{**fields, **scored_fields(scored), "video": str(video), "status": "ok"})
            except Exception as err:  # any failure of one task (corrupt video, CUDA OOM) is that task's
                record = TaskRecord(**fields, video=None if video is None else str(video), status="failed",
                                    error=f"{type(err).__name__}: {err}")
                print(f"score: {task.task_id}: failed: {err}", file=sys.stderr)
            writer.write(record)
    summary = summarise(read_task_records(out), [t.task_id for t in tasks])
    return {
        **summary,
        "videos": str(videos),
        "extra": match.extra,
        "skipped": [list(s) for s in match.skipped],
        "warnings": warnings,
        "cache": {"hits": scorer.cache_hits, "misses": scorer.cache_misses},
    }


def _in_order(tasks: list[Task], match: VideoMatch) -> list[tuple[Task, Path | None]]:
    """Matched and ambiguous tasks in manifest order (None: ambiguous)."""
    paths = {t.task_id: p for t, p in match.matched}
    return [(t, paths.get(t.task_id)) for t in tasks if t.task_id in paths or t.task_id in match.ambiguous]
