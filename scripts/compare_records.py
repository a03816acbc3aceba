"""Compare the task records of two output folders field by field: did a change move any result?

Usage::

    python scripts/compare_records.py BEFORE AFTER

``BEFORE`` and ``AFTER`` are ``out_dir`` folders (or single run folders) holding run directories with
``records*.jsonl``. Runs are matched by their ``label`` (one per method for plain ``method=<name>``
runs), records by ``task_id`` (the latest record of a task wins). Every field that carries a result is
compared exactly (score, pruning ratios, kept tokens, per-frame similarities, boxes, KV bytes, FLOPs,
seeds, the config hash, the method's knobs, ...); fields that may differ without any result moving are
left out: timings, the wall-clock stamp, the git commit, versions, the machine, the code identity (a
refactor changes the code by definition) and the traceback text; absolute paths inside a value (a head
map file in ``method_config``) are compared by file name, so two checkouts in different folders compare.

Prints one line per run, ``<label>: identical (N records)`` or ``<label>: differs: ...`` naming each
task and field that differs; exit 1 when any run differs or is missing on one side.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

IGNORED = frozenset({"prefill_seconds", "continuation_seconds", "continuation_fps", "recorded_ns", "git_commit",
                     "versions", "machine", "code", "code_hash", "traceback"})


def read_runs(root: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``label -> task_id -> record`` over every ``records*.jsonl`` under ``root`` (latest record wins)."""
    runs: dict[str, dict[str, tuple[int, dict[str, Any]]]] = {}
    for path in sorted(root.rglob("records*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):  # a torn last line: not a record
                    continue
                row = json.loads(line)
                tasks = runs.setdefault(str(row.get("label")), {})
                stamp = int(row.get("recorded_ns") or 0)
                if row["task_id"] not in tasks or tasks[row["task_id"]][0] <= stamp:
                    tasks[row["task_id"]] = (stamp, row)
    return {label: {t: r for t, (_, r) in tasks.items()} for label, tasks in runs.items()}


def without_paths(value: Any) -> Any:
    """``value`` with every absolute path (a string starting with ``/``) replaced by its file name."""
    if isinstance(value, dict):
        return {k: without_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_paths(v) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        return Path(value).name
    return value


def record_differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The result fields whose values differ (a field on one side only counts)."""
    fields = sorted((set(before) | set(after)) - IGNORED)
    return [f for f in fields
            if without_paths(before.get(f, "<absent>")) != without_paths(after.get(f, "<absent>"))]


def compare(before: Path, after: Path) -> tuple[list[str], bool]:
    """Lines to print and whether everything is identical."""
    old, new = read_runs(before), read_runs(after)
    lines, same = [], True
    for label in sorted(set(old) | set(new)):
        if label not in old or label not in new:
            lines.append(f"{label}: only in {'AFTER' if label in new else 'BEFORE'}")
            same = False
            continue
        a, b = old[label], new[label]
        problems = [f"task {t} only in {'AFTER' if t in b else 'BEFORE'}" for t in sorted(set(a) ^ set(b))]
        for task in sorted(set(a) & set(b)):
            diff = record_differences(a[task], b[task])
            if diff:
                problems.append(f"{task}: {', '.join(diff)}")
        if problems:
            lines.append(f"{label}: differs: {'; '.join(problems)}")
            same = False
        else:
            lines.append(f"{label}: identical ({len(a)} records)")
    if not old and not new:
        lines.append("no records in either folder")
        same = False
    return lines, same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    for folder in (args.before, args.after):
        if not folder.is_dir():
            print(f"compare_records: error: {folder} is not a folder", file=sys.stderr)
            return 2
    lines, same = compare(args.before, args.after)
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
