"""Recheck a received run folder before it joins a board (``python -m cmbench verify RUN``).

Three checks, each giving one line per difference (:class:`Problem`):

- **scores**: the run's saved continuations (``videos/``) are scored again with the scorer its
  ``config.yaml`` names (:func:`cmbench.runs.score_videos.score_folder`, into a temporary folder) and each
  task's score compared with its record's;
- **PR and bytes**: each record's ``pr``, ``kv_bytes_ratio``, ``mean_kv_bytes`` and ``fullkv_kv_bytes``
  recomputed from its ``ledger`` (:func:`cmbench.cache.ledger.ledger_totals`);
- **code identity**: each record's ``code_hash`` against the hash of its own ``code`` parts, and the parts
  this checkout can compute (CMBench's result code, the manifest of the local dataset, the scorer's
  config and models hashes after rescoring) against the record's; the context video's hash against the
  local copy's.

The folder is data: its records and config are read within their bounds (:mod:`cmbench.bounded_read`),
nothing in it is written, and nothing it names is imported: a dataset adapter or a method that is not
built in is reported, never loaded. Checks it cannot make (a record without a ledger, a plug-in method's
source) are problems too: an unverifiable run is not a verified one.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from cmbench.cache.ledger import ledger_totals
from cmbench.data.task import Task
from cmbench.errors import ConfigError
from cmbench.hashing import json_digest
from cmbench.identity.code import HASH_DIGITS, cmbench_code_hash
from cmbench.runs.records import TaskRecord, latest_records, read_task_records, records_files

LEDGER_FIELDS = {"pr": "pruning_ratio", "kv_bytes_ratio": "kv_bytes_ratio", "mean_kv_bytes": "mean_stored_bytes",
                 "fullkv_kv_bytes": "mean_full_bytes"}
"""A record's field and the :func:`ledger_totals` entry it must equal."""
RELATIVE = 1e-9  # PR and bytes are sums of integers: recomputed, they agree to rounding


@dataclass(frozen=True)
class Problem:
    """One difference: where (``task <id>``, or the run) and what."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def _close(a: float | None, b: float | None, tolerance: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=tolerance, abs_tol=tolerance)


def ledger_problems(record: TaskRecord) -> list[Problem]:
    """A successful record's PR and bytes against its ledger."""
    where = f"task {record.task_id}"
    if record.ledger is None:
        return [Problem(where, "no ledger in its record (written before the field): its PR and bytes cannot be "
                               "recomputed")]
    totals = ledger_totals(record.ledger)
    problems = [Problem(where, f"ledger: {what}") for what in ledger_shape_problems(record.ledger)]
    for field, key in LEDGER_FIELDS.items():
        recorded, derived = getattr(record, field), totals[key]
        if not _close(recorded, derived, RELATIVE):
            problems.append(Problem(where, f"{field}: recorded {recorded}, its ledger gives {derived}"))
    return problems


def ledger_shape_problems(rows: list[list[int]]) -> list[str]:
    """What no ledger of a real run shows: a head seeing more history than FullKV holds, FullKV's history
    shrinking from one chunk to the next, or FullKV's bytes per token changing (the geometry and the
    precision fix them)."""
    problems = []
    for i, row in enumerate(rows):
        if row[0] > row[1]:
            problems.append(f"chunk {i}: {row[0]} visible tokens, more than FullKV's {row[1]}")
    if any(b[1] < a[1] for a, b in zip(rows, rows[1:])):
        problems.append("FullKV's history shrinks between chunks")
    per_token = {row[3] / row[1] for row in rows if row[1]}
    if len(per_token) > 1:
        problems.append(f"FullKV's bytes per token differ between chunks ({', '.join(f'{b:g}' for b in sorted(per_token))})")
    return problems


def code_problems(record: TaskRecord, current: Mapping[str, str | None]) -> list[Problem]:
    """A record's code identity: its hash against its parts, and each part this checkout computes
    (``current``: part -> hash) against its own."""
    where = f"task {record.task_id}"
    code = record.code
    if not isinstance(code, dict):
        return [Problem(where, "no code identity in its record")]
    problems = []
    if json_digest(code)[:12] != record.code_hash:
        problems.append(Problem(where, f"code_hash: recorded {record.code_hash}, its code parts hash to "
                                       f"{json_digest(code)[:12]}"))
    for part, value in current.items():
        if code.get(part) != value:
            problems.append(Problem(where, f"code.{part}: recorded {code.get(part)}, this checkout's is {value}"))
    if code.get("method") is not None:
        problems.append(Problem(where, f"code.method: a plug-in method ({record.method}): its source is not "
                                       f"checked (verify imports nothing a received run names)"))
    return problems


