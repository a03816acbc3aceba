"""The task record: one typed schema, one writer and one reader, for ``run`` and ``score`` alike.

A record is one JSON line describing one task's result (:class:`TaskRecord`). ``run`` appends them to
``records.jsonl`` of its run directory (shard ``i`` of ``n``: ``records.shard-i-of-n.jsonl``);
``score`` writes them to ``records.jsonl`` of its output folder. Readers take every ``records*.jsonl``
of a folder together, so sharded, resumed, single-process and scored outputs read back the same way.

Guarantees (docs/runs.md):

- a record is written with one ``write`` call, flushed and fsync'd before :meth:`RecordWriter.write`
  returns; a write that fails (disk full) is cut back off the file at once;
- a torn last line (no newline: the process died mid-write) is skipped by readers and cut off by the
  next writer of that file, so it never wedges a run; any other unreadable line is an error naming
  file and line;
- a records file is never written through a link: a symbolic link placed at its path is refused, not
  followed, and a file with a second hard link is replaced by a copy of its own before it is appended to
  (``score`` writes a new file and renames it into place, :mod:`cmbench.runs.atomic`);
- every record carries ``recorded_ns`` (wall clock, strictly increasing per file and later than every
  record the run folder held when its writer started, whatever that host's clock says), and readers
  order records by it, so "the last record of a task wins" means last in time across all files, and a
  host whose clock is behind never orders its retry before the failure it retried;
- values are checked when written and when read (a score outside [-1, 1], a negative time, a field
  the schema does not know): an impossible record is an error naming file, line and field.

Schema versions: records without ``schema_version`` (version 0, CMBench before the typed record)
are read and upgraded (``scorer_config_hash`` becomes ``scorer_hash``; unknown fields are dropped);
version 1 records (before the code identity, the run's seed and the attention cost) and version 2
records (before each reference's best frame, the reference aggregation and the scorer models' hash)
are read with the fields added since empty; so are version 3 records (before ``calibration_pr`` and
the quality metrics: one field per metric of :data:`QUALITY_FIELDS`, ``quality_absent`` and
``quality_hash``) and version 5 records (before ``cache_dtype``: their cache held float32 rows,
:func:`record_cache_dtype`; before ``dataset_commit``, ``context_hash`` and ``ledger``).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from cmbench import bounded_read
from cmbench.config_schema import CACHE_DTYPES, REFERENCE_AGGREGATIONS
from cmbench.errors import CMBenchError
from cmbench.method_family import RECORDED
from cmbench.runs import atomic
from cmbench.scoring.aggregation import reference_aggregates
from cmbench.scoring.quality_names import BOUNDED_QUALITY, QUALITY_FIELDS

SCHEMA_VERSION = 6
RECORDS = "records.jsonl"
SHARD_RECORDS = "records.shard-{index}-of-{count}.jsonl"
RECORDS_GLOB = "records*.jsonl"
RUN_FILE = "run.json"  # a run directory's current label and code identity (cmbench.runs.experiment)
STATUSES = ("ok", "failed")
KINDS = ("run", "score")
DINO_METRIC = "DINO"
DINO_EMBEDDERS = ("dinov2",)  # embedder backends whose cosine is the paper's DINO score


class RecordsError(CMBenchError):
    """A records file cannot be read, or holds an impossible record."""


class RecordsWriteError(CMBenchError):
    """A record could not be written (disk full, read-only folder): the run stops."""


@dataclass
class TaskRecord:
    """One task's result: what ``run`` and ``score`` write, and what every report reads.

    Fields are grouped by who fills them; a field a producer does not know stays ``None``
    (``score`` knows nothing of generation, so its ``pr``, timings and method are ``None``).

    Attributes
    ----------
    task_id, context_id, source, task_type : str
        The task (``context_id``: the context video path without extension; tasks of one context
        are one cluster in confidence intervals).
    status : {"ok", "failed"}
    kind : {"run", "score"}
        ``run``: generated and scored by ``python -m cmbench run``; ``score``: a saved video scored by
        ``python -m cmbench score``.
    label : str
        The name the result shows in leaderboards.
    seed : int or None
        The task's generation seed (``None`` when unknown, e.g. another generator's videos).
    error, traceback : str or None
        Why a failed task failed.
    scorer, scorer_hash : str
        Scorer config name and its hash (identity of everything that changes a score).
    metric : str
        What ``score`` measures: ``"DINO"`` when a DINOv2 embedder produced it (the paper's
        protocol), else the scorer's name (e.g. ``"light"``).
    score : float
        Each reference's best similarity over frames (``reference_scores``), combined over the
        references by ``reference_aggregation``; 0 when the target is never detected; a cosine, so in
        [-1, 1].
    detection_rate : float
        Fraction of frames with a detection, in [0, 1].
    similarities : list of float or None
        Per frame, None where not detected.
    boxes : list of [x0, y0, x1, y1] or None
        Per frame, the chosen normalised box, None where not detected.
    detection_scores : list of float or None
    detection_threshold : float
    reference_mask_fallback : list of bool
        Per reference, True when its segmentation was empty and the annotated box was used.
    reference_scores : list of float or None
        Per reference, its best similarity over frames, when the scorer reports it.
    reference_best_frames : list of int or None
        Per reference, the frame where its best similarity was reached (an entry is None when the
        target is never detected); its box is ``boxes[frame]``.
    reference_aggregation : {"mean", "max"} or None
        How ``score`` combines ``reference_scores`` (``mean``, the default: a reading, see
        docs/protocol.md; the authors' official rule is not public).
    reference_aggregates : dict or None
        ``{"mean": ..., "max": ...}``: ``reference_scores`` combined both ways, whichever ``score``
        used, so a leaderboard can show either (``leaderboard.reference_aggregation``).
    scorer_models_hash : str or None
        The scorer's loaded models by content (weight and processor files or hub commits, and the
        transformers version): two records with equal ``scorer_hash`` but different models hashes
        were scored by different weights.
    best_frame : int or None
        Index of the frame where ``score`` was reached (argmax of ``similarities``); None when the
        target is never detected.
    best_box : list of 4 float or None
        ``boxes[best_frame]``.
    n_frames : int
        Frames scored: the frames the task defines (:mod:`cmbench.scoring.frame_count`), 0 when the
        continuation had fewer (a failed record: scored as missing).
    frames_received : int or None
        Frames the continuation had (None in records written before the frame-count rule); a record
        whose ``frames_received`` differs from ``n_frames`` is flagged on the leaderboard.
    continuity : float or None
        The continuation's continuity error (:mod:`cmbench.scoring.continuity`): how far its frames are from
        continuing the context's last frame as the task's camera moves, in [0, 1]; None when the task has no
        camera plan (not checked).
    suspect : str or None
        Why the continuation is suspect (its continuity error over the threshold), else None: boards flag it
        and leave its entry out of the ranking unless asked (``leaderboard.allow_suspect=true``).
    subject_consistency, background_consistency, temporal_flickering, motion_smoothness : float or None
        VBench's quality metrics of the scored video (docs/scoring.md, "Quality metrics"), in [0, 1];
        None when not selected or absent (``quality_absent`` says why).
    aesthetic_quality, imaging_quality : float or None
        VBench's aesthetic (LAION head / 10) and imaging (MUSIQ / 100) quality, averaged over frames.
    subject_consistency_light, background_consistency_light : float or None
        VBench's consistency formula on CPU features (MiniWorld): not VBench's numbers.
    quality_absent : dict or None
        Selected quality metrics that did not run, each with the reason (package or weights missing,
        too few frames).
    quality_hash : str or None
        Identity of the quality metrics' config (selection, arguments, code version).
    video : str or None
        The scored video: for ``run``, its lossless copy relative to the run directory; for
        ``score``, the file that was read.
    method, method_config, backbone, data, versions, git_commit
        What produced a ``run`` record (the method's name and every knob, ...).
    dataset_commit : str or None
        The hub commit of the dataset (its pin, :mod:`cmbench.data.official`); None for a dataset not
        downloaded by ``prepare`` (MiniWorld, a copy without a pin).
    context_hash : str or None
        SHA-256 of the context video's bytes (:mod:`cmbench.data.video_hashes`).
    family : str or None
        The family of KV compression of what ran (:mod:`cmbench.method_family`): the method class's own
        declaration, with its storage format's family added (``eviction``, ``merging + quantization``,
        ``eviction + low-rank``, ``reference`` for FullKV, ``other`` for a method that declares none); boards
        read it from here.
    config_hash : str
        The run's identity: the hash of its result config (the run directory's name ends with it).
    setup_hash : str
        The same without the global ``seed``: runs with equal ``setup_hash`` are seeds of one setup,
        one row on a leaderboard.
    run_seed : int
        The run's global ``seed`` (``seed`` is the task's, derived from it and the task id).
    code, code_hash : dict, str
        The code and files that computed the record (:mod:`cmbench.identity.code`): CMBench's
        result-deciding modules, a plug-in method's sources, the backbone's files, the manifest; a
        rerun recomputes tasks whose ``code_hash`` differs from the current one.
    machine : str
        Where it ran (host, CPU or GPU, torch threads): speeds measured on different machines are not
        comparable.
    attention_flops : float
        Attention FLOPs of the continuation's model calls (``4 B L D (n + L)`` per layer-head and
        call, ``n`` the history keys the head reads, ``L`` the chunk's tokens): deterministic, unlike
        seconds.
    attention_keys_per_token : float
        Keys read per generated token, summed over layers, heads and model calls.
    pr, target_pr, context_pr : float
        Pruning ratio over the continuation (the paper's Eq. 4), the run's target (``method.target_pr``:
        the PR its knob was calibrated to; ``method.quota_pr``: the quota), the context's.
    calibration_pr : float
        ``method.target_pr`` runs: the mean PR the calibrated knob value (in ``method_config``) gave on
        the calibration tasks.
    kept_tokens, kept_context_tokens, peak_kv_bytes : int
        ``peak_kv_bytes``: the most K/V bytes held on the device (restored tokens included).
    peak_store_bytes : int
        Retrieval methods: the most K/V bytes in the host store during the continuation.
    moved_bytes_per_chunk : float
        Retrieval methods: K/V bytes moved between host and device (both ways) per generated chunk.
    mean_kv_bytes : float
        The device K/V bytes the continuation's chunks were denoised with, averaged over its chunks (every
        format's scales, zero points, merge counts and per-token metadata included).
    fullkv_kv_bytes, fullkv_peak_kv_bytes : float, int
        FullKV's mean and peak device K/V bytes on the same task, computed from the geometry (every
        history token of every head in full precision: :mod:`cmbench.cache.ledger`), not run.
    kv_bytes_ratio : float
        The continuation's device K/V bytes over FullKV's, summed over its chunks (1 for FullKV; ``1 - pr``
        for an eviction method storing full precision).
    ledger : list of [int, int, int, int] or None
        The continuation's ledger, one row per chunk: history tokens visible (summed over layers and
        heads), FullKV's, device K/V bytes stored and FullKV's (:meth:`cmbench.cache.ledger.PRLedger.rows`):
        ``pr``, ``mean_kv_bytes``, ``fullkv_kv_bytes`` and ``kv_bytes_ratio`` follow from it
        (``python -m cmbench verify`` recomputes them).
    cache_dtype : str or None
        The precision the cache held its full-precision rows in (``cache.dtype``, else the model's:
        ``"bfloat16"``, ``"float32"``), FullKV's bytes counted in it; ``None`` (records before the field)
        means ``"float32"``: :func:`record_cache_dtype`.
    target_bytes, calibration_bytes : float
        ``method.target_bytes`` runs: the target ``kv_bytes_ratio`` the knob was calibrated to, and the mean
        ratio the calibrated knob value gave on the calibration tasks.
    prefill_seconds, continuation_seconds, continuation_fps : float
    continuation_frames : int
    schema_version : int
    recorded_ns : int or None
        When the record was written (Unix time in ns, strictly increasing per file); set by
        :class:`RecordWriter`.
    """

    task_id: str
    status: str
    context_id: str | None = None
    source: str | None = None
    task_type: str | None = None
    kind: str = "run"
    label: str | None = None
    seed: int | None = None
    error: str | None = None
    traceback: str | None = None
    # scoring
    scorer: str | None = None
    scorer_hash: str | None = None
    metric: str | None = None
    score: float | None = None
    detection_rate: float | None = None
    similarities: list[float | None] | None = None
    boxes: list[list[float] | None] | None = None
    detection_scores: list[float | None] | None = None
    detection_threshold: float | None = None
    reference_mask_fallback: list[bool] | None = None
    reference_scores: list[float | None] | None = None
    reference_best_frames: list[int | None] | None = None
    reference_aggregation: str | None = None
    reference_aggregates: dict[str, float] | None = None
    scorer_models_hash: str | None = None
    best_frame: int | None = None
    best_box: list[float] | None = None
    n_frames: int | None = None
    frames_received: int | None = None
    continuity: float | None = None
    suspect: str | None = None
    video: str | None = None
    # quality (VBench's names)
    subject_consistency: float | None = None
    background_consistency: float | None = None
    temporal_flickering: float | None = None
    motion_smoothness: float | None = None
    aesthetic_quality: float | None = None
    imaging_quality: float | None = None
    subject_consistency_light: float | None = None
    background_consistency_light: float | None = None
    quality_absent: dict[str, str] | None = None
    quality_hash: str | None = None
    # generation (run only)
    method: str | None = None
    method_config: dict[str, Any] | None = None
    family: str | None = None
    backbone: str | None = None
    data: str | None = None
    dataset_commit: str | None = None
    context_hash: str | None = None
    config_hash: str | None = None
    setup_hash: str | None = None
    run_seed: int | None = None
    code: dict[str, Any] | None = None
    code_hash: str | None = None
    versions: dict[str, str] | None = None
    git_commit: str | None = None
    machine: str | None = None
    pr: float | None = None
    target_pr: float | None = None
    calibration_pr: float | None = None
    context_pr: float | None = None
    kept_tokens: int | None = None
    kept_context_tokens: int | None = None
    peak_kv_bytes: int | None = None
    peak_store_bytes: int | None = None
    moved_bytes_per_chunk: float | None = None
    mean_kv_bytes: float | None = None
    fullkv_kv_bytes: float | None = None
    fullkv_peak_kv_bytes: int | None = None
    kv_bytes_ratio: float | None = None
    ledger: list[list[int]] | None = None
    cache_dtype: str | None = None
    target_bytes: float | None = None
    calibration_bytes: float | None = None
    prefill_seconds: float | None = None
    continuation_seconds: float | None = None
    continuation_frames: int | None = None
    continuation_fps: float | None = None
    attention_flops: float | None = None
    attention_keys_per_token: float | None = None
    # bookkeeping
    schema_version: int = SCHEMA_VERSION
    recorded_ns: int | None = None

    def __post_init__(self) -> None:
        problem = record_problem(self)
        if problem:
            raise ValueError(problem)

    def to_json(self) -> dict[str, Any]:
        """Every field as plain JSON values (numpy scalars and arrays converted)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> "TaskRecord":
        """A record from a JSON object, upgrading older versions (0: renamed fields; 1 to 4: fields added
        since are empty).

        Raises
        ------
        ValueError
            Unknown fields (at the current version), a newer schema version, or impossible values.
        """
        row = dict(row)
        version = row.get("schema_version", 0)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"schema_version {version!r} is newer than this CMBench reads ({SCHEMA_VERSION})")
        if version == 0:
            row = _upgrade_v0(row)
        row["schema_version"] = SCHEMA_VERSION
        unknown = sorted(set(row) - FIELD_NAMES)
        if unknown:
            raise ValueError(f"field(s) {', '.join(unknown)} not in the task record schema (version {SCHEMA_VERSION})")
        for name in REQUIRED:
            if name not in row:
                raise ValueError(f"{name}: missing required field")
        try:
            record = cls(**row)  # a value's own check names what is impossible about it (a score outside [-1, 1])
        except TypeError:  # a value of a type its check cannot compare: named below
            record = None
        for name, value in row.items():  # values of the wrong JSON type no check looked at (a list as task_type)
            problem = json_type_problem(name, value)
            if problem:
                raise ValueError(f"{name}: {problem}")
        return record if record is not None else cls(**row)


FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(TaskRecord))
_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(TaskRecord)}
REQUIRED = ("task_id", "status")
_FRACTIONS = ("detection_rate", "pr", "target_pr", "calibration_pr", "context_pr", "continuity")
SIMILARITY_TOLERANCE = 1e-6
"""How far past [-1, 1] a recorded similarity may lie: a cosine of unit vectors computed in floating point
(1 + 5e-9 for a frame identical to its reference) is a similarity of 1, not an impossible record."""
_NON_NEGATIVE = ("kept_tokens", "kept_context_tokens", "peak_kv_bytes", "peak_store_bytes", "moved_bytes_per_chunk",
                 "mean_kv_bytes", "fullkv_kv_bytes", "fullkv_peak_kv_bytes", "kv_bytes_ratio", "target_bytes",
                 "calibration_bytes",
                 "prefill_seconds", "continuation_seconds",
                 "continuation_frames", "continuation_fps", "n_frames", "frames_received", "attention_flops",
                 "attention_keys_per_token",
                 "run_seed")


_NUMBER_TYPES = (int, float, np.integer, np.floating)
_JSON_TYPES: dict[str, tuple[tuple[type, ...], str]] = {  # a field's type (its annotation's head) -> accepted, said
    "str": ((str,), "a string"), "int": ((int, np.integer), "an integer"), "float": (_NUMBER_TYPES, "a number"),
    "bool": ((bool, np.bool_), "true or false"), "dict": ((dict,), "a JSON object"), "list": ((list,), "a list"),
}


