"""``leaderboard.json``: a board that can leave the machine, be submitted, merged and checked.

``leaderboard`` writes it beside the CSVs (docs/runs.md, "Submitting a board")::

    {
      "schema": "cmbench.leaderboard", "schema_version": 1,
      "cmbench_version": "0.1.0", "date": "2026-12-07T13:00:00+00:00",
      "task_set": {"hash": ..., "task_ids": [...], "manifests": [...], "dataset_commits": [...]},
      "scorer": {"hash": ..., "names": [...], "config_hashes": [...], "models_hashes": [...], "metrics": [...]},
      "rows": [{"method": ..., "score": ..., ... every column of leaderboard.csv ...,
                "seeds": [...], "code_hash": ..., "code": {...}, "setup_hash": ...,
                "by_source": {"synthetic": {"score": ..., "score_ci95": ..., "pr": ..., "n_tasks": ...,
                                            "failures": ...}, ...},
                "by_task_type": {...}}]
    }

The task set's identity is a hash of its task ids and the manifests the records were computed from (the
``manifest`` part of their code identity) with the dataset's hub commits; the scorer's, a hash of the
scorer config hashes and model hashes the records carry. ``leaderboard leaderboard.merge=[a.json, b.json]``
merges received files (:func:`merge_boards`): all of one schema version, task set and scorer, or refused in
one line naming the file and the field. A received file is data: read within its bound, every value
checked (:func:`read_board`).
"""

from __future__ import annotations

import datetime
import json
import math
from importlib import metadata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cmbench import bounded_read
from cmbench.hashing import json_digest
from cmbench.report.fidelity import FIDELITY_COLUMNS
from cmbench.report.reading import ReportError, RunRecords
from cmbench.scoring.quality_names import QUALITY_FIELDS

FILE = "leaderboard.json"
SCHEMA = "cmbench.leaderboard"
SCHEMA_VERSION = 1
BREAKDOWNS = {"by_source": "source", "by_task_type": "task_type"}
"""A row's breakdowns and the column of ``leaderboard_by_source.csv`` / ``leaderboard_by_type.csv`` they come from."""
BREAKDOWN_FIELDS = ("score", "score_ci95", "pr", "n_tasks", "failures")
SIMILARITY = ("score", "score_at_85pr")  # cosine similarities: in [-1, 1]
FRACTIONS = ("pr", "context_pr")
COUNTS = ("n_tasks", "failures", "other_code_tasks", "frame_count_flags", "task_count", "unshared_tasks",
          "quality_undefined")
NUMBERS = (*SIMILARITY, *FRACTIONS, *COUNTS, "score_ci95", "kv_bytes_ratio", "speedup_vs_fullkv", "continuation_fps",
           "peak_kv_bytes", "cost_speedup_vs_fullkv", "attention_keys_per_token", "score_seed_std",
           "peak_store_bytes", "moved_bytes_per_chunk", *FIDELITY_COLUMNS,
           *(f"{name}{suffix}" for name in QUALITY_FIELDS for suffix in ("", "_ci95")))
"""The columns of ``leaderboard.csv`` a board shows as numbers: a received row holds a number or null there."""


def cmbench_version() -> str:
    """The installed CMBench's version (``unknown`` outside an installed package)."""
    try:
        return metadata.version("cmbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def _known(values: Iterable[Any]) -> list[Any]:
    """The distinct non-missing values, sorted as text."""
    return sorted({v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))}, key=str)


def _plain(value: Any) -> Any:
    """A table cell as JSON: NaN as null, numpy scalars as Python's."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _manifest_part(code: Any) -> str | None:
    return code.get("manifest") if isinstance(code, dict) else None


def task_set(runs: Sequence[RunRecords]) -> dict[str, Any]:
    """The identity of the tasks a board covers: their ids, the manifests (by content) and dataset commits
    their records name, and a hash over the three."""
    frames = [run.frame for run in runs]
    ids = sorted({str(t) for f in frames for t in f["task_id"]})
    manifests = _known(_manifest_part(c) for f in frames for c in f["code"])
    commits = _known(c for f in frames if "dataset_commit" in f for c in f["dataset_commit"])
    identity = {"task_ids": ids, "manifests": manifests, "dataset_commits": commits}
    return {"hash": json_digest(identity), **identity}


def scorer_identity(runs: Sequence[RunRecords]) -> dict[str, Any]:
    """The identity of what scored a board: its scorers' config hashes and model hashes, hashed together."""
    frames = [run.frame for run in runs]
    identity = {"config_hashes": _known(h for f in frames for h in f["scorer_hash"]),
                "models_hashes": _known(h for f in frames for h in f["scorer_models_hash"])}
    return {"hash": json_digest(identity), **identity, "names": _known(n for f in frames for n in f["scorer"]),
            "metrics": _known(run.metric for run in runs)}


def _latest(frame: pd.DataFrame, column: str) -> Any:
    """The last non-missing value of a column (None when there is none)."""
    if column not in frame:
        return None
    values = frame[column].dropna()
    return values.iloc[-1] if len(values) else None