def score_problems(run_dir: Path, records: Mapping[str, TaskRecord], tasks: list[Task], data: Any,
                   scorer_cfg: Mapping[str, Any], tolerance: float) -> tuple[list[Problem], str | None]:
    """The run's videos scored again with its scorer, each score against its record's.

    Returns
    -------
    problems : list of Problem
    scorer : str or None
        ``<config hash>/<models hash>`` of the scorer built here (the ``scorer`` part of a code identity).
    """
    from cmbench.data.adapter import build_adapter
    from cmbench.runs.records import metric_name
    from cmbench.runs.score_videos import score_folder
    from cmbench.scoring.registry import build_scorer

    scorer = build_scorer(scorer_cfg, cache_dir=None)
    videos = run_dir / "videos"
    if not videos.is_dir():
        return [Problem("run", f"{videos}: no videos to score again (run with save_videos=true)")], None
    problems = []
    with tempfile.TemporaryDirectory(prefix="cmbench-verify-") as out:
        score_folder(scorer, tasks, build_adapter(data), videos, Path(out) / "scores", label="verify",
                               metric=metric_name(scorer_cfg))
        rescored = latest_records(read_task_records(Path(out) / "scores"))
    for task_id, record in records.items():
        again = rescored.get(task_id)
        if again is None or again.status != "ok":
            why = "no video" if again is None else again.error
            problems.append(Problem(f"task {task_id}", f"score: cannot be recomputed ({why})"))
        elif not _close(record.score, again.score, tolerance):
            problems.append(Problem(f"task {task_id}", f"score: recorded {record.score}, its video scores {again.score}"))
    return problems, f"{scorer.config_hash}/{scorer.models_hash}"


def _received_data(config: Mapping[str, Any], data_root: str | None) -> Any:
    """The data config of a received run (``data.root`` replaced by ``data_root``), refusing an adapter that
    is not built in (it would be imported)."""
    from cmbench.data.adapter import ADAPTERS

    data = config.get("data")
    if not isinstance(data, dict):
        raise ConfigError("its config.yaml names no data config")
    adapter = str(data.get("adapter") or "official")
    if adapter not in ADAPTERS.names():
        raise ConfigError(f"its data adapter {adapter!r} is not built in: verify imports nothing a received run names")
    data = {**data, **({"root": data_root} if data_root else {})}
    if not Path(str(data.get("root"))).joinpath(str(data.get("manifest", "metadata.jsonl"))).is_file():
        raise ConfigError(f"data.root={data.get('root')}: no manifest there; give data.root=DIR, the dataset's "
                          f"folder on this machine")
    return OmegaConf.create(data)


def verify_run(run_dir: str | Path, data_root: str | None = None, tolerance: float = 1e-6) -> list[Problem]:
    """Every difference between a received run folder and what this checkout computes from it.

    Parameters
    ----------
    run_dir : path
        A ``run`` folder (``config.yaml``, ``records*.jsonl``, ``videos/``).
    data_root : str, optional
        Where the run's dataset is on this machine (default: the ``data.root`` its config names).
    tolerance : float
        How far a rescored score may be from the recorded one.

    Raises
    ------
    ConfigError
        Not a run folder, or its data cannot be found or would need code it names (one line).
    RecordsError
        An unreadable or impossible record (one line naming file, line and field).
    """
    from cmbench.data import load_manifest
    from cmbench.data.video_hashes import context_hashes
    from cmbench.hashing import file_hash
    from cmbench.report.reading import folder_config

    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not records_files(run_dir):
        raise ConfigError(f"{run_dir}: not a run folder (no records*.jsonl)")
    config = folder_config(run_dir)
    if not isinstance(config.get("scorer"), dict):
        raise ConfigError(f"{run_dir / 'config.yaml'}: names no scorer config (a run folder's config.yaml does)")
    data = _received_data(config, data_root)
    records = {t: r for t, r in latest_records(read_task_records(run_dir)).items() if r.status == "ok"}
    if not records:
        raise ConfigError(f"{run_dir}: no successful task to verify")
    tasks = [t for t in load_manifest(str(data["root"]), str(data.get("manifest", "metadata.jsonl")))
             if t.task_id in records]
    problems, scorer = score_problems(run_dir, records, tasks, data, config["scorer"], tolerance)
    manifest = Path(str(data["root"])) / str(data.get("manifest", "metadata.jsonl"))
    current = {"cmbench": cmbench_code_hash(), "manifest": file_hash(manifest)[:HASH_DIGITS]}
    if scorer is not None:
        current["scorer"] = scorer
    local = context_hashes(tasks)
    for task_id, record in records.items():
        problems += ledger_problems(record) + code_problems(record, current)
        if record.context_hash is not None and record.context_id in local and local[record.context_id] != record.context_hash:
            problems.append(Problem(f"task {task_id}", f"context_hash: recorded {record.context_hash[:12]}..., the "
                                                       f"local video's is {local[record.context_id][:12]}..."))
    return sorted(problems, key=lambda p: (p.where, p.what))