def _type_of(annotation: str) -> tuple[str, str | None]:
    """``"list[float | None] | None" -> ("list", "float | None")``: a field annotation's head and item type."""
    head, _, rest = annotation.partition("[")
    head = head.split("|")[0].strip()
    return head, (rest.rpartition("]")[0] if rest else None)


def _is(value: Any, kind: str) -> bool:
    accepted = _JSON_TYPES[kind][0]
    if kind != "bool" and isinstance(value, (bool, np.bool_)):
        return False
    if kind == "int" and isinstance(value, (float, np.floating)):  # a count read as a number (older writers,
        return math.isfinite(value)                                   # averages); its own check bounds it
    return isinstance(value, accepted)


def _box_problem(box: Any) -> str | None:
    if not (isinstance(box, list) and len(box) == 4 and all(_is(v, "float") for v in box)):
        return f"is {json.dumps(box, default=str)[:60]}, expected a box [x0, y0, x1, y1] of 4 numbers"
    return None


def json_type_problem(name: str, value: Any) -> str | None:
    """What is wrong with the JSON type of a received record field's value (``"is 'yesterday', expected an
    integer"``), or None. Strings must be text (no lone surrogates, which no UTF-8 file can hold); boxes
    are 4 numbers; list items have the item type the field declares."""
    if value is None or name not in _FIELD_TYPES:
        return None
    head, item = _type_of(_FIELD_TYPES[name])
    if not _is(value, head):
        return f"is {json.dumps(value, default=str)[:60]}, expected {_JSON_TYPES[head][1]}"
    if head == "int" and not -(2**63) <= int(value) < 2**63:
        return f"is {str(value)[:60]}, past the 64-bit integer range"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"holds {ascii(value)[:60]}, a lone surrogate: not text"
    if head != "list" or item is None:
        return None
    if name == "best_box":
        return _box_problem(value)
    for i, entry in enumerate(value):
        if entry is None and "None" in item:
            continue
        if name == "boxes":
            problem = _box_problem(entry)
            if problem:
                return f"[{i}] {problem}"
            continue
        kind = _type_of(item)[0]
        if not _is(entry, kind):
            return f"[{i}] is {json.dumps(entry, default=str)[:60]}, expected {_JSON_TYPES[kind][1]}"
    return None


