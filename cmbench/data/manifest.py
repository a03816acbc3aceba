"""Load and strictly validate a CMBench ``metadata.jsonl``.

Validation collects *every* problem of a file before reporting, each as ``file:line``, the field,
what is wrong and what was expected, so a dataset author fixes a manifest in one pass.

Checked per row: JSON syntax; required fields present and of the right type; ``task_id`` a safe file
name (it names output files: letters, digits, ``.``, ``_``, ``-``, not starting with ``.`` or ``-``);
enums (``type``,
``task_type``); exactly 6 ``context_clip_prompts`` each with a non-empty ``clip_prompt``; references
(non-empty list; ``timestamp_seconds`` >= 0; optional integer ``frame_index`` >= 0; a box of four
numbers in [0, 1] with positive area); the ``video`` path (relative, no ``..``, no absolute path, no
symlink resolving outside the dataset root: a security boundary), the video on disk and readable, and
references not past the video's end. Across rows: duplicate ``task_id`` values, and one ``type`` per
video. Against a dataset spec: the expected counts (see :mod:`cmbench.data.spec`).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, TypeGuard

from cmbench import bounded_read
from cmbench.data.task import N_CLIP_PROMPTS, SOURCES, TASK_TYPES, Reference, Task, as_box
from cmbench.data.video import VideoError, probe_video
from cmbench.errors import CMBenchError

REQUIRED_FIELDS: dict[str, type] = {
    "type": str,
    "task_id": str,
    "scene": str,
    "video": str,
    "context_clip_prompts": list,
    "continue_prompt": str,
    "task_type": str,
    "target_label": str,
    "target_aliases": list,
    "references": list,
}
# a task id names output files (videos/<task_id>.mp4): one plain path component, never hidden
SAFE_TASK_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")
_TYPE_NAMES = {str: "a string", list: "a list", int: "an integer", float: "a number", dict: "an object"}
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
# a value quoted in a problem is cut to this many characters, so every problem stays one readable line
_SHOWN_CHARS = 240


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest row (or with the file as a whole when ``line`` is None)."""

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return _printable(f"{where}: {self.field}: {self.message}")


def _printable(text: str) -> str:
    """``text`` on one printable line: control characters and lone surrogates (which a manifest's strings
    can carry into a message) written as their Python escapes."""
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text)


def rows_with_problems(problems: list[Problem], file: str | Path) -> set[int]:
    """The line numbers of ``file`` that have at least one problem."""
    return {p.line for p in problems if p.line is not None and p.file == str(file)}


class ManifestError(CMBenchError):
    """A manifest has problems; ``problems`` lists all of them."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        head = f"{len(problems)} problem(s) in the dataset manifest:"
        super().__init__("\n".join([head, *(f"  {p}" for p in problems)]))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """``repr(value)``, cut to :data:`_SHOWN_CHARS` characters (a received manifest may hold megabytes in a field)."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS - 40]}... ({len(text)} characters)"


