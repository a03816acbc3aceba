"""Exact problem texts, boundaries and defaults of the metadata.jsonl reader, one behaviour per test.

Every problem is one line ``file:line: field: reason``; these tests pin each reason word for word, so a
dataset author always reads the same, complete message.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import sys
from pathlib import Path

import pytest

from cmbench.data import manifest as mf
from cmbench.data.manifest import (
    ManifestError,
    Problem,
    _check_across_rows,
    _check_videos,
    _kind,
    _name_limits,
    _printable,
    _RowChecker,
    _show,
    load_manifest,
    read_manifest,
    rows_with_problems,
    validate_manifest,
    video_path_problem,
)
from official_fixture import official_row, write_context_video, write_manifest

VIDEO = "videos/synthetic/syn_001.mp4"


def _row_problems(**over) -> list[str]:
    """The problems of one official row with ``over`` replacing fields, as printed (file "m", line 1)."""
    problems: list[Problem] = []
    row = official_row("t1", VIDEO)
    row.update(over)
    sound = _RowChecker("m", 1, problems).check(row)
    assert sound == (not problems)
    return [str(p) for p in problems]


def _ref_problems(ref) -> list[str]:
    return _row_problems(references=[ref])


def test_a_well_formed_row_has_no_problem():
    """The fixture row itself is sound: every case below differs from it in one field only."""
    assert _row_problems() == []


@pytest.mark.parametrize("name", ["task_id", "scene", "video", "target_label", "continue_prompt"])
def test_blank_text_fields_are_refused_by_name(name):
    """A required text field of only spaces is named and refused (and nothing else is said about it)."""
    assert _row_problems(**{name: "  "}) == [f"m:1: {name}: is empty, expected a non-empty string"]


def test_unsafe_task_id_message():
    """A task id that cannot be a file name is quoted with the rule it breaks."""
    assert _row_problems(task_id="-x") == [
        "m:1: task_id: is '-x', expected a file-name-safe id (letters, digits, '.', '_', '-'; "
        "not starting with '.' or '-'; at most 200 characters), e.g. 'syn_001_reappear_01'"
    ]


def test_empty_reference_list_is_refused():
    assert _row_problems(references=[]) == ["m:1: references: is empty, expected at least one reference"]


@pytest.mark.parametrize(("alias", "said"), [(None, "null None"), (True, "a boolean True"), ("  ", "a string '  '"),
                                             (3, "an integer 3"), (1.5, "a number 1.5")])
def test_bad_alias_names_its_kind_and_value(alias, said):
    """A target alias that is not a non-empty string is reported with its JSON kind and its value."""
    assert _row_problems(target_aliases=["ok", alias]) == [
        f"m:1: target_aliases[1]: is {said}, expected a non-empty string"
    ]


@pytest.mark.parametrize(("value", "kind"), [(None, "null"), (False, "a boolean"), ({}, "an object"),
                                             ((1,), "tuple"), (b"x", "bytes")])
def test_kind_names(value, kind):
    """JSON kinds are named in words; any other Python type by its own type name."""
    assert _kind(value) == kind


def test_wrong_number_of_clip_prompts():
    prompts = [{"clip_prompt": "p"}] * 5
    assert _row_problems(context_clip_prompts=prompts) == [
        "m:1: context_clip_prompts: has 5 item(s), expected exactly 6"
    ]


@pytest.mark.parametrize(("item", "problem"), [
    ("p", "m:1: context_clip_prompts[2]: is a string, expected an object with 'clip_prompt'"),
    (None, "m:1: context_clip_prompts[2]: is null, expected an object with 'clip_prompt'"),
    ({}, "m:1: context_clip_prompts[2].clip_prompt: is missing, expected a non-empty string"),
    ({"CLIP_PROMPT": "p"}, "m:1: context_clip_prompts[2].clip_prompt: is missing, expected a non-empty string"),
    ({"clip_prompt": " "}, "m:1: context_clip_prompts[2].clip_prompt: is a string ' ', expected a non-empty string"),
    ({"clip_prompt": None}, "m:1: context_clip_prompts[2].clip_prompt: is null None, expected a non-empty string"),
    ({"clip_prompt": 7}, "m:1: context_clip_prompts[2].clip_prompt: is an integer 7, expected a non-empty string"),
])
def test_bad_clip_prompt_item_is_named_by_index(item, problem):
    """Each bad clip prompt is named by its position, with what it holds instead of a prompt."""
    prompts = [{"clip_prompt": f"p{i}"} for i in range(6)]
    prompts[2] = item
    assert _row_problems(context_clip_prompts=prompts) == [problem]


BOX = [0.1, 0.2, 0.5, 0.6]


@pytest.mark.parametrize(("ref", "problems"), [
    ("r", ["m:1: references[0]: is a string, expected an object"]),
    (None, ["m:1: references[0]: is null, expected an object"]),
    ({"bbox_xyxy_normalized": BOX},
     ["m:1: references[0].timestamp_seconds: missing required field (expected a number >= 0)"]),
    ({"timestamp_seconds": -1, "bbox_xyxy_normalized": BOX},
     ["m:1: references[0].timestamp_seconds: is -1, expected a finite number >= 0"]),
    ({"timestamp_seconds": "1", "bbox_xyxy_normalized": BOX},
     ["m:1: references[0].timestamp_seconds: is '1', expected a finite number >= 0"]),
    ({"timestamp_seconds": 0.5, "frame_index": -1, "bbox_xyxy_normalized": BOX},
     ["m:1: references[0].frame_index: is -1, expected an integer >= 0 (or absent)"]),
    ({"timestamp_seconds": 0.5, "frame_index": 1.0, "bbox_xyxy_normalized": BOX},
     ["m:1: references[0].frame_index: is 1.0, expected an integer >= 0 (or absent)"]),
    ({"timestamp_seconds": 0.5, "frame_index": True, "bbox_xyxy_normalized": BOX},
     ["m:1: references[0].frame_index: is True, expected an integer >= 0 (or absent)"]),
    ({"timestamp_seconds": 0.5},
     ["m:1: references[0].bbox_xyxy_normalized: missing required field (expected [x0, y0, x1, y1] in [0, 1])"]),
    ({"timestamp_seconds": 0.5, "bbox_xyxy_normalized": "b"},
     ["m:1: references[0].bbox_xyxy_normalized: is 'b', expected a list of 4 numbers [x0, y0, x1, y1]"]),
    ({"timestamp_seconds": 0.5, "bbox_xyxy_normalized": [0, 0, 1.5, 1]},
     ["m:1: references[0].bbox_xyxy_normalized: is [0, 0, 1.5, 1]: coordinates outside [0, 1], "
      "expected normalised coordinates"]),
    ({"timestamp_seconds": 0.5, "bbox_xyxy_normalized": [0, 0.5, 1, 0.5]},
     ["m:1: references[0].bbox_xyxy_normalized: is [0, 0.5, 1, 0.5]: zero or negative area, "
      "expected x1 > x0 and y1 > y0"]),
    ({"timestamp_seconds": 0.5, "bbox_xyxy_normalized": [0.5, 0, 0.5, 1]},
     ["m:1: references[0].bbox_xyxy_normalized: is [0.5, 0, 0.5, 1]: zero or negative area, "
      "expected x1 > x0 and y1 > y0"]),
])
def test_bad_reference_problems(ref, problems):
    """Each reference fault gives exactly its own problem text."""
    assert _ref_problems(ref) == problems


@pytest.mark.parametrize("ref", [
    {"timestamp_seconds": 0, "bbox_xyxy_normalized": [0, 0, 1, 1]},
    {"timestamp_seconds": 0.0, "frame_index": 0, "bbox_xyxy_normalized": [0, 0, 1, 1]},
    {"timestamp_seconds": 1, "frame_index": None, "bbox_xyxy_normalized": [0, 0, 1e-9, 1e-9]},
])
def test_reference_lower_bounds_are_inclusive(ref):
    """Timestamp 0, frame 0 and a box touching the image edges are all valid."""
    assert _ref_problems(ref) == []


def test_show_cuts_long_values_at_240_characters():
    """A quoted value keeps up to 240 characters whole; a longer one keeps its first 200 and its length."""
    assert _show("a" * 238) == "'" + "a" * 238 + "'"  # repr: 240 characters
    assert _show("a" * 239) == "'" + "a" * 199 + "... (241 characters)"


def test_control_characters_are_escaped_in_problems():
    """Control characters and lone surrogates are printed as Python escapes: one line, printable."""
    assert _printable("a\x00b\nc\x1fd\x7fe\ud800f") == "a\\x00b\\nc\\x1fd\\x7fe\\ud800f"
    assert str(Problem("m", 3, "scene", "is 'x\ny'")) == "m:3: scene: is 'x\\ny'"
    assert str(Problem("m", None, "<file>", "bad")) == "m: <file>: bad"


def test_manifest_error_lists_every_problem_on_its_own_line():
    err = ManifestError([Problem("m", 1, "a", "x"), Problem("m", None, "<file>", "y")])
    assert str(err) == "2 problem(s) in the dataset manifest:\n  m:1: a: x\n  m: <file>: y"


def test_rows_with_problems_counts_only_that_files_numbered_lines():
    problems = [Problem("a", 1, "f", "x"), Problem("a", None, "<file>", "y"), Problem("b", 2, "f", "z"),
                Problem("a", 4, "f", "w")]
    assert rows_with_problems(problems, Path("a")) == {1, 4}
    assert rows_with_problems(problems, "b") == {2}


# --- file system limits and video paths ---------------------------------------------------------------------


def test_name_limits_fall_back_to_posix_values(tmp_path):
    """Where the system cannot say (here: no such root), 255-byte names and 4096-byte paths are assumed."""
    assert _name_limits(tmp_path / "missing") == (255, 4096)


def test_name_limits_ask_the_file_system(monkeypatch, tmp_path):
    """The limits are the root's own NAME_MAX and PATH_MAX, in that order."""
    asked = {"PC_NAME_MAX": 100, "PC_PATH_MAX": 1000}

    def pathconf(path, name):
        if name not in asked:
            raise ValueError(f"unrecognized configuration name {name!r}")
        return asked[name]

    monkeypatch.setattr(os, "pathconf", pathconf)
    assert _name_limits(tmp_path) == (100, 1000)