def _upgrade_v0(row: dict[str, Any]) -> dict[str, Any]:
    """Version 0 (``score``'s ``scorer_config_hash``, evaluator extras) to the current schema."""
    if "scorer_config_hash" in row:
        row.setdefault("scorer_hash", row.pop("scorer_config_hash"))
    return {k: v for k, v in row.items() if k in FIELD_NAMES}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def record_cache_dtype(record: TaskRecord | Mapping[str, Any]) -> str:
    """The precision a record's cache held its full-precision rows in: its ``cache_dtype``, or ``"float32"``
    for a record without one (written before the field, when every cache held the tiny model's float32)."""
    value = record.get("cache_dtype") if isinstance(record, Mapping) else record.cache_dtype
    return str(value) if value else "float32"


def record_problem(record: TaskRecord) -> str | None:
    """What is impossible about a record (``"field: what"``), or None."""
    if not isinstance(record.task_id, str) or not record.task_id:
        return f"task_id: is {record.task_id!r}, expected a non-empty string"
    if record.status not in STATUSES:
        return f"status: is {record.status!r}, expected one of {', '.join(STATUSES)}"
    if record.kind not in KINDS:
        return f"kind: is {record.kind!r}, expected one of {', '.join(KINDS)}"
    if record.score is not None and not (_number(record.score) and _similarity(float(record.score))):
        return f"score: is {record.score!r}, expected a similarity in [-1, 1]"
    for name in _FRACTIONS:
        value = getattr(record, name)
        if value is not None and not (_number(value) and 0.0 <= float(value) <= 1.0):
            return f"{name}: is {value!r}, expected a fraction in [0, 1]"
    for name in _NON_NEGATIVE:
        value = getattr(record, name)
        if value is not None and not (_number(value) and float(value) >= 0.0 and math.isfinite(float(value))):
            return f"{name}: is {value!r}, expected a finite number >= 0"
    bytes_problem = _kv_bytes_problem(record)
    if bytes_problem:
        return bytes_problem
    if record.cache_dtype is not None and record.cache_dtype not in CACHE_DTYPES:
        return f"cache_dtype: is {str(record.cache_dtype)[:40]!r}, expected one of {', '.join(CACHE_DTYPES)}"
    if record.family is not None and record.family not in RECORDED:
        return f"family: is {str(record.family)[:60]!r}, expected one of {', '.join(sorted(RECORDED))}"
    if record.ledger is not None and not _ledger_rows(record.ledger):
        return "ledger: expected a list of [visible, full, stored_bytes, full_bytes] rows of integers >= 0"
    if record.seed is not None and not isinstance(record.seed, (int, np.integer)):
        return f"seed: is {record.seed!r}, expected an integer"
    if record.frames_received is not None and record.n_frames is not None and record.n_frames > record.frames_received:
        return f"n_frames: is {record.n_frames}, more than the {record.frames_received} frames_received"
    if record.best_frame is not None and record.n_frames is not None and not 0 <= record.best_frame < record.n_frames:
        return f"best_frame: is {record.best_frame}, expected an index below n_frames={record.n_frames}"
    for f in dataclasses.fields(record):
        where = _non_finite(getattr(record, f.name), f.name)
        if where:
            return f"{where}: is not a finite number (records are strict JSON: no NaN or infinity)"
    return _reference_problem(record) or _quality_problem(record)