def _is_number(value: Any) -> TypeGuard[int | float]:
    """A finite JSON number that converts to a float (``10**400`` does not: it overflows)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond the float range
        return False


class _RowChecker:
    """Checks one row, appending problems; builds the Task when the row is sound."""

    def __init__(self, file: str, line: int, problems: list[Problem]):
        self.file, self.line, self.problems = file, line, problems

    def fail(self, field: str, message: str) -> None:
        self.problems.append(Problem(self.file, self.line, field, message))

    def check(self, row: dict[str, Any]) -> bool:
        start = len(self.problems)
        for name, expected in REQUIRED_FIELDS.items():
            if name not in row:
                self.fail(name, f"missing required field (expected {_TYPE_NAMES[expected]})")
            elif not isinstance(row[name], expected):
                self.fail(name, f"is {_kind(row[name])}, expected {_TYPE_NAMES[expected]}")
        for name in ("task_id", "scene", "video", "target_label", "continue_prompt"):
            if isinstance(row.get(name), str) and not row[name].strip():
                self.fail(name, "is empty, expected a non-empty string")
        task_id = row.get("task_id")
        if isinstance(task_id, str) and task_id.strip() and not SAFE_TASK_ID.match(task_id):
            self.fail("task_id", f"is {_show(task_id)}, expected a file-name-safe id (letters, digits, '.', '_', '-'; "
                                 f"not starting with '.' or '-'; at most 200 characters), e.g. 'syn_001_reappear_01'")
        self._enum(row, "type", SOURCES)
        self._enum(row, "task_type", TASK_TYPES)
        self._clip_prompts(row.get("context_clip_prompts"))
        aliases = row.get("target_aliases")
        if isinstance(aliases, list):
            for i, alias in enumerate(aliases):
                if not isinstance(alias, str) or not alias.strip():
                    self.fail(f"target_aliases[{i}]", f"is {_kind(alias)!s} {_show(alias)}, expected a non-empty string")
        refs = row.get("references")
        if isinstance(refs, list):
            if not refs:
                self.fail("references", "is empty, expected at least one reference")
            for i, ref in enumerate(refs):
                self._reference(i, ref)
        return len(self.problems) == start

    def _enum(self, row: dict[str, Any], name: str, allowed: tuple[str, ...]) -> None:
        value = row.get(name)
        if isinstance(value, str) and value not in allowed:
            self.fail(name, f"is {_show(value)}, expected one of {', '.join(map(repr, allowed))}")

    def _clip_prompts(self, prompts: Any) -> None:
        if not isinstance(prompts, list):
            return
        if len(prompts) != N_CLIP_PROMPTS:
            self.fail("context_clip_prompts", f"has {len(prompts)} item(s), expected exactly {N_CLIP_PROMPTS}")
        for i, item in enumerate(prompts):
            name = f"context_clip_prompts[{i}]"
            if not isinstance(item, dict):
                self.fail(name, f"is {_kind(item)}, expected an object with 'clip_prompt'")
            elif not isinstance(item.get("clip_prompt"), str) or not item["clip_prompt"].strip():
                got = "missing" if "clip_prompt" not in item else f"{_kind(item['clip_prompt'])} {_show(item['clip_prompt'])}"
                self.fail(f"{name}.clip_prompt", f"is {got}, expected a non-empty string")

    def _reference(self, i: int, ref: Any) -> None:
        name = f"references[{i}]"
        if not isinstance(ref, dict):
            self.fail(name, f"is {_kind(ref)}, expected an object")
            return
        ts = ref.get("timestamp_seconds")
        if "timestamp_seconds" not in ref:
            self.fail(f"{name}.timestamp_seconds", "missing required field (expected a number >= 0)")
        elif not _is_number(ts) or ts < 0:
            self.fail(f"{name}.timestamp_seconds", f"is {_show(ts)}, expected a finite number >= 0")
        if ref.get("frame_index") is not None:
            fi = ref["frame_index"]
            if not isinstance(fi, int) or isinstance(fi, bool) or fi < 0:
                self.fail(f"{name}.frame_index", f"is {_show(fi)}, expected an integer >= 0 (or absent)")
        box = ref.get("bbox_xyxy_normalized")
        field = f"{name}.bbox_xyxy_normalized"
        if "bbox_xyxy_normalized" not in ref:
            self.fail(field, "missing required field (expected [x0, y0, x1, y1] in [0, 1])")
        elif not isinstance(box, list) or len(box) != 4 or not all(_is_number(v) for v in box):
            self.fail(field, f"is {_show(box)}, expected a list of 4 numbers [x0, y0, x1, y1]")
        else:
            if any(v < 0 or v > 1 for v in box):
                self.fail(field, f"is {_show(box)}: coordinates outside [0, 1], expected normalised coordinates")
            if box[2] <= box[0] or box[3] <= box[1]:
                self.fail(field, f"is {_show(box)}: zero or negative area, expected x1 > x0 and y1 > y0")


def _task_from_row(row: dict[str, Any], root: Path, line: int) -> Task:
    known_ref = {"timestamp_seconds", "frame_index", "bbox_xyxy_normalized"}
    refs = tuple(
        Reference(
            timestamp_seconds=float(r["timestamp_seconds"]),
            bbox_xyxy_normalized=as_box(r["bbox_xyxy_normalized"]),
            frame_index=r.get("frame_index"),
            extra={k: v for k, v in r.items() if k not in known_ref},
        )
        for r in row["references"]
    )
    return Task(
        task_id=row["task_id"],
        source=row["type"],
        scene=row["scene"],
        video=row["video"],
        context_clip_prompts=tuple(p["clip_prompt"] for p in row["context_clip_prompts"]),
        continue_prompt=row["continue_prompt"],
        task_type=row["task_type"],
        target_label=row["target_label"],
        target_aliases=tuple(row["target_aliases"]),
        references=refs,
        extra={k: v for k, v in row.items() if k not in REQUIRED_FIELDS},
        root=root,
        line=line,
    )


def video_path_problem(root: Path, video: str) -> str | None:
    """Why ``video`` may not be used as a path under ``root`` (None when it is safe).

    Rejects NUL characters, absolute paths (POSIX or Windows), ``..`` components, backslashes, names
    longer than the file system allows (a component past ``NAME_MAX`` bytes, the whole path past
    ``PATH_MAX``), and paths that resolve (through symlinks) outside ``root``.
    """
    shown = _show(video)
    if "\x00" in video:
        return f"{shown} contains a NUL character, expected a file path"
    try:
        os.fsencode(video)
    except UnicodeEncodeError:  # a lone surrogate such as "\ud800", which JSON can spell
        return f"{shown} cannot be a file name on this system (a character the file system cannot encode)"
    if "\\" in video or PureWindowsPath(video).drive:
        return f"{shown} is not a POSIX relative path, expected e.g. 'videos/synthetic/syn_001.mp4'"
    pure = PurePosixPath(video)
    if pure.is_absolute():
        return f"{shown} is an absolute path, expected a path relative to the dataset root"
    if ".." in pure.parts:
        return f"{shown} contains '..', expected a path inside the dataset root"
    name_max, path_max = _name_limits(root)
    longest = max((len(os.fsencode(part)) for part in pure.parts), default=0)
    if longest > name_max:
        return f"{shown} has a component of {longest} bytes, longer than the file system allows ({name_max})"
    full = len(os.fsencode(str(root.resolve() / pure)))
    if full > path_max:
        return f"{shown} makes a path of {full} bytes, longer than the file system allows ({path_max})"
    try:
        resolved = (root / pure).resolve()
    except (OSError, RuntimeError, ValueError) as err:  # a symlink loop, a component that cannot be read
        return f"{shown} cannot be resolved ({err.__class__.__name__}: {getattr(err, 'strerror', None) or err})"
    if not resolved.is_relative_to(root.resolve()):
        return f"{shown} resolves to {resolved}, outside the dataset root {root.resolve()} (symlink?)"
    return None


def _name_limits(root: Path) -> tuple[int, int]:
    """The file system's longest name component and path under ``root``, in bytes (POSIX 255 / 4096 where
    the system does not say)."""
    try:
        return os.pathconf(root, "PC_NAME_MAX"), os.pathconf(root, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or no such root
        return 255, 4096


def read_manifest(path: Path, root: Path, problems: list[Problem]) -> list[Task]:
    """Parse and check every row of one manifest; rows with problems are skipped (and reported)."""
    tasks: list[Task] = []
    file = str(path)
    try:
        # lines end at "\n" only (str.splitlines also breaks at U+2028, U+0085, U+001E..., which JSON
        # strings may hold, and would shift every later line number)
        lines = [line.removesuffix("\r") for line in bounded_read.read_text(path, "manifest").split("\n")]
    except bounded_read.ReadLimitError as err:
        problems.append(Problem(file, None, "<file>", f"cannot read manifest: {str(err).removeprefix(file + ': ')}"))
        return tasks
    except (OSError, UnicodeDecodeError) as err:
        problems.append(Problem(file, None, "<file>", f"cannot read manifest: {err}"))
        return tasks
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            problems.append(Problem(file, number, "<json>", f"invalid JSON ({err.msg} at column {err.colno})"))
            continue
        except RecursionError:
            problems.append(Problem(file, number, "<json>", "invalid JSON (nested too deeply to parse), expected "
                                                            "a flat object of fields"))
            continue
        except ValueError:  # Python refuses to convert an integer of more digits than its limit
            limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
            problems.append(Problem(file, number, "<json>", f"invalid JSON (an integer of more than {limit} digits), "
                                                            "expected numbers of a sensible size"))
            continue
        if not isinstance(row, dict):
            problems.append(Problem(file, number, "<row>", f"is {_kind(row)}, expected a JSON object"))
            continue
        checker = _RowChecker(file, number, problems)
        sound = checker.check(row)
        if isinstance(row.get("video"), str) and row["video"].strip():
            why = video_path_problem(root, row["video"])
            if why:
                checker.fail("video", why)
                sound = False
        if sound:
            tasks.append(_task_from_row(row, root, number))
    if not tasks and not problems:
        problems.append(Problem(file, None, "<file>", "manifest has no rows"))
    return tasks


def _check_across_rows(file: str, tasks: list[Task], problems: list[Problem]) -> None:
    seen: dict[str, int] = {}
    for task in tasks:
        if task.task_id in seen:
            problems.append(
                Problem(file, task.line, "task_id", f"duplicate {task.task_id!r} (first at line {seen[task.task_id]})")
            )
        else:
            seen[task.task_id] = task.line or 0
    by_video: dict[str, Task] = {}
    for task in tasks:
        first = by_video.setdefault(task.video, task)
        if first.source != task.source:
            problems.append(
                Problem(
                    file,
                    task.line,
                    "type",
                    f"is {task.source!r} but line {first.line} gives {first.source!r} for the same video {task.video!r}",
                )
            )


def _check_videos(file: str, tasks: list[Task], problems: list[Problem]) -> None:
    """Each distinct video exists and is readable; references do not run past its end."""
    by_video: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_video[task.video].append(task)
    for video, group in by_video.items():
        path = group[0].video_path
        try:
            count, fps, _, _ = probe_video(path)
        except (VideoError, OSError, ValueError) as err:  # OSError/ValueError: a path the system refuses to open
            for task in group:
                problems.append(Problem(file, task.line, "video", str(err)[:_SHOWN_CHARS]))
            continue
        duration = count / fps
        for task in group:
            for i, ref in enumerate(task.references):
                if ref.timestamp_seconds > duration:
                    problems.append(
                        Problem(
                            file,
                            task.line,
                            f"references[{i}].timestamp_seconds",
                            f"is {ref.timestamp_seconds:g} s, past the end of {video} ({duration:.3f} s)",
                        )
                    )
                if ref.frame_index is not None and ref.frame_index >= count:
                    problems.append(
                        Problem(
                            file,
                            task.line,
                            f"references[{i}].frame_index",
                            f"is {_show(ref.frame_index)}, past the last frame of {video} ({count} frames)",
                        )
                    )


def validate_manifest(
    root: str | Path, manifest: str = "metadata.jsonl", check_videos: bool = True
) -> tuple[list[Task], list[Problem]]:
    """Load a manifest and collect every problem.

    Parameters
    ----------
    root : path
        Dataset root; the manifest and every ``video`` path are relative to it.
    manifest : str
        Manifest file name under ``root``.
    check_videos : bool
        Also open every video and check references against its length.

    Returns
    -------
    tasks : list of Task
        The rows without problems, in file order.
    problems : list of Problem
        Everything wrong, in file order (row problems, then cross-row, then video problems).
    """
    root = Path(root)
    path = root / manifest
    problems: list[Problem] = []
    if not path.exists():  # anything else there (a FIFO, a device, a directory) is refused by its read, by name
        hint = " (dataset root does not exist)" if not root.exists() else ""
        problems.append(Problem(str(path), None, "<file>", f"manifest not found{hint}"))
        return [], problems
    tasks = read_manifest(path, root, problems)
    _check_across_rows(str(path), tasks, problems)
    if check_videos:
        _check_videos(str(path), tasks, problems)
    return tasks, problems


def load_manifest(root: str | Path, manifest: str = "metadata.jsonl", check_videos: bool = True) -> list[Task]:
    """Load a manifest, raising :class:`ManifestError` listing every problem if there is any.

    Returns
    -------
    list of Task, in file order.
    """
    tasks, problems = validate_manifest(root, manifest, check_videos)
    if problems:
        raise ManifestError(problems)
    return tasks