@pytest.mark.parametrize(("video", "why"), [
    ("/v.mp4", "'/v.mp4' is an absolute path, expected a path relative to the dataset root"),
    ("a\\b.mp4", "'a\\\\b.mp4' is not a POSIX relative path, expected e.g. 'videos/synthetic/syn_001.mp4'"),
    ("C:v.mp4", "'C:v.mp4' is not a POSIX relative path, expected e.g. 'videos/synthetic/syn_001.mp4'"),
    ("a/../b.mp4", "'a/../b.mp4' contains '..', expected a path inside the dataset root"),
])
def test_video_path_refusals(tmp_path, video, why):
    assert video_path_problem(tmp_path, video) == why


def test_name_and_path_length_limits_are_inclusive(monkeypatch, tmp_path):
    """A component exactly NAME_MAX bytes long, and a path exactly PATH_MAX bytes long, are allowed."""
    full = len(os.fsencode(str(tmp_path.resolve() / "abcd")))
    monkeypatch.setattr(mf, "_name_limits", lambda root: (4, full))
    assert video_path_problem(tmp_path, "abcd") is None
    assert video_path_problem(tmp_path, "abcde") == (
        "'abcde' has a component of 5 bytes, longer than the file system allows (4)")
    assert video_path_problem(tmp_path, "a/bcd") == (
        f"'a/bcd' makes a path of {full + 1} bytes, longer than the file system allows ({full})")


