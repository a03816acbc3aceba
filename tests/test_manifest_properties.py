"""Manifest parsing (hypothesis): any line of a received ``metadata.jsonl`` either loads as a task or gives
``file:line: field: reason`` problems on one line each, never a traceback; a row that loads has no problem."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmbench.data import validate_manifest
from official_fixture import official_row, write_context_video

VIDEO = "videos/synthetic/syn_001.mp4"
finite = st.floats(allow_nan=False, allow_infinity=False)
numbers = st.integers(-10**500, 10**500) | st.floats() | st.sampled_from([0, 0.5, 1, -1, 10**400])
json_values = st.recursive(st.none() | st.booleans() | numbers | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)
paths = st.one_of(
    st.just(VIDEO), st.text(max_size=40), st.just("v/" + "a" * 5000), st.just("/".join(["b" * 250] * 20)),
    st.builds(lambda s: f"videos/{s}.mp4", st.text(alphabet=st.characters(codec="utf-8"), max_size=10)),
    st.sampled_from(["../x.mp4", "/etc/passwd", "C:\\x.mp4", ".", "videos", "a\x00b", "\ud800"]),
)
references = st.lists(
    st.fixed_dictionaries({}, optional={"timestamp_seconds": numbers | json_values, "frame_index": numbers | json_values,
                                        "bbox_xyxy_normalized": st.lists(numbers, max_size=5) | json_values}),
    max_size=3,
) | json_values


@st.composite
def rows(draw) -> str:
    """One manifest line: a well-formed row with some fields replaced, removed or added, or any text."""
    kind = draw(st.sampled_from(["row", "row", "row", "text", "deep"]))
    if kind == "text":
        return draw(st.text(max_size=80)).replace("\n", " ").replace("\r", " ")
    if kind == "deep":
        depth = draw(st.integers(1, 200_000))
        return "[" * depth + "]" * depth
    row = official_row(draw(st.text(min_size=1, max_size=12)) if draw(st.booleans()) else "t1", draw(paths))
    for name in draw(st.lists(st.sampled_from(sorted(row)), max_size=3, unique=True)):
        if draw(st.booleans()):
            del row[name]
        else:
            row[name] = draw(json_values)
    if draw(st.booleans()):
        row["references"] = draw(references)
    if draw(st.booleans()):
        row[draw(st.text(max_size=8))] = draw(json_values)
    text = json.dumps(row)
    if draw(st.booleans()):  # an integer past Python's digit limit
        text = text.replace('"type"', '"x": ' + "9" * draw(st.integers(4000, 6000)) + ', "type"', 1)
    return text


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows(), min_size=1, max_size=4))
def test_any_manifest_loads_or_lists_file_line_problems(lines):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_context_video(root / VIDEO, 0)
        manifest = root / "metadata.jsonl"
        manifest.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
        tasks, problems = validate_manifest(root)
        bad = set()
        for problem in problems:
            text = str(problem)
            assert "\n" not in text and len(text) < 1000 + len(str(manifest)), text
            if problem.line is None:
                assert re.match(rf"^{re.escape(str(manifest))}: <file>: ", text), text
                continue
            assert 1 <= problem.line <= len(lines) and text.startswith(f"{manifest}:{problem.line}: {problem.field}: ")
            bad.add(problem.line)
        assert all(1 <= t.line <= len(lines) for t in tasks)
        for task in tasks:
            if task.line not in bad:  # a sound row: what it says is what loaded
                row = json.loads(lines[task.line - 1])
                assert task.task_id == row["task_id"] and task.video == row["video"]
                assert len(task.references) == len(row["references"]) >= 1