def _breakdown(table: pd.DataFrame, label: str, column: str) -> dict[str, dict[str, Any]]:
    rows = table[table["method"] == label]
    return {str(r[column]): {k: _plain(r[k]) for k in BREAKDOWN_FIELDS} for _, r in rows.iterrows()}


def board_json(runs: Sequence[RunRecords], board: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """The ``leaderboard.json`` of a board: ``board`` (``leaderboard.csv``'s rows) with each entry's seeds and
    code identity, the per-source and per-task-type breakdowns of ``tables`` (``leaderboard_by_source.csv``,
    ``leaderboard_by_type.csv``), and the task set's and scorer's identities."""
    by_label = {run.label: run for run in runs}
    rows = []
    for _, cells in board.iterrows():
        run = by_label[str(cells["method"])]
        row = {str(k): _plain(v) for k, v in cells.items()}
        code = _latest(run.frame, "code")
        row.update(seeds=[int(s) for s in run.seeds], code_hash=run.code_hash or _latest(run.frame, "code_hash"),
                   code=code if isinstance(code, dict) else None, setup_hash=run.setup_hash)
        for key, name in (("by_source", "leaderboard_by_source.csv"), ("by_task_type", "leaderboard_by_type.csv")):
            row[key] = _breakdown(tables[name], run.label, BREAKDOWNS[key])
        rows.append(row)
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "cmbench_version": cmbench_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "task_set": task_set(runs), "scorer": scorer_identity(runs), "rows": rows}


def board_text(board: Mapping[str, Any]) -> str:
    """``leaderboard.json``'s text (strict JSON: no NaN)."""
    return json.dumps(board, indent=1, allow_nan=False) + "\n"


def refilled(path: str | Path, column: str, values: Mapping[str, float]) -> str:
    """The text of the board folder's ``leaderboard.json`` (checked as a received one: :func:`read_board`) with
    ``column`` of each row set from ``values`` (method -> value; NaN as null), the other fields as they were:
    what ``leaderboard.refresh_curves=true`` writes beside the refilled CSV."""
    board = read_board(path)
    for row in board["rows"]:
        row[column] = _plain(values.get(row["method"], math.nan))
    return board_text(board)


# ------------------------------------------------------------------------------------ received boards
def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _number_problem(name: str, value: Any) -> str | None:
    """What is wrong with a numeric cell (None when fine or null)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {json.dumps(value)[:40]}, expected a number or null"
    if not math.isfinite(value):
        return "is not a finite number"
    if name in SIMILARITY and not -1.0 <= value <= 1.0:
        return f"is {value!r}, expected a similarity in [-1, 1]"
    if name in FRACTIONS and not 0.0 <= value <= 1.0:
        return f"is {value!r}, expected a fraction in [0, 1]"
    if name in COUNTS and not (float(value).is_integer() and value >= 0):
        return f"is {value!r}, expected a whole number >= 0"
    if name not in SIMILARITY and value < 0 and not name.startswith("delta"):
        return f"is {value!r}, expected a number >= 0"
    return None


def _cell_problem(name: str, value: Any) -> str | None:
    """What is wrong with a row's cell: numbers checked by :func:`_number_problem`, text and flags as they are."""
    if value is None or isinstance(value, (str, bool)):
        return None if name not in NUMBERS or value is None else f"is {json.dumps(value)[:40]}, expected a number or null"
    return _number_problem(name, value)


def _row_problem(row: Any) -> str | None:
    """``field: what is wrong`` about one received row, or None."""
    if not isinstance(row, dict):
        return ": expected a JSON object"
    if not isinstance(row.get("method"), str) or not row["method"]:
        return ".method: expected a non-empty string"
    for name, value in row.items():
        if name in ("seeds", "code", "by_source", "by_task_type", "suspect"):
            continue
        if isinstance(value, (list, dict)):
            return f".{name}: is a {type(value).__name__}, expected a number, text or null"
        problem = _cell_problem(name, value)
        if problem:
            return f".{name}: {problem}"
    seeds = row.get("seeds")
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        return ".seeds: expected a list of whole numbers >= 0"
    if row.get("code") is not None and not (isinstance(row["code"], dict)
                                            and all(v is None or isinstance(v, str) for v in row["code"].values())):
        return ".code: expected a mapping part -> hash"
    for key in BREAKDOWNS:
        parts = row.get(key)
        if not isinstance(parts, dict):
            return f".{key}: expected a mapping value -> numbers"
        for value, cells in parts.items():
            if not isinstance(cells, dict):
                return f".{key}.{value}: expected a JSON object"
            for name in BREAKDOWN_FIELDS:
                problem = _number_problem(name, cells.get(name))
                if problem:
                    return f".{key}.{value}.{name}: {problem}"
    return None