@pytest.mark.parametrize(("err", "said"), [
    (OSError(errno.ELOOP, "Too many levels of symbolic links"), "OSError: Too many levels of symbolic links"),
    (RuntimeError("Symlink loop from 'x'"), "RuntimeError: Symlink loop from 'x'"),
])
def test_unresolvable_video_path_names_the_error(monkeypatch, tmp_path, err, said):
    """A path that cannot be resolved gives the error's class and its plain reason (no errno prefix)."""
    resolve = Path.resolve

    def failing(self, *args, **kwargs):
        if "loop" in self.parts:
            raise err
        return resolve(self, *args, **kwargs)

    monkeypatch.setattr(Path, "resolve", failing)
    assert video_path_problem(tmp_path, "loop/v.mp4") == f"'loop/v.mp4' cannot be resolved ({said})"


# --- reading the file ---------------------------------------------------------------------------------------


def _read(tmp_path: Path, text: str | bytes) -> tuple[list, list[str]]:
    path = tmp_path / "metadata.jsonl"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    problems: list[Problem] = []
    tasks = read_manifest(path, tmp_path, problems)
    return [t.task_id for t in tasks], [str(p) for p in problems]


def _good(task_id: str) -> str:
    return json.dumps(official_row(task_id, VIDEO))


def test_undecodable_manifest_is_one_file_problem(tmp_path):
    path = tmp_path / "metadata.jsonl"
    path.write_bytes(b"\xff" + _good("a").encode())
    problems: list[Problem] = []
    assert read_manifest(path, tmp_path, problems) == []
    assert problems == [Problem(str(path), None, "<file>", "cannot read manifest: 'utf-8' codec can't decode "
                                                           "byte 0xff in position 0: invalid start byte")]