def _ledger_rows(ledger: Any) -> bool:
    """Whether a record's ``ledger`` is a list of 4-integer rows, each >= 0."""
    return isinstance(ledger, list) and all(
        isinstance(row, list) and len(row) == 4
        and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in row)
        for row in ledger)


KV_BYTES_METADATA = 0.05
"""How far a record's ``kv_bytes_ratio`` may exceed the share of FullKV's history its PR keeps (``1 - pr``):
the per-row metadata a method or format adds (TempCache's merge counts: 0.0023 at most in CMBench's own runs)."""


def _kv_bytes_problem(record: TaskRecord) -> str | None:
    """What makes a record's ``kv_bytes_ratio`` disagree with its own bytes and PR, or None: it must be its
    ``mean_kv_bytes`` over ``fullkv_kv_bytes`` (when both are recorded), and at most the share of history its
    PR keeps plus :data:`KV_BYTES_METADATA` (a received 1e308, or 50 at PR 0, is refused, not shown as a
    percentage)."""
    ratio, mean, full, pr = record.kv_bytes_ratio, record.mean_kv_bytes, record.fullkv_kv_bytes, record.pr
    if ratio is None:
        return None
    if mean is not None and full:
        own = float(mean) / float(full)
        if not math.isclose(float(ratio), own, rel_tol=1e-6, abs_tol=1e-12):
            return (f"kv_bytes_ratio: is {ratio:g}, but the record's own mean_kv_bytes / fullkv_kv_bytes is "
                    f"{own:.6g}")
    if pr is not None and float(ratio) > 1.0 - float(pr) + KV_BYTES_METADATA:
        return (f"kv_bytes_ratio: is {ratio:g}, more than the {1.0 - float(pr):.4f} of FullKV's history its pr "
                f"{float(pr):.4f} keeps (+{KV_BYTES_METADATA:g} for per-row metadata)")
    return None


