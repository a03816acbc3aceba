"""Score a folder of saved continuations (``python -m cmbench score``): match, score, record.

Matching: every file under the folder (recursively, the output folder excluded) whose name is
``<task_id>.mkv`` or ``<task_id>.mp4`` (suffix in any case) is the continuation of that task. When a
task has both, the lossless ``.mkv`` (what ``run`` saves beside its mp4 preview) is scored; two files
of the same kind for one task are ambiguous and the task fails naming both. Every other file is
listed as skipped with the reason, never dropped silently.

Only the frames the task defines are scored (:mod:`cmbench.scoring.frame_count`): extra frames are
counted, never scored, and a shorter video is recorded as a failed task (scored as missing); every
record says how many frames came (``frames_received``) and how many were scored (``n_frames``).

Each matched task gets one :class:`~cmbench.runs.records.TaskRecord` (``kind="score"``); any
exception while reading or scoring one task (a corrupt video, a CUDA out-of-memory error) is recorded
as that task's failure and scoring goes on.

The output folder is data (:func:`check_output`): it must be empty or hold earlier scores of the same
videos folder, never a run's records. Records go into a new hidden file, renamed over
``records.jsonl`` once every task is done, so a rescore stopped half-way keeps the earlier records
whole (rescoring is cheap: the scorer's feature cache keeps what was computed).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from functools import partial
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


import numpy as np
from omegaconf import OmegaConf

from cmbench import bounded_read
from cmbench.data import Task
from cmbench.data.adapter import ContinuationShape, DatasetAdapter
from cmbench.data.video import VideoReader, is_lossless
from cmbench.runs import atomic
from cmbench.lock import RunFolderError, RunLock
from cmbench.runs.records import (
    RUN_FILE,
    RecordsError,
    RecordWriter,
    TaskRecord,
    read_records_file,
    read_task_records,
    records_files,
    records_path,
    scored_fields,
)
from cmbench.runs.summary import summarise
from cmbench.miniworld.readers import camera_plan
from cmbench.scoring.continuity import continuity_fields
from cmbench.scoring.frame_count import TooFewFrames
from cmbench.scoring.pipeline import Scorer

VIDEO_SUFFIXES = (".mkv", ".mp4")  # preference order: run's lossless copy first
LOSSY_WARN_SIDE = 128
"""A lossy video whose smaller side is under this many pixels is warned about: at such sizes the
codec's blocks are a large share of every object, and a run's 32x32 continuations rescored from mp4
copies score measurably differently from the run's own lossless ones (README, ``score``)."""


def check_output(out: Path, videos: Path) -> None:
    """Refuse an output folder that is not empty and not earlier scores of ``videos``.

    Raises
    ------
    RunFolderError
        ``out`` is not a folder, holds a run (``run.json``, records of ``kind`` run, shard files),
        or the scores of another videos folder (its ``config.yaml`` names another ``videos``).
    """
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"out={out}: not a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    refuse = f"out={out}: holds the records of a run"
    hint = "; score writes a folder of its own: choose another out= (default: <videos>/scores_<scorer>)"
    if (out / RUN_FILE).exists() or records_files(out) != [records_path(out)] and records_files(out):
        raise RunFolderError(refuse + hint)
    if records_path(out).is_file():
        try:
            kinds = {r.kind for r, _ in read_records_file(records_path(out))}
        except RecordsError as err:
            raise RunFolderError(f"out={out}: holds unreadable records ({err}){hint}") from err
        if kinds - {"score"}:
            raise RunFolderError(f"{refuse} (records of kind {', '.join(sorted(map(str, kinds - {'score'})))}){hint}")
    config = out / "config.yaml"
    if config.is_file() or config.is_symlink():
        try:
            text = bounded_read.read_text(config, "config") if config.is_file() else None
            scored = OmegaConf.to_container(OmegaConf.create(text)) if text is not None else None
        except bounded_read.ReadLimitError as err:
            raise RunFolderError(f"out={out}: {err}{hint}") from err
        except Exception as err:  # any yaml error: the folder is not ours to overwrite
            raise RunFolderError(f"out={out}: its config.yaml is unreadable ({type(err).__name__}){hint}") from err
        named = scored.get("videos") if isinstance(scored, dict) else None
        if named is None or Path(str(named)).resolve() != videos.resolve():
            raise RunFolderError(f"out={out}: holds the scores of {named or 'something else'}, not of {videos}{hint}")


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
    lossy: dict[str, list[str]] = defaultdict(list)  # "<codec> at HxW" -> videos (relative to ``videos``)
    base = {"kind": "score", "label": label, "scorer": scorer.name, "scorer_hash": scorer.config_hash,
            "metric": metric}
    path = records_path(out)
    with RunLock(path):
        atomic.remove_stale(out, path.name)  # left by a score that was killed
        partial = atomic.new_sibling(path)
        try:
            _score_into(RecordWriter(partial), scorer, tasks, adapter, videos, match, base, expected, warnings,
                        lossy)
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
    if lossy:
        for kind, names in lossy.items():
            print(f"score: warning: {len(names)} video(s) are lossy ({kind}): at this size compression moves "
                  f"scores (keep continuations lossless, e.g. FFV1 .mkv as run saves them): "
                  f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}", file=sys.stderr)
    summary = summarise(read_task_records(out), [t.task_id for t in tasks])
    return {
        **summary,
        "videos": str(videos),
        "extra": match.extra,
        "skipped": [list(s) for s in match.skipped],
        "warnings": warnings,
        "lossy_videos": sorted(n for names in lossy.values() for n in names),
        "cache": {"hits": scorer.cache_hits, "misses": scorer.cache_misses},
    }