def test_manifest_is_read_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    """The manifest is UTF-8 by definition: a system whose default text encoding is Latin-1 reads the same text."""
    path = tmp_path / "metadata.jsonl"
    path.write_bytes(json.dumps(official_row("a", VIDEO, scene="caf\u00e9"), ensure_ascii=False).encode("utf-8"))
    monkeypatch.setattr(io, "text_encoding", lambda encoding, stacklevel=2: encoding or "latin-1")
    problems: list[Problem] = []
    (task,) = read_manifest(path, tmp_path, problems)
    assert task.scene == "caf\u00e9" and problems == []


def test_empty_manifest_has_no_rows(tmp_path):
    path = tmp_path / "metadata.jsonl"
    assert _read(tmp_path, "\n \n") == ([], [f"{path}: <file>: manifest has no rows"])


def test_a_manifest_of_bad_rows_is_not_also_empty(tmp_path):
    """"no rows" is said only when nothing else was: a file of bad rows lists just those rows."""
    path = tmp_path / "metadata.jsonl"
    assert _read(tmp_path, "[1]\n") == ([], [f"{path}:1: <row>: is a list, expected a JSON object"])


@pytest.mark.parametrize(("bad", "problem"), [
    ("", None),
    ("   ", None),
    ("[1]", "<row>: is a list, expected a JSON object"),
    ("null", "<row>: is null, expected a JSON object"),
    ("[" * 100_000, "<json>: invalid JSON (nested too deeply to parse), expected a flat object of fields"),
    ("{", "<json>: invalid JSON (Expecting property name enclosed in double quotes at column 2)"),
])
def test_reading_goes_on_after_a_blank_or_bad_line(tmp_path, bad, problem):
    """A blank or bad line never stops the reading: the rows after it still load, with their line numbers."""
    path = tmp_path / "metadata.jsonl"
    ids, problems = _read(tmp_path, f"{_good('a')}\n{bad}\n{_good('b')}\n")
    assert ids == ["a", "b"]
    assert problems == ([] if problem is None else [f"{path}:2: {problem}"])


def test_too_long_integer_names_the_interpreters_limit(tmp_path, monkeypatch):
    """An integer longer than Python's digit limit is one problem naming that limit; reading goes on."""
    path = tmp_path / "metadata.jsonl"
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(700)
    try:
        ids, problems = _read(tmp_path, f"{'9' * 800}\n{_good('b')}\n")
    finally:
        sys.set_int_max_str_digits(old)
    assert ids == ["b"]
    assert problems == [f"{path}:1: <json>: invalid JSON (an integer of more than 700 digits), "
                        "expected numbers of a sensible size"]


def test_too_long_integer_without_a_known_limit_says_4300(tmp_path, monkeypatch):
    """On a Python without ``sys.get_int_max_str_digits`` the default limit, 4300, is named."""
    path = tmp_path / "metadata.jsonl"
    monkeypatch.delattr(sys, "get_int_max_str_digits")
    ids, problems = _read(tmp_path, f"{'9' * 5000}\n")
    assert problems == [f"{path}:1: <json>: invalid JSON (an integer of more than 4300 digits), "
                        "expected numbers of a sensible size"]


def test_windows_line_ends_do_not_shift_error_columns(tmp_path):
    """A CRLF file reports the same JSON error column as the same text with LF line ends."""
    path = tmp_path / "metadata.jsonl"
    assert _read(tmp_path, "[1\r\n")[1] == [f"{path}:1: <json>: invalid JSON (Expecting ',' delimiter at column 3)"]