def _similarity(value: float) -> bool:
    """``value`` is a cosine: in [-1, 1] up to :data:`SIMILARITY_TOLERANCE`."""
    return -1.0 - SIMILARITY_TOLERANCE <= value <= 1.0 + SIMILARITY_TOLERANCE


def _quality_problem(record: TaskRecord) -> str | None:
    """What is impossible about a record's quality fields, or None."""
    for name in QUALITY_FIELDS:
        value = getattr(record, name)
        if value is None:
            continue
        if not (_number(value) and math.isfinite(float(value))):
            return f"{name}: is {value!r}, expected a finite number"
        if name in BOUNDED_QUALITY and not 0.0 <= float(value) <= 1.0:
            return f"{name}: is {value!r}, expected a value in [0, 1]"
    absent = record.quality_absent
    if absent is not None:
        if not isinstance(absent, dict) or not all(isinstance(v, str) for v in absent.values()):
            return f"quality_absent: is {absent!r}, expected a mapping metric -> reason"
        both = sorted(k for k in absent if k in QUALITY_FIELDS and getattr(record, k) is not None)
        if both:
            return f"quality_absent: names {', '.join(both)}, which {'have values' if len(both) > 1 else 'has a value'}"
    return None


def _non_finite(value: Any, where: str) -> str | None:
    """Where a NaN or an infinity sits in a field's value (``similarities[3]``), or None."""
    if isinstance(value, (float, np.floating)):
        return None if math.isfinite(float(value)) else where
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, Mapping):
        return next((w for k, v in value.items() if (w := _non_finite(v, f"{where}.{k}"))), None)
    if isinstance(value, (list, tuple)):
        return next((w for i, v in enumerate(value) if (w := _non_finite(v, f"{where}[{i}]"))), None)
    return None


def _reference_problem(record: TaskRecord) -> str | None:
    """What is impossible about a record's per-reference fields, or None."""
    if record.reference_aggregation is not None and record.reference_aggregation not in REFERENCE_AGGREGATIONS:
        return (f"reference_aggregation: is {record.reference_aggregation!r}, "
                f"expected one of {', '.join(REFERENCE_AGGREGATIONS)}")
    aggregates = record.reference_aggregates
    if aggregates is not None:
        if not isinstance(aggregates, dict) or set(aggregates) != set(REFERENCE_AGGREGATIONS):
            return f"reference_aggregates: is {aggregates!r}, expected {{'mean': ..., 'max': ...}}"
        for how, value in aggregates.items():
            if not (_number(value) and _similarity(float(value))):
                return f"reference_aggregates.{how}: is {value!r}, expected a similarity in [-1, 1]"
    frames = record.reference_best_frames
    if frames is None:
        return None
    if not isinstance(frames, list):
        return f"reference_best_frames: is {frames!r}, expected a list of frame indices (null: never detected)"
    if record.reference_scores is not None and len(frames) != len(record.reference_scores):
        return (f"reference_best_frames: has {len(frames)} entries, expected one per reference "
                f"({len(record.reference_scores)} reference_scores)")
    for frame in frames:
        if frame is None:
            continue
        if not isinstance(frame, (int, np.integer)) or isinstance(frame, bool) or frame < 0 or (
                record.n_frames is not None and frame >= record.n_frames):
            below = f" below n_frames={record.n_frames}" if record.n_frames is not None else ""
            return f"reference_best_frames: holds {frame!r}, expected a frame index >= 0{below} or null"
    return None


