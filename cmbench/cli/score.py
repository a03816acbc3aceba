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
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cmbench.data import load_manifest
from cmbench.errors import ConfigError
from cmbench.runs.score_videos import score_folder
from cmbench.scoring.registry import build_scorer


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


def execute(cfg: DictConfig) -> int:
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
