"""``python -m cmbench score videos=DIR data=... scorer=...``: score continuations from any generator.

Every ``<task_id>.mkv`` / ``<task_id>.mp4`` under ``videos`` (recursively; suffix in any case) is
matched to a task of the manifest (:mod:`cmbench.runs.score_videos`). Tasks without a video (missing)
and files that are not scored (skipped, with the reason) are both listed, never dropped silently.
Outputs in ``out`` (default ``<videos>/scores_<scorer name>``):

- ``config.yaml``: the data and scorer configs, the videos folder and the label;
- ``records.jsonl``: one task record per matched task (the schema ``run`` writes, ``kind: score``), so
  ``python -m cmbench leaderboard runs=[...]`` puts it beside run directories; a task that fails for
  any reason is recorded with ``status: failed`` and its reason, and scoring goes on;
- ``summary.json``: counts, missing / extra / skipped files, warnings (``lossy_videos``: lossy videos
  small enough for compression to move their scores), mean scores overall, per source and per task type.

``out`` must be empty or hold earlier scores of the same videos folder (never a run directory, nor a folder
CMBench did not write: :mod:`cmbench.runs.output_folder`); every
file is written new and renamed into place, so a rescore stopped half-way leaves the earlier scores
whole (:mod:`cmbench.runs.score_videos`).

``label=NAME`` names the records on a leaderboard (default: the videos folder's name, or the run
directory's when the folder is a run's ``videos/``). Exit status 0 when every matched video was
scored, 1 when some failed or none matched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cmbench.data import load_manifest
from cmbench.data.adapter import build_adapter
from cmbench.errors import ConfigError
from cmbench.runs import atomic
from cmbench.identity.paths import videos_label
from cmbench.runs.output_folder import Legacy, claim
from cmbench.runs.records import metric_name
from cmbench.scoring.quality_names import QUALITY_LABELS
from cmbench.runs.score_videos import VIDEO_SUFFIXES, check_output, score_folder
from cmbench.scoring.registry import build_scorer
from cmbench.spec import resolve_scoring


SCORE_FILES = ("config.yaml", "records.jsonl", "summary.json")
"""What ``score`` writes into ``out``."""
EARLIER_SCORES = Legacy(required=(("config.yaml", "records.jsonl"),), names=SCORE_FILES)
"""Scores written before output folders were marked: their config and records, nothing else."""


def _print_report(summary: dict[str, Any], out: Path) -> None:
    print(f"score: {summary['tasks_recorded']} of {summary['tasks_expected']} tasks have a video in {summary['videos']}")
    if summary["missing_task_ids"]:
        missing = summary["missing_task_ids"]
        suffixes = " / ".join(f"<task_id>{s}" for s in VIDEO_SUFFIXES)
        print(f"score: MISSING {len(missing)} video(s) (tasks without {suffixes}): {', '.join(missing)}")
    if summary["extra"]:
        print(f"score: EXTRA {len(summary['extra'])} file(s) naming no task (not scored): {', '.join(summary['extra'])}")
    if summary["skipped"]:
        print(f"score: SKIPPED {len(summary['skipped'])} file(s):")
        for path, reason in summary["skipped"]:
            print(f"  {path}: {reason}")
    mean = summary["score"]
    print(
        f"score: scored {summary['tasks_ok']}, failed {summary['tasks_failed']}; mean {summary['metric'] or 'score'} "
        f"{'n/a' if mean is None else f'{mean:.4f}'} over scored tasks, "
        f"{summary['score_all_tasks'] or 0.0:.4f} over all tasks (unscored = 0)"
    )
    for group in ("by_source", "by_type"):
        for name, row in summary[group].items():
            print(f"  {name:<10} n={row['n']:<4} mean={row['score']:.4f}")
    for name, mean in summary.get("quality", {}).items():
        print(f"score: quality {QUALITY_LABELS.get(name, name)} ({name}) mean {mean:.4f}")
    for name, reason in summary.get("quality_absent", {}).items():
        print(f"score: quality {QUALITY_LABELS.get(name, name)} ({name}) absent: {reason}")
    print(f"score: records {out / 'records.jsonl'}, summary {out / 'summary.json'}")


def execute(cfg: DictConfig) -> int:
    """CLI entry: ``cfg.videos`` (folder), ``cfg.data`` (manifest), ``cfg.scorer``, optional ``cfg.out``
    and ``cfg.label``, resolved and checked first (:func:`cmbench.spec.resolve_scoring`)."""
    spec = resolve_scoring(cfg)
    videos = spec.videos
    if not videos.is_dir():
        raise ConfigError(f"videos={videos}: not a folder")
    adapter = build_adapter(spec.data.config)
    adapter.ensure()
    tasks = load_manifest(spec.data.root, spec.data.manifest)
    scorer = build_scorer(spec.scorer)
    out = spec.out or videos / f"scores_{scorer.name}"
    label = spec.label or videos_label(videos.resolve())
    config = {"data": spec.data.config, "scorer": spec.scorer, "videos": str(videos), "label": label}
    check_output(out, videos)
    folder = claim(out, "score", "out", names=SCORE_FILES, legacy=EARLIER_SCORES)  # empty, or scores CMBench wrote
    folder.add(*SCORE_FILES)
    summary = score_folder(scorer, tasks, adapter, videos, out, label=label, metric=metric_name(spec.scorer))
    atomic.write_text(out / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(config)))
    summary = {
        "label": label,
        "scorer": scorer.name,
        "scorer_hash": scorer.config_hash,
        "scorer_config": spec.scorer,
        "data": {"name": spec.data.name, "root": str(spec.data.root), "manifest": spec.data.manifest},
        **summary,
    }
    atomic.write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    _print_report(summary, out)
    return 0 if summary["tasks_ok"] and not summary["tasks_failed"] else 1