def metric_name(scorer_config: Mapping[str, Any]) -> str:
    """What a scorer's score measures: ``"DINO"`` when its embedder is DINOv2 (the paper's metric),
    else the scorer's own name."""
    embedder = scorer_config.get("embedder") or {}
    if str(embedder.get("backend", "")) in DINO_EMBEDDERS:
        return DINO_METRIC
    return str(scorer_config.get("name") or "score")


def scored_fields(task_score: Any) -> dict[str, Any]:
    """The record fields of a scorer's :class:`cmbench.scoring.pipeline.TaskScore`.

    Adds the best frame (argmax of the per-frame similarities) and its box, and, when the scorer
    reports them, each reference's best score and frame, the reference aggregation and the models'
    content hash.
    """
    sims = list(task_score.similarities)
    detected = [i for i, s in enumerate(sims) if s is not None]
    best = max(detected, key=lambda i: sims[i]) if detected else None
    return {
        "score": task_score.score,
        "detection_rate": task_score.detection_rate,
        "similarities": sims,
        "boxes": list(task_score.boxes),
        "detection_scores": list(task_score.detection_scores),
        "detection_threshold": task_score.detection_threshold,
        "reference_mask_fallback": list(task_score.reference_mask_fallback),
        "reference_scores": getattr(task_score, "reference_scores", None),
        "reference_best_frames": getattr(task_score, "reference_best_frames", None),
        "reference_aggregation": getattr(task_score, "reference_aggregation", None),
        "reference_aggregates": reference_aggregates(getattr(task_score, "reference_scores", None)),
        "scorer_models_hash": getattr(task_score, "scorer_models_hash", None),
        "best_frame": best,
        "best_box": None if best is None else task_score.boxes[best],
        "n_frames": task_score.n_frames,
        "frames_received": getattr(task_score, "frames_received", None),
        "scorer": task_score.scorer,
        "scorer_hash": task_score.scorer_config_hash,
        **quality_fields(task_score),
    }


def quality_fields(task_score: Any) -> dict[str, Any]:
    """The quality record fields of a :class:`cmbench.scoring.pipeline.TaskScore` (none when it has no
    quality metrics)."""
    quality = getattr(task_score, "quality", None)
    if not quality and not getattr(task_score, "quality_absent", None):
        return {}
    return {**{name: float(v) for name, v in (quality or {}).items()},
            "quality_absent": dict(getattr(task_score, "quality_absent", None) or {}),
            "quality_hash": getattr(task_score, "quality_hash", None)}