def _score_into(writer: RecordWriter, scorer: Scorer, tasks: list[Task], adapter: DatasetAdapter, videos: Path,
                match: VideoMatch, base: dict[str, Any], expected: ContinuationShape, warnings: list[str],
                lossy: dict[str, list[str]]) -> None:
    """Score every matched task into ``writer``; shape warnings into ``warnings``, lossy videos into ``lossy``."""
    for task, video in _in_order(tasks, match):
        fields: dict[str, Any] = {**base, "task_id": task.task_id, "context_id": task.context_id, "source": task.source,
                  "task_type": task.task_type}
        try:
            if video is None:
                names = ", ".join(p.relative_to(videos).as_posix() for p in match.ambiguous[task.task_id])
                raise FileExistsError(f"several videos for this task: {names}")
            reader = VideoReader(video)  # streamed: one batch of decoded frames at a time
            scored = scorer.score_task(task, reader, adapter.references(task), frames_defined=expected.frames)
            assert reader.shape is not None  # set by the scorer's pass over the video
            if reader.codec and not is_lossless(reader.codec) and min(reader.shape[1:3]) < LOSSY_WARN_SIDE:
                lossy[f"{reader.codec} at {reader.shape[1]}x{reader.shape[2]}"].append(
                    video.relative_to(videos).as_posix())
            warning = shape_warning(video, reader.shape, expected)
            if warning:
                warnings.append(warning)
                print(f"score: warning: {warning}", file=sys.stderr)
            continuity = continuity_fields(camera_plan(task), partial(context_frames, adapter, task), VideoReader(video))
            if continuity["suspect"]:
                print(f"score: {task.task_id}: suspect: {continuity['suspect']}", file=sys.stderr)
            record = TaskRecord(**{**fields, **scored_fields(scored), **continuity, "video": str(video), "status": "ok"})
        except TooFewFrames as err:  # scored as missing: nothing of it is scored
            record = TaskRecord(**fields, video=str(video), status="failed", error=f"{type(err).__name__}: {err}",
                                frames_received=err.received, n_frames=0)
            print(f"score: {task.task_id}: failed: {err}", file=sys.stderr)
        except Exception as err:  # any failure of one task (corrupt video, CUDA OOM) is that task's
            record = TaskRecord(**fields, video=None if video is None else str(video), status="failed",
                                error=f"{type(err).__name__}: {err}")
            print(f"score: {task.task_id}: failed: {err}", file=sys.stderr)
        writer.write(record)


def context_frames(adapter: DatasetAdapter, task: Task) -> np.ndarray:
    """The context frames of ``task`` as its dataset gives them (``uint8 [F, H, W, 3]``)."""
    return adapter.reference_source(task)[0]


def _in_order(tasks: list[Task], match: VideoMatch) -> list[tuple[Task, Path | None]]:
    """Matched and ambiguous tasks in manifest order (None: ambiguous)."""
    paths = {t.task_id: p for t, p in match.matched}
    return [(t, paths.get(t.task_id)) for t in tasks if t.task_id in paths or t.task_id in match.ambiguous]
