"""Which runs make a leaderboard: read folders, merge the seeds of one setup, name and check them.

A leaderboard entry (:class:`RunRecords`) is one method setup: a ``run`` directory, a ``score`` output
folder, or several run directories that differ only in their global ``seed`` (``-m seed=2,3,4``: their
records carry one ``setup_hash``), merged into one entry whose frame holds every (task, seed) record.

- Labels: a folder shows its current label (``run.json``, written by every ``run``; else its newest
  record's), so relabelling a run never needs a rerun. Entries that still share a label but are
  different setups are told apart by what differs in their configs (``decoprune[generation.rope_reindex=false]``).
- Checks: the seeds of one setup must cover the same tasks, and a setup cannot hold one seed twice;
  entries must share task set, seeds and scorer config (:func:`check_comparable`), unless
  ``allow_mixed``.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, TextIO

import pandas as pd
import yaml

from cmbench import bounded_read
from cmbench.data.manifest import validate_manifest
from cmbench.errors import CMBenchError
from cmbench.identity.labels import knob_text, safe_label
from cmbench.lock import active_writer
from cmbench.identity.paths import videos_label
from cmbench.config_schema import REFERENCE_AGGREGATIONS
from cmbench.report.precision import frame_precisions
from cmbench.runs.records import FIELD_NAMES, QUALITY_FIELDS, RUN_FILE, read_task_records
from cmbench.scoring.aggregation import aggregate_references

UNNAMED_METRIC = "Score"  # records that do not name their metric (written before the field existed)
NUMERIC = ("seed", "run_seed", "score", "detection_rate", "pr", "target_pr", "calibration_pr", "context_pr", "kept_tokens",
           "kept_context_tokens", "peak_kv_bytes", "mean_kv_bytes", "fullkv_kv_bytes", "fullkv_peak_kv_bytes",
           "kv_bytes_ratio", "target_bytes", "calibration_bytes", "peak_store_bytes", "moved_bytes_per_chunk", "prefill_seconds", "continuation_seconds", "continuation_frames",
           "continuation_fps", "best_frame", "n_frames", "attention_flops", "attention_keys_per_token", "recorded_ns",
           *QUALITY_FIELDS)


class ReportError(CMBenchError):
    """Runs cannot be compared (different task sets, seeds or scorers) or are unreadable."""


def read_table(path: str | Path, columns: Iterable[str], kind: str, command: str) -> pd.DataFrame:
    """A CSV table that a CMBench command wrote (``curves.csv``, ``leaderboard.csv``, ...), read as data:
    whole, untorn, with the named columns.

    Parameters
    ----------
    path : path
    columns : names
        The columns the reader needs.
    kind : str
        What the table is, for the messages (``curves``, ``leaderboard``).
    command : str
        The ``python -m cmbench`` command that writes it, for the remedy the messages name.

    Raises
    ------
    ReportError
        A missing, empty or torn file (its last line cut off, or a row of another field count), or one
        without ``columns``: one line naming the file (and line).
    """
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"{path}: no {kind} file (python -m cmbench {command} writes one)")
    text = bounded_read.read_text(path, "table", errors="replace")
    remedy = f"a {command} run stopped while writing it?"
    if not text.strip():
        raise ReportError(f"{path}: empty ({remedy}): rerun python -m cmbench {command}")
    if not text.endswith("\n"):
        raise ReportError(f"{path}: torn: its last line is cut off ({remedy}): rerun python -m cmbench {command}")
    rows = list(csv.reader(io.StringIO(text)))
    for number, row in enumerate(rows[1:], start=2):
        if row and len(row) != len(rows[0]):
            raise ReportError(f"{path}:{number}: {len(row)} fields where the header has {len(rows[0])}")
    frame = pd.read_csv(io.StringIO(text))
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ReportError(f"{path}: not a {kind} table: no column(s) {', '.join(missing)}")
    return frame


@dataclass(frozen=True)
class RunRecords:
    """The records of one leaderboard entry: a folder (a ``run`` directory or a ``score`` output), or
    the run directories of one setup's seeds.

    Attributes
    ----------
    path : Path
        The (first) folder.
    label : str
        The leaderboard name.
    frame : DataFrame
        One row per task and seed (the latest record), a column per task-record field; ``run_seed`` is
        the global seed of the run each row came from, ``folder`` its run directory.
    metric : str
        What ``score`` measures (``DINO``, a scorer's name, or ``Score`` when unnamed).
    manifest : Path or None
        The manifest the folder names (None: it names none).
    checked : bool
        Whether the records were checked against it (False when it is missing).
    dropped : tuple of str
        Task ids of records left out because the manifest has no such task.
    paths : tuple of Path
        Every folder of the entry (one per seed); empty means ``(path,)``.
    setup_hash : str or None
        The setup the entry's runs share (None: a ``score`` output or a run from before setup hashes).
    code_hash : str or None
        The run's current code identity (``run.json``), else its newest record's; for the seeds of a
        setup, that of the run written last (records of the others' code count as other code).
    unshared : tuple of str
        Task ids the entry ran that another entry did not, left out of a board over the shared tasks
        (``leaderboard.shared_tasks=true``: :func:`on_shared_tasks`).
    """

    path: Path
    label: str
    frame: pd.DataFrame
    metric: str = UNNAMED_METRIC
    manifest: Path | None = None
    checked: bool = False
    dropped: tuple[str, ...] = field(default=())
    paths: tuple[Path, ...] = field(default=())
    setup_hash: str | None = None
    code_hash: str | None = None
    unshared: tuple[str, ...] = field(default=())

    @property
    def folders(self) -> tuple[Path, ...]:
        """Every folder of the entry."""
        return self.paths or (self.path,)

    @property
    def seeds(self) -> list[int]:
        """The global seeds of the entry's runs (empty when unknown)."""
        return sorted(int(s) for s in self.frame["run_seed"].dropna().unique())

    def gallery_records(self) -> dict[str, dict[str, Any]]:
        """One record per task for a gallery, ``{task_id: record}``: the lowest run seed's (an entry of
        several seeds shows one seed, the same for every task that seed has; a task it lacks shows the
        next seed's record). Each record's ``folder`` is the run directory it came from."""
        ordered = self.frame.sort_values("run_seed", kind="stable", na_position="last")
        return {str(r["task_id"]): r for r in ordered.drop_duplicates("task_id").to_dict("records")}

    @property
    def other_code_tasks(self) -> list[str]:
        """Successful (task, seed) records computed by other code than the entry's current one."""
        ok = self.frame[self.frame["status"] == "ok"]
        if self.code_hash is None:
            return []
        other = ok[ok["code_hash"] != self.code_hash]
        return sorted(f"{t}" for t in other["task_id"])


def _read_json(path: Path, kind: str) -> dict[str, Any]:
    """A folder's JSON file of ``kind`` (``run file``, ``summary``: :data:`cmbench.bounded_read.LIMITS`) as a
    mapping; empty when absent or not JSON.

    Raises
    ------
    ReadLimitError
        Not a regular file, or over its kind's limit.
    """
    try:
        text = bounded_read.read_optional_text(path, kind)
        value = json.loads(text) if text is not None else {}
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def folder_config(folder: str | Path) -> dict[str, Any]:
    """A folder's ``config.yaml`` as plain data: parsed as YAML text, its ``${...}`` interpolations left
    as written (resolving them would run resolvers a received folder chooses: the reader's environment
    variables, ...); empty when absent, unreadable or not a mapping."""
    path = Path(folder) / "config.yaml"
    try:
        text = bounded_read.read_optional_text(path, "config")
        value = yaml.safe_load(text) if text is not None else {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return {}
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _folder_files(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``config.yaml`` (:func:`folder_config`) and ``summary.json`` of a folder (empty when absent)."""
    return folder_config(folder), _read_json(folder / "summary.json", "summary")


def folder_manifest(folder: str | Path) -> Path | None:
    """The manifest a ``run`` or ``score`` folder was made from (``data.root`` / ``data.manifest`` of
    its ``config.yaml``, else of its ``summary.json``; relative to the working directory), or None."""
    config, summary = _folder_files(Path(folder))
    data = config.get("data") or summary.get("data") or {}
    if not isinstance(data, dict) or not data.get("root"):
        return None
    return Path(str(data["root"])) / str(data.get("manifest") or "metadata.jsonl")


def _default_label(folder: Path) -> str:
    """The name of records that carry none (``score`` before the typed record): the scored videos
    folder's (from ``summary.json``), else the folder's own."""
    videos = _folder_files(folder)[1].get("videos")
    return videos_label(videos) if videos else folder.name


def read_records(run_dir: str | Path, task_ids: Iterable[str] | None = None,
                 only: Iterable[str] | None = None) -> RunRecords:
    """Read every records file of a folder; the last record (in time) of a (task_id, seed) wins.

    Parameters
    ----------
    run_dir : path
        A ``run`` directory or a ``score`` output folder.
    task_ids : iterable of str or None
        The tasks that may appear; by default those of the folder's manifest
        (:func:`folder_manifest`), or all when it names none or it is missing.
    only : iterable of str or None
        The tasks a board is about (a sweep's): records of other tasks are left out without a word.

    Raises
    ------
    ReportError
        No records, records of several methods or metrics.
    cmbench.runs.records.RecordsError
        An unreadable line or an impossible value, naming file, line and field.
    """
    run_dir = Path(run_dir)
    rows = [r.to_json() for r in read_task_records(run_dir)]
    if not rows:
        raise ReportError(f"{run_dir}: no records (not a run directory, or nothing finished yet)")
    frame = pd.DataFrame(rows, columns=sorted(FIELD_NAMES))
    for name in NUMERIC:
        frame[name] = pd.to_numeric(frame[name], errors="coerce")
    run = _read_json(run_dir / RUN_FILE, "run file")
    named = frame["label"].dropna()
    label = _run_value(run_dir / RUN_FILE, "label", run.get("label"), str) or str(
        named.iloc[-1] if len(named) else _default_label(run_dir))
    label = safe_label(label)  # a received label: control characters shown as escapes, never written raw
    frame["label"] = label
    frame["folder"] = str(run_dir)
    seed = (_run_value(run_dir / RUN_FILE, "run_seed", run["run_seed"], int) if "run_seed" in run else
            _run_value(run_dir / "config.yaml", "seed", _folder_files(run_dir)[0].get("seed"), int))
    frame["seed"] = frame["seed"].astype("Int64")  # None: unknown (another generator's videos)
    frame["run_seed"] = frame["run_seed"].astype("Int64")
    if seed is not None:  # filled as an integer: a float column would round seeds past 2**53
        frame["run_seed"] = frame["run_seed"].fillna(seed)
    manifest = folder_manifest(run_dir) if task_ids is None else None
    checked = task_ids is not None or (manifest is not None and manifest.is_file())
    if manifest is not None and checked:
        tasks, _ = validate_manifest(manifest.parent, manifest.name, check_videos=False)
        task_ids = [t.task_id for t in tasks]
        for name, value in (("context_id", lambda t: t.context_id), ("source", lambda t: t.source),
                            ("task_type", lambda t: t.task_type)):
            known = {t.task_id: value(t) for t in tasks}
            frame[name] = frame[name].fillna(frame["task_id"].map(known))
    dropped: tuple[str, ...] = ()
    if task_ids is not None:
        known = frame["task_id"].isin(set(task_ids))
        dropped = tuple(sorted(set(frame.loc[~known, "task_id"])))
        frame = frame[known]
    if frame.empty:
        raise ReportError(f"{run_dir}: no records of tasks in its manifest {manifest} (left out: {', '.join(dropped)})")
    if only is not None:
        frame = frame[frame["task_id"].isin(set(only))]
        if frame.empty:
            raise ReportError(f"{run_dir}: no records of the tasks chosen ({', '.join(sorted(set(only))[:5])} ...)")
    frame = frame.drop_duplicates(subset=["task_id", "seed"], keep="last")
    methods = sorted({str(m) for m in frame["method"].dropna()})
    if len(methods) > 1:
        raise ReportError(f"{run_dir}: records of several methods ({', '.join(methods)}) in one run")
    metrics = sorted({str(m) for m in frame["metric"].dropna()})
    if len(metrics) > 1:
        raise ReportError(f"{run_dir}: records of several metrics ({', '.join(metrics)}) in one folder")
    setups = frame["setup_hash"].dropna().unique()
    codes = frame.loc[frame["status"] == "ok", "code_hash"].dropna()
    return RunRecords(run_dir, label, frame.reset_index(drop=True),
                      metric=metrics[0] if metrics else UNNAMED_METRIC, manifest=manifest, checked=checked,
                      dropped=dropped, setup_hash=str(setups[-1]) if len(setups) else None,
                      code_hash=run.get("code_hash") or (str(codes.iloc[-1]) if len(codes) else None))


SEED_RANGE = (-(2**63), 2**63 - 1)  # a seed a table column holds (int64)


def _run_value(path: Path, key: str, value: Any, kind: type) -> Any:
    """A received folder's ``key`` (a label: text; a seed: an integer an int64 column holds), or None
    when unset.

    Raises
    ------
    ReportError
        One line naming the file, the key and what is wrong.
    """
    if value is None or value == "":
        return None
    if kind is str:
        if not isinstance(value, str):
            raise ReportError(f"{path}: {key}: is {json.dumps(value, default=str)[:60]}, expected a string")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ReportError(f"{path}: {key}: holds {ascii(value)[:60]}, a lone surrogate: not text") from None
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise ReportError(f"{path}: {key}: is {str(value)[:60]}, expected an integer seed in "
                          f"[-2**63, 2**63 - 1]")
    return value


def merge_seeds(runs: list[RunRecords], allow_mixed: bool = False) -> list[RunRecords]:
    """One entry per (label, setup): runs of one setup that differ only in ``seed`` become one entry
    with every (task, seed) record, in the order their first run came.

    Raises
    ------
    ReportError
        Two runs of one setup with the same seed, or (unless ``allow_mixed``) seeds of one setup that
        cover different tasks.
    """
    groups: dict[tuple[str, str], list[RunRecords]] = defaultdict(list)
    order: list[tuple[str, str] | RunRecords] = []
    for run in runs:
        if run.setup_hash is None:
            order.append(run)
            continue
        key = (run.label, run.setup_hash)
        if key not in groups:
            order.append(key)
        groups[key].append(run)
    merged = []
    for item in order:
        if isinstance(item, RunRecords):
            merged.append(item)
            continue
        members = groups[item]
        if len(members) == 1:
            merged.append(members[0])
            continue
        by_seed: dict[tuple[int, ...], Path] = {}
        for run in members:
            seeds = tuple(run.seeds)
            if seeds in by_seed:
                raise ReportError(f"{by_seed[seeds]} and {run.path} are the same setup ({run.label}) with the same "
                                  f"seed {list(seeds)}: leave one out of runs=[...]")
            by_seed[seeds] = run.path
        task_sets = {frozenset(run.frame["task_id"]) for run in members}
        if len(task_sets) > 1 and not allow_mixed:
            sizes = ", ".join(f"{r.path} ({r.frame['task_id'].nunique()} tasks)" for r in members)
            raise ReportError(f"the seeds of {members[0].label} cover different tasks: {sizes}; rerun the missing "
                              f"tasks, or pass leaderboard.allow_mixed=true to report them anyway")
        first = members[0]
        newest = max(members, key=lambda r: r.frame["recorded_ns"].fillna(0).max())
        merged.append(replace(
            first, frame=pd.concat([r.frame for r in members], ignore_index=True), code_hash=newest.code_hash,
            dropped=tuple(sorted({t for r in members for t in r.dropped})), paths=tuple(r.path for r in members),
            checked=all(r.checked for r in members)))
    return merged


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def distinct_labels(runs: list[RunRecords], stream: TextIO | None = None) -> list[RunRecords]:
    """Entries that share a label get what tells them apart appended: the config keys whose values
    differ among them (``decoprune[generation.rope_reindex=false]``), else their folder names; said on
    ``stream`` (stderr).

    Raises
    ------
    ReportError
        Entries that nothing tells apart (one folder given twice).
    """
    by_label: dict[str, list[int]] = defaultdict(list)
    for i, run in enumerate(runs):
        by_label[run.label.casefold()].append(i)  # Mine and mine: one label (file names ignore case)
    out = list(runs)
    for label, indices in by_label.items():
        if len(indices) < 2:
            continue
        configs = [{k: v for k, v in _flat(_folder_files(runs[i].path)[0]).items() if k != "seed"} for i in indices]
        keys = sorted({k for c in configs for k in c if len({json.dumps(d.get(k), sort_keys=True, default=str)
                                                               for d in configs}) > 1})
        names = [",".join(f"{k}={knob_text(c.get(k))}" for k in keys) for c in configs]
        if not all(names) or len(set(names)) < len(names):
            names = [runs[i].path.name for i in indices]
        if len(set(names)) < len(names):
            raise ReportError(f"several runs share a method label ({label}) and nothing tells them apart: "
                              f"{', '.join(str(runs[i].path) for i in indices)}; give each a distinct label, or "
                              f"leave a run given twice out")
        for i, name in zip(indices, names):
            out[i] = replace(runs[i], label=f"{runs[i].label}[{name}]")
        print(f"leaderboard: {len(indices)} different setups are labelled {label!r}; shown as "
              f"{', '.join(out[i].label for i in indices)} (give each its own label=... to choose the names)",
              file=stream or sys.stderr)
    return out


def task_counts(runs: list[RunRecords]) -> str:
    """Each entry's label and task count, largest first: ``decoprune 116 tasks, fullkv 8 tasks``."""
    counts = sorted(((run.frame["task_id"].nunique(), run.label) for run in runs), key=lambda c: -c[0])
    return ", ".join(f"{label} {n} tasks" for n, label in counts)


def shared_tasks(runs: list[RunRecords]) -> frozenset[str] | None:
    """The task ids every entry ran, or None where all entries ran the same tasks."""
    sets = [frozenset(run.frame["task_id"]) for run in runs]
    return frozenset.intersection(*sets) if len(set(sets)) > 1 else None


def refuse_other_task_sets(runs: list[RunRecords]) -> None:
    """Refuse entries that ran different tasks, in one line: each one's count, how many all share, the fixes.

    Raises
    ------
    ReportError
        Entries whose task sets differ.
    """
    shared = shared_tasks(runs)
    if shared is None:
        return
    board = (f"board the {len(shared)} tasks all of them ran with leaderboard.shared_tasks=true"
             if shared else "they share no task")
    raise ReportError(f"runs differ in task set: {task_counts(runs)} ({len(shared)} tasks shared by all); {board}, "
                      f"rerun the others on the same tasks (the same limit=, subset= or task_ids=), or pass "
                      f"leaderboard.allow_mixed=true to report means over different tasks side by side")


def on_shared_tasks(runs: list[RunRecords], stream: TextIO | None = None) -> list[RunRecords]:
    """The entries with only the records of the tasks every entry ran (the tasks each leaves out in its
    ``unshared``), said in one line on ``stream`` (stderr).

    Raises
    ------
    ReportError
        Entries that share no task.
    """
    shared = shared_tasks(runs)
    if shared is None:
        return runs
    if not shared:
        raise ReportError(f"leaderboard.shared_tasks=true: the runs share no task ({task_counts(runs)})")
    out = [replace(run, frame=run.frame[run.frame["task_id"].isin(shared)].reset_index(drop=True),
                   unshared=tuple(sorted(frozenset(run.frame["task_id"]) - shared))) for run in runs]
    print(f"leaderboard: {task_set_note(entry_tasks(out))}", file=stream or sys.stderr)
    return out


def task_set_note(rows: list[tuple[str, int, int]]) -> str | None:
    """The sentence a board owes its reader about its entries' task sets, from ``(label, tasks, unshared)`` per
    entry (the distinct tasks its means cover, the tasks it ran beyond the board's and left out): over the
    shared tasks, how many and what each entry ran beyond them; entries over different tasks
    (``allow_mixed``), each one's count; None when every entry covers the same tasks."""
    more = [(label, unshared) for label, _, unshared in rows if unshared]
    if more:
        return (f"{rows[0][1]} tasks shared by all runs, the board's task set (leaderboard.shared_tasks=true); left out: "
                + ", ".join(f"{label} has {unshared} more" for label, unshared in more))
    if len({tasks for _, tasks, _ in rows}) > 1:
        counts = ", ".join(f"{label} {tasks}" for label, tasks, _ in sorted(rows, key=lambda r: -r[1]))
        return (f"the runs cover different tasks (leaderboard.allow_mixed=true; tasks: {counts}): their means are over "
                f"different tasks, so rows are not comparable (paired deltas are over the tasks both ran)")
    return None


def entry_tasks(runs: list[RunRecords]) -> list[tuple[str, int, int]]:
    """``(label, distinct tasks, unshared tasks)`` of each entry, as :func:`task_set_note` reads them."""
    return [(run.label, int(run.frame["task_id"].nunique()), len(run.unshared)) for run in runs]


def check_comparable(runs: list[RunRecords], allow_mixed: bool = False) -> None:
    """Refuse runs that differ in task set, seeds or scorer config, saying how they differ."""
    if allow_mixed or len(runs) < 2:
        return
    first = runs[0]

    def signature(run: RunRecords) -> dict[str, Any]:
        f = run.frame
        return {
            "task set": frozenset(f["task_id"]),
            # the runs' global seeds when known (their task seeds derive from them), else the task seeds
            "seeds": frozenset(int(s) for s in (f["run_seed"] if f["run_seed"].notna().all() else f["seed"]).dropna()),
            "scorer config": frozenset(f["scorer_hash"].astype(str)),
        }

    base = signature(first)
    for run in runs[1:]:
        other = signature(run)
        for key, value in base.items():
            if key == "seeds" and not (value and other[key]):
                continue  # a folder of unknown seeds (scored videos of another generator) pairs with any
            if other[key] != value:
                only_a = sorted(map(str, value - other[key]))[:5]
                only_b = sorted(map(str, other[key] - value))[:5]
                raise ReportError(
                    f"runs differ in {key}: {first.path} ({first.label}) has {only_a} that {run.path} "
                    f"({run.label}) lacks, which has {only_b}; compare like with like, or pass "
                    f"leaderboard.allow_mixed=true to report them anyway"
                )


def reaggregate(run: RunRecords, how: str) -> None:
    """Make ``score`` the ``how`` (``mean`` or ``max``) of each successful record's references' best
    scores (``reference_aggregates``, else ``reference_scores`` of records written before it).

    Raises
    ------
    ReportError
        ``how`` is not an aggregation, or a successful record carries neither field.
    """
    if how not in REFERENCE_AGGREGATIONS:
        raise ReportError(f"leaderboard.reference_aggregation must be one of {', '.join(REFERENCE_AGGREGATIONS)} "
                          f"(or null: each record's own score), got {how!r}")
    frame = run.frame

    def score(row: pd.Series) -> float:
        if row["status"] != "ok":
            return row["score"]
        if isinstance(row["reference_aggregates"], dict):
            return float(row["reference_aggregates"][how])
        if isinstance(row["reference_scores"], list):
            return aggregate_references(row["reference_scores"], how)
        raise ReportError(f"{run.path}: task {row['task_id']}: its record has no reference_scores, so its "
                          f"score cannot be re-aggregated ({how}); score its videos again")

    if len(frame):
        frame["score"] = pd.to_numeric(frame.apply(score, axis=1), errors="coerce")


def board_precision(entries: Iterable[RunRecords]) -> str:
    """The one cache precision of a board's entries (``float32`` for a board of none).

    Raises
    ------
    ReportError
        Entries (or one entry's records) in more than one precision: one line naming the entries of each.
    """
    by_precision: dict[str, list[str]] = {}
    for entry in entries:
        for precision in frame_precisions(entry.frame):
            by_precision.setdefault(precision, []).append(entry.label)
    if len(by_precision) > 1:
        named = "; ".join(f"{p}: {', '.join(labels)}" for p, labels in sorted(by_precision.items()))
        raise ReportError(f"the entries' KV caches hold different precisions ({named}): their bytes count against "
                          f"FullKV in different precisions, so one board cannot compare them; run them with one "
                          f"cache.dtype")
    return next(iter(by_precision), "float32")


def load_runs(run_dirs: Iterable[str | Path], allow_mixed: bool = False, stream: TextIO | None = None,
              reference_aggregation: str | None = None, task_ids: Iterable[str] | None = None,
              shared_tasks: bool = False) -> list[RunRecords]:
    """Read folders into leaderboard entries: warn about records left out, merge the seeds of each
    setup (:func:`merge_seeds`), give every entry a distinct label (:func:`distinct_labels`) and check
    they are comparable (:func:`check_comparable`). With ``reference_aggregation`` (``mean`` or
    ``max``) every score is that aggregation of the record's references (:func:`reaggregate`); None
    keeps each record's own score (its scorer's ``reference_aggregation``). With ``task_ids``, only
    the records of those tasks (a sweep's board covers the tasks the sweep ran). Entries that ran different
    tasks are refused (:func:`refuse_other_task_sets`), unless ``shared_tasks`` (only the tasks all of them
    ran: :func:`on_shared_tasks`) or ``allow_mixed``.

    Raises
    ------
    ReportError
        No folders, a folder a run is still writing, a setup's seeds that do not fit together, runs
        that are not comparable, or entries whose caches held different precisions
        (:func:`board_precision`).
    """
    stream = stream or sys.stderr
    run_dirs = list(run_dirs)
    for folder in run_dirs:
        writer = active_writer(Path(folder), warn=lambda line: print(f"leaderboard: {line}", file=stream))
        if writer is not None:
            raise ReportError(f"{folder}: a run is still writing it ({writer}): its unfinished tasks would be "
                              f"missing; wait for it to finish, or stop it")
    chosen = None if task_ids is None else list(task_ids)
    runs = [read_records(d, only=chosen) for d in run_dirs]
    if not runs:
        raise ReportError("no run directories given")
    if reference_aggregation is not None:
        for run in runs:
            reaggregate(run, reference_aggregation)
    for run in runs:
        if run.manifest is not None and not run.checked:
            print(f"leaderboard: {run.path}: its manifest {run.manifest} is not there (run from another "
                  f"folder?): records not checked against it", file=stream)
        if run.dropped:
            print(f"leaderboard: {run.path}: left out the records of {len(run.dropped)} task(s) not in "
                  f"{run.manifest}: {', '.join(run.dropped[:10])}{' ...' if len(run.dropped) > 10 else ''}",
                  file=stream)
    entries = distinct_labels(merge_seeds(runs, allow_mixed), stream)
    if shared_tasks:
        entries = on_shared_tasks(entries, stream)
    elif not allow_mixed:
        refuse_other_task_sets(entries)
    else:
        note = task_set_note(entry_tasks(entries))
        if note:
            print(f"leaderboard: {note}", file=stream)
    check_comparable(entries, allow_mixed)
    board_precision(entries)  # never two cache precisions on one bytes axis, even with allow_mixed
    return entries