def _plain(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def records_path(run_dir: Path, count: int = 1, index: int = 0) -> Path:
    """Where a process (shard ``index`` of ``count``) appends its records."""
    return Path(run_dir) / (RECORDS if count == 1 else SHARD_RECORDS.format(index=index, count=count))


def records_files(run_dir: str | Path) -> list[Path]:
    """Every records file of a folder, sorted by name."""
    return sorted(Path(run_dir).glob(RECORDS_GLOB))


def read_records_file(path: Path) -> list[tuple[TaskRecord, int]]:
    """Records of one file with their line numbers, skipping a torn last line.

    Raises
    ------
    RecordsError
        ``file:line: ...`` for invalid JSON before the last line, or an impossible record.
    """
    rows = []
    try:
        for number, raw, complete in bounded_read.read_lines(path, "records line"):
            if not complete:  # after the last newline: a torn write
                break
            if not raw.strip():
                continue
            try:
                rows.append((json.loads(raw), number))
            except (ValueError, RecursionError) as err:  # received files: deep nesting, integers past Python's digit limit
                msg = (err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8" if isinstance(err, UnicodeDecodeError)
                       else "nested too deeply" if isinstance(err, RecursionError) else "a number too long to read")
                raise RecordsError(f"{path}:{number}: invalid JSON ({msg})") from err
    except bounded_read.ReadLimitError as err:
        raise RecordsError(str(err)) from err
    records = []
    for row, number in rows:
        if not isinstance(row, dict):
            raise RecordsError(f"{path}:{number}: a record must be a JSON object, got {type(row).__name__}")
        try:
            records.append((TaskRecord.from_json(row), number))
        except (TypeError, ValueError) as err:
            raise RecordsError(f"{path}:{number}: {err}") from err
    return records


def read_task_records(run_dir: str | Path) -> list[TaskRecord]:
    """Every record of every records file of a folder, oldest first (by ``recorded_ns``; records
    without it, written before the field existed, come first in file and line order)."""
    keyed = []
    for file_index, path in enumerate(records_files(run_dir)):
        for record, line in read_records_file(path):
            keyed.append(((record.recorded_ns or 0, file_index, line), record))
    keyed.sort(key=lambda item: item[0])
    return [record for _, record in keyed]


def read_all_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """:func:`read_task_records` as JSON dicts (every schema field present)."""
    return [r.to_json() for r in read_task_records(run_dir)]


def latest_records(records: Iterable[TaskRecord]) -> dict[str, TaskRecord]:
    """The last record of each task (records in time order, as :func:`read_task_records` gives)."""
    latest: dict[str, TaskRecord] = {}
    for record in records:
        latest[record.task_id] = record
    return latest


class RecordWriter:
    """Appends one JSON line per record, flushed and fsync'd before :meth:`write` returns.

    Opening the writer cuts a torn last line off its file (left by a process killed mid-write), so
    the task it belonged to simply runs again. One writer per file at a time: hold the folder's
    :class:`cmbench.lock.RunLock` while writing.

    Parameters
    ----------
    path : Path
        The records file; never a link (a symbolic link placed there is refused, not followed; a file
        with a second hard link is replaced by a copy of its own before it is written).
    after_ns : int
        Every record is stamped later than this (the latest ``recorded_ns`` of the folder's other
        files), so records written on a host whose clock is behind still come after those they follow.
    """

    def __init__(self, path: Path, after_ns: int = 0):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                os.close(bounded_read.open_regular(self.path))  # a FIFO or a device is named, never read
            if self.path.exists() or self.path.is_symlink():
                with os.fdopen(self._open(os.O_RDWR), "r+b") as f:
                    start = max(0, f.seek(0, os.SEEK_END) - bounded_read.LIMITS["records line"] - 1)
                    f.seek(start)  # a torn line is shorter than a whole one: only the tail is read
                    tail = f.read()
                    if tail and not tail.endswith(b"\n") and (b"\n" in tail or start == 0):
                        f.truncate(start + tail.rfind(b"\n") + 1)  # else the reader names the over-long line
        except bounded_read.ReadLimitError as err:
            raise RecordsError(str(err)) from err
        except OSError as err:
            raise self._error(err) from err
        self._last_ns = max((r.recorded_ns or 0 for r, _ in read_records_file(self.path)), default=0) \
            if self.path.exists() else 0
        self._last_ns = max(self._last_ns, after_ns)

    def _open(self, flags: int) -> int:
        """The records file opened in place, never through a link (:func:`cmbench.runs.atomic.open_in_place`:
        one with a second hard link is replaced by a copy of its own first)."""
        if self.path.is_symlink():
            raise self._error(OSError(errno.ELOOP, "a link"))
        try:
            return atomic.open_in_place(self.path, flags)
        except atomic.OutputError as err:
            raise RecordsWriteError(str(err)) from None

    def _error(self, err: OSError) -> RecordsWriteError:
        if err.errno == errno.ELOOP:
            return RecordsWriteError(f"cannot write {self.path}: it is a link (records are never written through "
                                     f"one: remove it)")
        return RecordsWriteError(f"cannot write {self.path}: {err.strerror or err}")

    def write(self, record: TaskRecord | Mapping[str, Any]) -> TaskRecord:
        """Stamp ``recorded_ns``, check and append one record; returns the record as written.

        Raises
        ------
        ValueError
            An impossible record (nothing is written).
        RecordsWriteError
            The file system refused the write (nothing of the record stays in the file).
        """
        if not isinstance(record, TaskRecord):
            record = TaskRecord.from_json(record)
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        record = dataclasses.replace(record, recorded_ns=self._last_ns)
        line = (json.dumps(record.to_json(), sort_keys=True, allow_nan=False) + "\n").encode()
        try:
            fd = self._open(os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError as err:
            raise self._error(err) from err
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(errno.ENOSPC, "short write (disk full?)")
                os.fsync(fd)
            except OSError as err:
                try:  # leave no torn line behind
                    os.ftruncate(fd, size)
                except OSError:
                    pass  # the next writer cuts it (see __init__)
                raise self._error(err) from err
        finally:
            os.close(fd)
        return record
