"""Score a folder of continuations from any generator (what ``python -m cmbench score`` runs).

Every ``<task_id>.mp4`` in ``videos`` is matched to a task of the manifest. Tasks without a video
(missing) and videos without a task (extra) are both listed, never dropped silently; the matched
videos are scored. Outputs in ``out`` (default ``<videos>/scores_<scorer name>``):

- ``records.jsonl``: one line per matched task, flushed as it is written; a task whose video cannot
  be read is recorded with ``status: failed`` and its reason, and scoring goes on;
- ``summary.json``: the scorer config and hash, counts, missing and extra lists, and mean scores
  overall, per source and per task type.

Exit status 0 when every matched video was scored, 1 when some failed or none matched.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from cmbench.data import Task, read_video
from cmbench.errors import CMBenchError
from cmbench.scoring.pipeline import Scorer
from cmbench.scoring.references import reference_frames

VIDEO_SUFFIX = ".mp4"


def match_videos(tasks: list[Task], videos: Path) -> tuple[list[Task], list[str], list[str]]:
    """Pair tasks with ``<task_id>.mp4`` files.

    Returns
    -------
    matched : list of Task (manifest order)
    missing : list of task ids without a video
    extra : list of file names in ``videos`` that name no task (``.mp4`` files only)
    """
    files = {p.stem: p.name for p in videos.glob(f"*{VIDEO_SUFFIX}") if p.is_file()}
    ids = {t.task_id for t in tasks}
    matched = [t for t in tasks if t.task_id in files]
    missing = [t.task_id for t in tasks if t.task_id not in files]
    extra = sorted(name for stem, name in files.items() if stem not in ids)
    return matched, missing, extra


class _ContextFrames:
    """Reference frames of tasks, decoding each context video once while its tasks come in a row."""

    def __init__(self):
        self._path: Path | None = None
        self._frames: np.ndarray | None = None
        self._fps = 0.0

    def for_task(self, task: Task) -> list[np.ndarray]:
        if task.video_path != self._path:
            self._path = None  # a failed decode must not leave the previous video in place
            self._frames, self._fps = read_video(task.video_path)
            self._path = task.video_path
        return reference_frames(task, self._frames, self._fps, native=True)


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summarize(records: list[dict[str, Any]], n_tasks: int) -> dict[str, Any]:
    """Counts and mean scores of scored records (``status == "ok"``), overall and per group.

    ``mean_score`` averages scored tasks only; ``mean_score_all_tasks`` counts every task of the
    manifest that was not scored (missing video or failure) as 0.
    """
    ok = [r for r in records if r["status"] == "ok"]
    by: dict[str, dict[str, list[float]]] = {"source": defaultdict(list), "task_type": defaultdict(list)}
    for r in ok:
        for key in by:
            by[key][r[key]].append(r["score"])
    return {
        "n_scored": len(ok),
        "n_failed": len(records) - len(ok),
        "mean_score": _mean([r["score"] for r in ok]),
        "mean_score_all_tasks": float(sum(r["score"] for r in ok) / n_tasks) if n_tasks else None,
        "mean_detection_rate": _mean([r["detection_rate"] for r in ok]),
        "by_source": {k: {"n": len(v), "mean_score": _mean(v)} for k, v in sorted(by["source"].items())},
        "by_task_type": {k: {"n": len(v), "mean_score": _mean(v)} for k, v in sorted(by["task_type"].items())},
    }


def score_folder(scorer: Scorer, tasks: list[Task], videos: Path, out: Path) -> dict[str, Any]:
    """Score every matched video, write ``records.jsonl`` and return the summary (not yet written)."""
    matched, missing, extra = match_videos(tasks, videos)
    out.mkdir(parents=True, exist_ok=True)
    contexts = _ContextFrames()
    records = []
    with open(out / "records.jsonl", "w") as handle:
        for task in matched:
            try:
                frames, _ = read_video(videos / f"{task.task_id}{VIDEO_SUFFIX}")
                record = {"status": "ok", **scorer.score_task(task, frames, contexts.for_task(task)).to_json()}
            except CMBenchError as err:
                record = {
                    "status": "failed", "task_id": task.task_id, "source": task.source, "task_type": task.task_type,
                    "error": str(err), "scorer": scorer.name, "scorer_config_hash": scorer.config_hash,
                }
                print(f"score: {task.task_id}: failed: {err}", file=sys.stderr)
            records.append(record)
            handle.write(json.dumps(record) + "\n")
            handle.flush()
    return {
        "videos": str(videos),
        "n_tasks": len(tasks),
        "n_videos_matched": len(matched),
        "missing": missing,
        "extra": extra,
        **summarize(records, len(tasks)),
        "cache": {"hits": scorer.cache_hits, "misses": scorer.cache_misses},
    }
