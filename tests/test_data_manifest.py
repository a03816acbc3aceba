"""The official manifest loader: records parsed, and every fault class reported with its location."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from cmbench.data import ManifestError, load_manifest, validate_manifest
from cmbench.data.spec import check_counts, counts, load_spec
from official_fixture import build_official_layout, official_row, write_context_video, write_manifest


def test_valid_official_layout_loads_every_field(tmp_path):
    rows = build_official_layout(tmp_path)
    tasks = load_manifest(tmp_path)
    assert len(tasks) == 116
    first = tasks[0]
    assert first.task_id == rows[0]["task_id"] == "syn_001_reappear_01"
    assert first.source == "synthetic" and first.task_type == "reappear"
    assert first.video == "videos/synthetic/syn_001.mp4"
    assert first.video_path == tmp_path / "videos/synthetic/syn_001.mp4"
    assert first.context_clip_prompts == tuple(f"clip {i} of {first.video}" for i in range(6))
    assert first.queries == ("red vase", "vase", "pot")
    ref = first.references[0]
    assert ref.timestamp_seconds == 0.5 and ref.frame_index == 8
    assert ref.bbox_xyxy_normalized == (0.1, 0.2, 0.5, 0.6)
    assert first.line == 1 and first.context_id == "videos/synthetic/syn_001"
    assert counts(tasks) == {
        "videos": 58,
        "tasks": 116,
        "reappear": 77,
        "revisit": 39,
        "by_source": {
            "real": {"videos": 8, "tasks": 14, "reappear": 10, "revisit": 4},
            "synthetic": {"videos": 50, "tasks": 102, "reappear": 67, "revisit": 35},
        },
    }
    expected = load_spec("cmbench")["expected"]
    assert check_counts("m", tasks, expected) == []


def test_extension_fields_are_kept_and_round_trip(tmp_path):
    write_context_video(tmp_path / "videos/synthetic/syn_001.mp4", 0)
    row = official_row("syn_001_reappear_01", "videos/synthetic/syn_001.mp4", camera_plan=[0, 4, 8])
    row["references"][0]["note"] = "left shelf"
    write_manifest(tmp_path, [row])
    (task,) = load_manifest(tmp_path)
    assert task.extra == {"camera_plan": [0, 4, 8]}
    assert task.references[0].extra == {"note": "left shelf"}
    assert task.to_json() == row


def test_reference_frame_from_index_or_timestamp():
    from cmbench.data import Reference

    ref = Reference(timestamp_seconds=1.5, bbox_xyxy_normalized=(0, 0, 1, 1), frame_index=23)
    assert ref.frame_at(16.0) == 23
    assert ref.frame_at(8.0, native=False) == 12
    assert Reference(2.0, (0, 0, 1, 1)).frame_at(16.0) == 32


def _problems(root: Path) -> list[str]:
    _, problems = validate_manifest(root)
    return [str(p) for p in problems]


def _one(problems: list[str], *needles: str) -> str:
    hits = [p for p in problems if all(n in p for n in needles)]
    assert len(hits) == 1, f"expected one problem with {needles}, got {hits} among:\n" + "\n".join(problems)
    return hits[0]


def test_every_fault_class_is_reported_at_once(tmp_path):
    video = "videos/synthetic/syn_001.mp4"
    write_context_video(tmp_path / video, 0)  # 32 frames at 16 fps: 2 s
    outside = tmp_path.parent / f"{tmp_path.name}_outside.mp4"
    write_context_video(outside, 1)
    (tmp_path / "videos/link.mp4").symlink_to(outside)
    good = lambda i, **o: official_row(f"t{i:02d}", video, **o)  # noqa: E731
    no_label = good(3)
    del no_label["target_label"]
    rows = [
        good(1),  # line 1: fine
        "{not json",  # line 2
        no_label,  # line 3: missing field
        good(4, scene=7),  # line 4: mistyped field
        good(5, type="animated"),  # line 5: bad enum
        good(6, task_type="recall"),  # line 6: bad enum
        good(7, context_clip_prompts=[{"clip_prompt": "a"}] * 5),  # line 7: 5 prompts
        good(8, references=[{"timestamp_seconds": 0.1, "bbox_xyxy_normalized": [0.2, 0.2, 1.3, 0.5]}]),  # outside
        good(9, references=[{"timestamp_seconds": 0.1, "bbox_xyxy_normalized": [0.4, 0.2, 0.4, 0.5]}]),  # zero area
        good(1),  # line 10: duplicate of line 1
        official_row("t11", "videos/synthetic/missing.mp4"),  # line 11: video missing
        official_row("t12", "../secret.mp4"),  # line 12: escapes with ..
        official_row("t13", "/etc/passwd"),  # line 13: absolute
        official_row("t14", "videos/link.mp4"),  # line 14: symlink out of the root
        good(15, references=[{"timestamp_seconds": 9.5, "frame_index": 40, "bbox_xyxy_normalized": [0, 0, 1, 1]}]),
        good(16, references=[{"timestamp_seconds": -1, "frame_index": 1.5, "bbox_xyxy_normalized": [0, 0, 1]}]),
        good(17, target_aliases=["ok", 3]),
        "[1, 2]",  # line 18: not an object
    ]
    write_manifest(tmp_path, rows)
    problems = _problems(tmp_path)
    m = str(tmp_path / "metadata.jsonl")
    assert _one(problems, f"{m}:2:", "<json>", "invalid JSON")
    assert _one(problems, f"{m}:3:", "target_label", "missing required field")
    assert _one(problems, f"{m}:4:", "scene", "is an integer, expected a string")
    assert _one(problems, f"{m}:5:", "type", "'animated'", "expected one of 'synthetic', 'real'")
    assert _one(problems, f"{m}:6:", "task_type", "'recall'", "expected one of 'reappear', 'revisit'")
    assert _one(problems, f"{m}:7:", "context_clip_prompts", "has 5 item(s), expected exactly 6")
    assert _one(problems, f"{m}:8:", "bbox_xyxy_normalized", "outside [0, 1]")
    assert _one(problems, f"{m}:9:", "bbox_xyxy_normalized", "zero or negative area")
    assert _one(problems, f"{m}:10:", "task_id", "duplicate 't01' (first at line 1)")
    assert _one(problems, f"{m}:11:", "video", "missing.mp4: video file not found")
    assert _one(problems, f"{m}:12:", "video", "contains '..'")
    assert _one(problems, f"{m}:13:", "video", "absolute path")
    assert _one(problems, f"{m}:14:", "video", "outside the dataset root")
    assert _one(problems, f"{m}:15:", "timestamp_seconds", "9.5 s, past the end", "2.000 s")
    assert _one(problems, f"{m}:15:", "frame_index", "is 40, past the last frame", "32 frames")
    assert _one(problems, f"{m}:16:", "timestamp_seconds", "expected a finite number >= 0")
    assert _one(problems, f"{m}:16:", "frame_index", "expected an integer >= 0")
    assert _one(problems, f"{m}:16:", "bbox_xyxy_normalized", "expected a list of 4 numbers")
    assert _one(problems, f"{m}:17:", "target_aliases[1]", "expected a non-empty string")
    assert _one(problems, f"{m}:18:", "<row>", "expected a JSON object")
    assert not [p for p in problems if f"{m}:1:" in p]
    assert len(problems) == 20
    with pytest.raises(ManifestError) as err:
        load_manifest(tmp_path)
    assert len(err.value.problems) == 20 and "20 problem(s)" in str(err.value)


def test_unreadable_video_and_mixed_source(tmp_path):
    bad = tmp_path / "videos/real/real_001.mp4"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"this is not a video")
    write_context_video(tmp_path / "videos/synthetic/syn_001.mp4", 0)
    rows = [
        official_row("a", "videos/real/real_001.mp4", source="real"),
        official_row("b", "videos/synthetic/syn_001.mp4"),
        official_row("c", "videos/synthetic/syn_001.mp4", source="real"),
    ]
    write_manifest(tmp_path, rows)
    problems = _problems(tmp_path)
    assert _one(problems, ":1:", "video", "real_001.mp4", "cannot open video")
    assert _one(problems, ":3:", "type", "is 'real' but line 2 gives 'synthetic'")
    assert len(problems) == 2


def test_count_mismatch_names_each_count(tmp_path):
    write_context_video(tmp_path / "videos/synthetic/syn_001.mp4", 0)
    write_manifest(tmp_path, [official_row("a", "videos/synthetic/syn_001.mp4")])
    tasks = load_manifest(tmp_path)
    expected = load_spec("cmbench")["expected"]
    problems = [str(p) for p in check_counts("m", tasks, expected)]
    assert "m: <counts>.tasks: is 1, expected 116" in problems
    assert "m: <counts>.real.videos: is 0, expected 8" in problems
    assert "m: <counts>.synthetic.revisit: is 0, expected 35" in problems
    assert len(problems) == 12


@pytest.mark.skipif(os.name != "posix", reason="symlinks")
def test_symlink_inside_root_is_allowed(tmp_path):
    write_context_video(tmp_path / "store/a.mp4", 0)
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos/a.mp4").symlink_to(tmp_path / "store/a.mp4")
    write_manifest(tmp_path, [official_row("a", "videos/a.mp4")])
    assert len(load_manifest(tmp_path)) == 1


def test_task_ids_must_be_safe_file_names(tmp_path):
    """A task id names output files (videos/<task_id>.mp4): a path in it would write outside the run."""
    video = "videos/synthetic/syn_001.mp4"
    write_context_video(tmp_path / video, 0)
    bad = ["/abs/path/X", "../../../../X", "a/b", ".hidden", "-rf", "x y", "a" * 201]
    write_manifest(tmp_path, [official_row("ok_1.v2-b", video), *(official_row(t, video) for t in bad)])
    problems = _problems(tmp_path)
    for line, task_id in enumerate(bad, start=2):
        assert _one(problems, f":{line}:", "task_id", repr(task_id), "expected a file-name-safe id")
    assert len(problems) == len(bad)
    with pytest.raises(ManifestError, match=r"'/abs/path/X'"):
        load_manifest(tmp_path)


def _miniworld_data(root: Path, **over):
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs/data/miniworld.yaml")
    cfg.root = str(root)
    cfg.sources = {"synthetic": {"videos": 1, "reappear": 1, "revisit": 1}, "real": {"videos": 1, "reappear": 1,
                                                                                    "revisit": 0}}
    for key, value in over.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def test_adapters_come_from_the_data_config(tmp_path):
    from cmbench.data.adapter import DatasetAdapter, build_adapter
    from cmbench.errors import ConfigError
    from cmbench.miniworld.adapter import MiniWorldAdapter

    assert type(build_adapter({"root": str(tmp_path)})) is DatasetAdapter
    assert type(build_adapter(_miniworld_data(tmp_path))) is MiniWorldAdapter
    assert type(build_adapter({"root": "x", "adapter": "cmbench.miniworld.adapter:MiniWorldAdapter"})) is MiniWorldAdapter
    with pytest.raises(ConfigError, match="unknown dataset adapter 'mini'. Did you mean 'miniworld'"):
        build_adapter({"root": "x", "adapter": "mini"})
    with pytest.raises(ConfigError, match="not a subclass of cmbench.data.adapter.DatasetAdapter"):
        build_adapter({"root": "x", "adapter": "cmbench.data.task:Task"})
    with pytest.raises(ConfigError, match=r"metadata.jsonl not found: run `python -m cmbench prepare data=cmbench"):
        build_adapter({"name": "cmbench", "root": str(tmp_path)}).ensure()


def test_official_adapter_reads_videos_as_the_runtime_prepares_them(tmp_path):
    from cmbench.data.adapter import ContextShape, build_adapter
    from cmbench.data.video import read_video

    build_official_layout(tmp_path)
    task = load_manifest(tmp_path)[0]
    context = build_adapter({"root": str(tmp_path)}).context(task, ContextShape(8, 8, 8, chunk_latent_frames=2))
    decoded, fps = read_video(task.video_path)
    assert np.array_equal(context.reference_source, decoded) and context.reference_fps == fps == 16
    # 32 frames at 16 fps -> 16 at 8 fps, latent (16 + 6) // 4 = 5 -> padded to 6 (18 frames), 8x8
    assert context.frames.shape == (18, 8, 8, 3)


def test_miniworld_adapter_rebuilds_on_a_changed_knob_and_validates_its_npz_files(tmp_path, capsys):
    from cmbench.miniworld import load_context
    from cmbench.miniworld.adapter import MiniWorldAdapter

    root = tmp_path / "mw"
    MiniWorldAdapter(_miniworld_data(root)).ensure()
    first = (root / "metadata.jsonl").read_text()
    MiniWorldAdapter(_miniworld_data(root)).ensure()
    assert "rebuilding" not in capsys.readouterr().err  # same knobs: the build is reused
    MiniWorldAdapter(_miniworld_data(root, world_seed=1)).ensure()
    assert "rebuilding" in (err := capsys.readouterr().err) and "world_seed: 0 -> 1" in err
    assert (root / "metadata.jsonl").read_text() != first
    adapter = MiniWorldAdapter(_miniworld_data(root, world_seed=1, check_counts=False))
    tasks = load_manifest(root)
    assert adapter.problems(tasks) == []
    frames, fps = adapter.reference_source(tasks[0])
    assert np.array_equal(frames, load_context(tasks[0])[0]) and fps == 16  # lossless, not the mp4
    assert adapter.continuation_shape().frames == 16
    real = tasks[-1]  # the only task of its context
    (root / real.extra["miniworld"]["context_frames"]).unlink()
    (root / tasks[0].extra["miniworld"]["ground_truth"]).write_bytes(b"PK\x03\x04 truncated")
    m = str(root / "metadata.jsonl")
    problems = [str(p) for p in adapter.problems(load_manifest(root))]
    assert _one(problems, f"{m}:{real.line}:", "miniworld.context_frames", "not found")
    assert _one(problems, f"{m}:{tasks[0].line}:", "miniworld.ground_truth", "cannot read")
    assert len(problems) == 2
    path_only = [str(p) for p in adapter.problems(load_manifest(root), open_files=False)]
    assert len(path_only) == 1 and "context_frames" in path_only[0]


def _hostile_rows(video: str) -> dict[str, tuple[str, str, str]]:
    """Rows a received manifest may hold that once crashed ``validate``: name -> (line, field, reason)."""
    row = lambda **o: json.dumps(official_row("t2", video, **o))  # noqa: E731
    ref = {"timestamp_seconds": 0.5, "frame_index": 8, "bbox_xyxy_normalized": [0.1, 0.2, 0.5, 0.6]}
    return {
        "nul_in_video": (json.dumps(official_row("t2", "videos/x\x00.mp4")), "video", "NUL"),
        "5000_character_path": (json.dumps(official_row("t2", "v/" + "a" * 5000 + ".mp4")), "video", "longer than"),
        "260_character_component": (json.dumps(official_row("t2", "v/" + "b" * 260 + ".mp4")), "video", "longer than"),
        "250_character_components": (json.dumps(official_row("t2", "/".join(["c" * 250] * 20) + ".mp4")), "video",
                                     "longer than"),
        "deep_array": ("[" * 100_000 + "]" * 100_000, "<json>", "nested"),
        "deep_object": ('{"a": ' * 100_000 + "1" + "}" * 100_000, "<json>", "nested"),
        "timestamp_10_pow_400": (row().replace('"timestamp_seconds": 0.5', '"timestamp_seconds": 1' + "0" * 400),
                                 "references[0].timestamp_seconds", "expected a finite number >= 0"),
        "box_10_pow_400": (row(references=[{**ref, "bbox_xyxy_normalized": [0, 0, 10**400, 1]}]),
                           "references[0].bbox_xyxy_normalized", "expected a list of 4 numbers"),
        "5000_digit_integer": (row().replace('"frame_index": 8', '"frame_index": 1' + "0" * 5000), "<json>",
                               "digits"),
        "frame_index_10_pow_400": (row(references=[{**ref, "frame_index": 10**400}]), "references[0].frame_index",
                                   "past the last frame"),
    }


@pytest.mark.parametrize("case", list(_hostile_rows("v.mp4")))
def test_hostile_rows_are_one_line_problems_never_tracebacks(tmp_path, case):
    """NUL bytes, over-long paths, deep nesting and huge numbers: a ``file:line: field: reason`` problem of a
    readable length, and the good row beside it still loads."""
    video = "videos/synthetic/syn_001.mp4"
    write_context_video(tmp_path / video, 0)
    text, field, reason = _hostile_rows(video)[case]
    write_manifest(tmp_path, [official_row("t1", video), text])
    tasks, found = validate_manifest(tmp_path)
    problems = [str(p) for p in found]
    hit = _one(problems, f"metadata.jsonl:2: {field}: ", reason)
    assert "\n" not in hit and len(hit) < 400 + len(str(tmp_path)), hit
    assert len(problems) == 1
    assert [t.task_id for t in tasks if t.line == 1] == ["t1"]


def test_frame_index_must_be_below_the_frame_count(tmp_path):
    """The context video has 32 frames (0 .. 31): index 31 is its last frame, 32 is one past it."""
    video = "videos/synthetic/syn_001.mp4"
    write_context_video(tmp_path / video, 0)
    ref = lambda i: [{"timestamp_seconds": 1.9, "frame_index": i, "bbox_xyxy_normalized": [0, 0, 1, 1]}]  # noqa: E731
    write_manifest(tmp_path, [official_row("last", video, references=ref(31)),
                              official_row("past", video, references=ref(32))])
    problems = _problems(tmp_path)
    assert _one(problems, ":2:", "references[0].frame_index", "is 32, past the last frame", "(32 frames)")
    assert len(problems) == 1


def test_lines_are_counted_at_newlines_only(tmp_path):
    """JSON strings may hold U+2028, U+0085 (legal unescaped in JSON); a stray U+001E is not a line break
    either: the row loads whole and later rows keep the line numbers an editor shows."""
    video = "videos/synthetic/syn_001.mp4"
    write_context_video(tmp_path / video, 0)
    first = json.dumps(official_row("a", video, continue_prompt="turn\u2028back\x85now"), ensure_ascii=False)
    (tmp_path / "metadata.jsonl").write_text(f"{first}\n\x1e0\r\n{json.dumps(official_row('c', video, scene=3))}\n",
                                             encoding="utf-8")
    tasks, problems = validate_manifest(tmp_path)
    assert [(t.task_id, t.line, t.continue_prompt) for t in tasks] == [("a", 1, "turn\u2028back\x85now")]
    assert [(p.line, p.field) for p in problems] == [(2, "<json>"), (3, "scene")]


def test_the_official_datasets_continuation_has_the_configured_frame_size_and_any_length():
    from cmbench.data.adapter import ContinuationShape, DatasetAdapter

    shape = DatasetAdapter({"root": "unused", "height": 480, "width": 832}).continuation_shape()
    assert shape == ContinuationShape(None, 480, 832)  # frames, height, width: the generator picks the length
