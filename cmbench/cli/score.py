"""``python -m cmbench score videos=DIR data=... scorer=...``: score continuations from any generator.

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
from omegaconf import DictConfig, OmegaConf

from cmbench.data import Task, load_manifest, read_video
from cmbench.errors import CMBenchError, ConfigError
from cmbench.scoring.pipeline import Scorer
from cmbench.scoring.references import reference_frames
from cmbench.scoring.registry import build_scorer

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


def _print_report(summary: dict[str, Any], out: Path) -> None:
    print(f"score: {summary['n_videos_matched']} of {summary['n_tasks']} tasks have a video in {summary['videos']}")
    if summary["missing"]:
        missing = summary["missing"]
        print(f"score: MISSING {len(missing)} video(s) (tasks without <task_id>.mp4): {', '.join(missing)}")
    if summary["extra"]:
        print(f"score: EXTRA {len(summary['extra'])} file(s) naming no task (not scored): {', '.join(summary['extra'])}")
    mean = summary["mean_score"]
    print(
        f"score: scored {summary['n_scored']}, failed {summary['n_failed']}; mean score "
        f"{'n/a' if mean is None else f'{mean:.4f}'} over scored tasks, "
        f"{summary['mean_score_all_tasks'] or 0.0:.4f} over all tasks (unscored = 0)"
    )
    for group in ("by_source", "by_task_type"):
        for name, row in summary[group].items():
            print(f"  {name:<10} n={row['n']:<4} mean={row['mean_score']:.4f}")
    print(f"score: records {out / 'records.jsonl'}, summary {out / 'summary.json'}")


def score(cfg: DictConfig) -> int:
    """CLI entry: ``cfg.videos`` (folder), ``cfg.data`` (manifest), ``cfg.scorer``, optional ``cfg.out``."""
    videos_arg = cfg.get("videos")
    if not videos_arg:
        raise ConfigError("score needs videos=DIR, a folder of <task_id>.mp4 continuations")
    videos = Path(str(videos_arg))
    if not videos.is_dir():
        raise ConfigError(f"videos={videos}: not a folder")
    if cfg.get("scorer") is None:
        raise ConfigError("score needs a scorer config: scorer=light (CPU) or scorer=owl_sam_dino (paper protocol)")
    tasks = load_manifest(Path(str(cfg.data.root)), str(cfg.data.manifest))
    scorer = build_scorer(cfg.scorer)
    out = Path(str(cfg.get("out") or videos / f"scores_{scorer.name}"))
    summary = score_folder(scorer, tasks, videos, out)
    summary = {
        "scorer": scorer.name,
        "scorer_config_hash": scorer.config_hash,
        "scorer_config": OmegaConf.to_container(cfg.scorer, resolve=True),
        "data": {"name": str(cfg.data.get("name", "")), "root": str(cfg.data.root), "manifest": str(cfg.data.manifest)},
        **summary,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print_report(summary, out)
    return 0 if summary["n_scored"] and not summary["n_failed"] else 1