def read_board(path: str | Path) -> dict[str, Any]:
    """A received ``leaderboard.json``, read within its bound and every value checked.

    Raises
    ------
    ReportError
        ``<file>: <field>: what is wrong`` (an unknown schema version, a forged value, not JSON, too large,
        not a regular file), one line.
    """
    path = Path(path)
    try:
        text = bounded_read.read_text(path, "leaderboard json")
        board = json.loads(text, parse_constant=_reject_constant)
    except bounded_read.ReadLimitError as err:
        raise ReportError(str(err)) from None
    except OSError as err:
        raise ReportError(f"{path}: cannot read it ({err.strerror or err})") from None
    except (ValueError, RecursionError) as err:
        raise ReportError(f"{path}: not a leaderboard.json ({str(err).splitlines()[0][:80]})") from None
    if not isinstance(board, dict) or board.get("schema") != SCHEMA:
        raise ReportError(f"{path}: schema: expected {SCHEMA!r} (a leaderboard.json CMBench writes)")
    version = board.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise ReportError(f"{path}: schema_version: is {json.dumps(version)[:40]}, this CMBench reads version "
                          f"{SCHEMA_VERSION}")
    for key in ("cmbench_version", "date"):
        if not isinstance(board.get(key), str):
            raise ReportError(f"{path}: {key}: expected text")
    for key in ("task_set", "scorer"):
        if not isinstance(board.get(key), dict) or not isinstance(board[key].get("hash"), str):
            raise ReportError(f"{path}: {key}.hash: expected the {key.replace('_', ' ')}'s identity (text)")
    task_ids = board["task_set"].get("task_ids")
    if not isinstance(task_ids, list) or not all(isinstance(t, str) for t in task_ids):
        raise ReportError(f"{path}: task_set.task_ids: expected a list of task ids")
    if json_digest({k: board["task_set"].get(k) for k in ("task_ids", "manifests", "dataset_commits")}) \
            != board["task_set"]["hash"]:
        raise ReportError(f"{path}: task_set.hash: does not match its task_ids, manifests and dataset_commits")
    if not isinstance(board.get("rows"), list) or not board["rows"]:
        raise ReportError(f"{path}: rows: expected a non-empty list of entries")
    for i, row in enumerate(board["rows"]):
        problem = _row_problem(row)
        if problem:
            raise ReportError(f"{path}: rows[{i}]{problem}")
        pairs = len(task_ids) * max(1, len(row["seeds"]))  # n_tasks counts (task, seed) pairs
        if isinstance(row.get("n_tasks"), (int, float)) and row["n_tasks"] > pairs:
            raise ReportError(f"{path}: rows[{i}].n_tasks: is {row['n_tasks']}, more than the task set's "
                              f"{len(task_ids)} tasks x {max(1, len(row['seeds']))} seed(s)")
    return board


def merge_boards(paths: Sequence[str | Path]) -> dict[str, Any]:
    """One board from several received ``leaderboard.json`` files (:func:`read_board` each): rows in file
    order, the first file's identities.

    Raises
    ------
    ReportError
        A file that does not read, a file of another schema version, task set or scorer than the first, or
        one method in two files (one line naming the file and the field).
    """
    if not paths:
        raise ReportError("leaderboard.merge: names no leaderboard.json")
    boards = [(Path(p), read_board(p)) for p in paths]
    first_path, first = boards[0]
    rows: list[dict[str, Any]] = []
    seen: dict[str, Path] = {}
    for path, board in boards:
        for key in ("task_set", "scorer"):
            if board[key]["hash"] != first[key]["hash"]:
                raise ReportError(f"{path}: {key}.hash: is {board[key]['hash']}, {first_path} has "
                                  f"{first[key]['hash']}: boards of other {key.replace('_', ' ')}s do not merge")
        for row in board["rows"]:
            if row["method"] in seen:
                raise ReportError(f"{path}: rows: method {row['method']!r} is also in {seen[row['method']]}: "
                                  f"relabel one of the runs before submitting")
            seen[row["method"]] = path
            rows.append({**row, "submitted_in": path.name})
    return {**first, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cmbench_version": cmbench_version(), "merged_from": [str(p) for p, _ in boards], "rows": rows}


def board_tables(board: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """``leaderboard.csv``, ``leaderboard_by_source.csv`` and ``leaderboard_by_type.csv`` of a (merged)
    board, best score first."""
    nested = ("seeds", "code", *BREAKDOWNS)
    rows = [{**{k: (math.nan if v is None else v) for k, v in row.items() if k not in nested},
             "seeds": max(1, len(row["seeds"]))} for row in board["rows"]]
    main = pd.DataFrame(rows).sort_values("score", ascending=False, kind="stable").reset_index(drop=True)
    tables = {"leaderboard.csv": main}
    for key, name in (("by_source", "leaderboard_by_source.csv"), ("by_task_type", "leaderboard_by_type.csv")):
        column = BREAKDOWNS[key]
        tables[name] = pd.DataFrame(
            [{"method": row["method"], "metric": row.get("metric"), column: value,
              **{k: (math.nan if cells.get(k) is None else cells[k]) for k in BREAKDOWN_FIELDS}}
             for row in board["rows"] for value, cells in row[key].items()],
            columns=["method", "metric", column, *BREAKDOWN_FIELDS])
    return tables