def test_unsafe_video_path_skips_the_row(tmp_path):
    path = tmp_path / "metadata.jsonl"
    row = json.dumps(official_row("a", "/abs.mp4"))
    assert _read(tmp_path, row + "\n") == (
        [], [f"{path}:1: video: '/abs.mp4' is an absolute path, expected a path relative to the dataset root"])


# --- whole manifests ----------------------------------------------------------------------------------------


def test_missing_manifest_under_an_existing_root(tmp_path):
    assert validate_manifest(tmp_path) == ([], [Problem(str(tmp_path / "metadata.jsonl"), None, "<file>",
                                                        "manifest not found")])


def test_missing_dataset_root_is_said(tmp_path):
    root = tmp_path / "nowhere"
    assert validate_manifest(root, "m.jsonl") == ([], [Problem(str(root / "m.jsonl"), None, "<file>",
                                                               "manifest not found (dataset root does not exist)")])


def test_load_without_video_checks_does_not_open_videos(tmp_path):
    """``check_videos=False`` loads rows whose video file is not there (yet)."""
    write_manifest(tmp_path, [official_row("a", VIDEO)])
    assert [t.task_id for t in load_manifest(tmp_path, check_videos=False)] == ["a"]


def _tasks(tmp_path: Path, rows: list[dict]) -> list:
    """The rows read (and checked one by one), before any check across rows or of the videos."""
    problems: list[Problem] = []
    tasks = read_manifest(write_manifest(tmp_path, rows), tmp_path, problems)
    assert problems == []
    return tasks


def test_duplicate_task_id_names_the_first_line(tmp_path):
    tasks = _tasks(tmp_path, [official_row("a", VIDEO), official_row("a", VIDEO)])
    problems: list[Problem] = []
    _check_across_rows("m", tasks, problems)
    assert [str(p) for p in problems] == ["m:2: task_id: duplicate 'a' (first at line 1)"]


def test_duplicate_of_a_task_without_a_line_says_line_0(tmp_path):
    tasks = _tasks(tmp_path, [official_row("a", VIDEO), official_row("a", VIDEO)])
    tasks = [dataclasses.replace(tasks[0], line=None), tasks[1]]
    problems: list[Problem] = []
    _check_across_rows("m", tasks, problems)
    assert [str(p) for p in problems] == ["m:2: task_id: duplicate 'a' (first at line 0)"]


def test_one_source_per_video(tmp_path):
    tasks = _tasks(tmp_path, [official_row("a", VIDEO), official_row("b", VIDEO, source="real")])
    problems: list[Problem] = []
    _check_across_rows("m", tasks, problems)
    assert [str(p) for p in problems] == [
        f"m:2: type: is 'real' but line 1 gives 'synthetic' for the same video '{VIDEO}'"
    ]


def test_every_missing_video_is_reported(tmp_path):
    """A video that cannot be opened is reported for each of its rows, and the next video is still checked."""
    tasks = _tasks(tmp_path, [official_row("a", "v1.mp4"), official_row("b", "v2.mp4")])
    problems: list[Problem] = []
    _check_videos("m", tasks, problems)
    assert [str(p) for p in problems] == [
        f"m:1: video: {tmp_path / 'v1.mp4'}: video file not found",
        f"m:2: video: {tmp_path / 'v2.mp4'}: video file not found",
    ]


def test_a_reference_at_the_videos_exact_end_is_allowed(tmp_path):
    """The context video lasts 2 s (32 frames at 16 fps): a reference at 2 s is in, 2.5 s is past its end."""
    write_context_video(tmp_path / VIDEO, 0)
    ref = lambda ts: [{"timestamp_seconds": ts, "bbox_xyxy_normalized": [0, 0, 1, 1]}]  # noqa: E731
    write_manifest(tmp_path, [official_row("a", VIDEO, references=ref(2.0)),
                              official_row("b", VIDEO, references=ref(2.5))])
    _, problems = validate_manifest(tmp_path)
    assert [str(p) for p in problems] == [
        f"{tmp_path / 'metadata.jsonl'}:2: references[0].timestamp_seconds: is 2.5 s, past the end of {VIDEO} (2.000 s)"
    ]
