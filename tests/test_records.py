"""The task record: schema, versions, the writer's durability and the reader's repairs and refusals."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cmbench.runs import records as records_module
from cmbench.runs.records import (
    SCHEMA_VERSION,
    RecordsError,
    RecordsWriteError,
    RecordWriter,
    TaskRecord,
    latest_records,
    metric_name,
    quality_fields,
    read_all_records,
    read_records_file,
    read_task_records,
    records_path,
    scored_fields,
)
from cmbench.scoring.pipeline import TaskScore


def ok(task_id: str, score: float = 0.5, **extra) -> dict:
    return {"task_id": task_id, "status": "ok", "score": score, **extra}


def test_record_round_trips_and_names_its_version():
    record = TaskRecord(task_id="t1", status="ok", context_id="videos/a", source="real", task_type="revisit",
                        label="x", seed=3, score=0.25, pr=0.5, metric="DINO")
    row = record.to_json()
    assert row["schema_version"] == SCHEMA_VERSION == 6
    assert TaskRecord.from_json(row) == record
    assert set(row) == {f for f in records_module.FIELD_NAMES}


def test_version_0_records_are_upgraded_and_unknown_versions_refused():
    old_score = {"status": "ok", "task_id": "t1", "source": "synthetic", "task_type": "reappear", "score": 0.7,
                 "scorer": "light", "scorer_config_hash": "abc", "n_frames": 8}
    record = TaskRecord.from_json(old_score)
    assert record.scorer_hash == "abc" and record.seed is None and record.kind == "run"
    assert TaskRecord.from_json({**ok("t"), "prepared_for": "x"}).task_id == "t"  # v0 extras are dropped
    with pytest.raises(ValueError, match="not in the task record schema"):
        TaskRecord.from_json({**ok("t"), "schema_version": 1, "prepared_for": "x"})
    with pytest.raises(ValueError, match="newer than this CMBench reads"):
        TaskRecord.from_json({**ok("t"), "schema_version": SCHEMA_VERSION + 1})


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("score", 3.4, "score: is 3.4, expected a similarity in [-1, 1]"),
        ("pr", -0.1, "pr: is -0.1, expected a fraction in [0, 1]"),
        ("detection_rate", 1.5, "detection_rate: is 1.5"),
        ("continuation_seconds", -2.0, "continuation_seconds: is -2.0, expected a finite number >= 0"),
        ("status", "done", "status: is 'done', expected one of ok, failed"),
        ("kind", "rerun", "kind: is 'rerun', expected one of run, score"),
        ("task_id", "", "task_id: is '', expected a non-empty string"),
        ("score", -1.5, "score: is -1.5, expected a similarity in [-1, 1]"),
        ("score", 1.5, "score: is 1.5, expected a similarity in [-1, 1]"),
        ("score", "0.5", "score: is '0.5', expected a similarity in [-1, 1]"),  # a number, not its text
        ("score", True, "score: is True, expected a similarity in [-1, 1]"),  # nor a bool
    ],
)
def test_impossible_values_are_named(field, value, message):
    with pytest.raises(ValueError) as err:
        TaskRecord.from_json({**ok("t"), field: value})
    assert message in str(err.value)


@pytest.mark.parametrize("score", [-1.0, 0.0, 1.0])
def test_a_score_at_either_end_of_the_cosine_range_is_kept(score):
    assert TaskRecord.from_json(ok("t", score)).score == score


def test_unknown_and_missing_fields_are_named():
    with pytest.raises(ValueError) as err:
        TaskRecord.from_json({**ok("t"), "schema_version": 1, "zeta": 1, "alpha": 2})
    assert str(err.value) == f"field(s) alpha, zeta not in the task record schema (version {SCHEMA_VERSION})"
    with pytest.raises(ValueError) as err:
        TaskRecord.from_json({"task_id": "t", "schema_version": SCHEMA_VERSION})
    assert str(err.value) == "status: missing required field"


@pytest.mark.parametrize(
    "field, value, where",
    [
        ("detection_threshold", float("nan"), "detection_threshold"),
        ("detection_threshold", float("inf"), "detection_threshold"),
        ("similarities", [0.1, None, float("nan")], "similarities[2]"),
        ("similarities", np.array([0.1, np.inf]), "similarities[1]"),
        ("method_config", {"gamma": float("nan")}, "method_config.gamma"),
        ("method_config", {"steps": [1.0, {"tau": float("-inf")}]}, "method_config.steps[1].tau"),
    ],
)
def test_a_nan_or_infinity_anywhere_in_a_record_is_named_by_its_place(field, value, where):
    with pytest.raises(ValueError) as err:
        TaskRecord(task_id="t", status="ok", **{field: value})
    assert str(err.value) == f"{where}: is not a finite number (records are strict JSON: no NaN or infinity)"


def test_paths_and_numpy_values_are_written_as_plain_json():
    row = TaskRecord(task_id="t", status="ok", video=Path("videos/t.mp4"), n_frames=np.int64(4),
                     similarities=np.array([0.5, 0.25])).to_json()
    assert row["video"] == "videos/t.mp4" and row["n_frames"] == 4 and type(row["n_frames"]) is int
    assert row["similarities"] == [0.5, 0.25]


QUALITY = {"subject_consistency": 0.0, "background_consistency": 1.0, "temporal_flickering": 0.97,
           "motion_smoothness": 0.99, "aesthetic_quality": 1.02, "imaging_quality": 1.07}


def test_quality_metrics_in_their_ranges_are_kept():
    """The consistency, flickering and smoothness metrics lie in [0, 1] by their formula, ends included;
    aesthetic (LAION / 10) and imaging (MUSIQ / 100) quality are scaled scores with no such bound."""
    row = {**ok("t"), **QUALITY, "quality_absent": {"subject_consistency_light": "too few frames"}, "quality_hash": "q"}
    record = TaskRecord.from_json(row)
    assert {name: getattr(record, name) for name in QUALITY} == QUALITY
    assert record.quality_absent == {"subject_consistency_light": "too few frames"} and record.quality_hash == "q"


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"subject_consistency": 1.01}, "subject_consistency: is 1.01, expected a value in [0, 1]"),
        ({"background_consistency_light": -0.01}, "background_consistency_light: is -0.01, expected a value in [0, 1]"),
        ({"motion_smoothness": 1.5}, "motion_smoothness: is 1.5, expected a value in [0, 1]"),  # after unset metrics
        ({"imaging_quality": "0.5"}, "imaging_quality: is '0.5', expected a finite number"),
        ({"aesthetic_quality": True}, "aesthetic_quality: is True, expected a finite number"),
        ({"quality_absent": ["aesthetic_quality"]},
         "quality_absent: is ['aesthetic_quality'], expected a mapping metric -> reason"),
        ({"quality_absent": {"aesthetic_quality": 404}},
         "quality_absent: is {'aesthetic_quality': 404}, expected a mapping metric -> reason"),
        ({"aesthetic_quality": 0.6, "imaging_quality": 0.5,
          "quality_absent": {"imaging_quality": "no weights", "aesthetic_quality": "no weights"}},
         "quality_absent: names aesthetic_quality, imaging_quality, which have values"),
    ],
)
def test_impossible_quality_fields_are_named(extra, message):
    with pytest.raises(ValueError) as err:
        TaskRecord.from_json({**ok("t"), **extra})
    assert str(err.value) == message


def _task_score(**extra) -> TaskScore:
    return TaskScore(task_id="t", source="real", task_type="revisit", score=0.5, similarities=[0.5], detection_rate=1.0,
                     boxes=[[0, 0, 1, 1]], detection_scores=[0.9], detection_threshold=0.3,
                     reference_mask_fallback=[False], n_frames=1, scorer="light", scorer_config_hash="h", **extra)


def test_quality_metrics_reach_the_record_with_what_did_not_run_and_the_config_hash():
    ran = _task_score(quality={"subject_consistency": np.float32(0.75)},
                      quality_absent={"aesthetic_quality": "no weights"}, quality_hash="q1")
    fields = quality_fields(ran)
    assert fields == {"subject_consistency": 0.75, "quality_absent": {"aesthetic_quality": "no weights"},
                      "quality_hash": "q1"}
    assert type(fields["subject_consistency"]) is float
    assert quality_fields(_task_score(quality={"imaging_quality": 0.5}, quality_hash="q2")) == {
        "imaging_quality": 0.5, "quality_absent": {}, "quality_hash": "q2"}
    assert quality_fields(_task_score(quality_absent={"motion_smoothness": "too few frames"}, quality_hash="q3")) == {
        "quality_absent": {"motion_smoothness": "too few frames"}, "quality_hash": "q3"}
    assert quality_fields(_task_score()) == {}  # no quality metric selected: no quality field at all
    record = TaskRecord(task_id="t", status="ok", **scored_fields(ran))
    assert record.subject_consistency == 0.75 and record.aesthetic_quality is None
    assert record.quality_absent == {"aesthetic_quality": "no weights"} and record.quality_hash == "q1"


def test_a_scorer_result_without_the_optional_fields_gives_them_empty():
    """A result with only :class:`TaskScore`'s required fields (a plug-in scorer's own type) scores a record
    with no per-reference or quality fields, as ``scored_fields`` promises by reading them with defaults."""
    bare = SimpleNamespace(score=0.5, detection_rate=1.0, similarities=[0.5], boxes=[[0, 0, 1, 1]],
                           detection_scores=[0.9], detection_threshold=0.3, reference_mask_fallback=[False],
                           n_frames=1, scorer="light", scorer_config_hash="h")
    fields = scored_fields(bare)
    optional = ("reference_scores", "reference_best_frames", "reference_aggregation", "reference_aggregates",
                "scorer_models_hash")
    assert {name: fields[name] for name in optional} == dict.fromkeys(optional)
    assert "quality_absent" not in fields and "quality_hash" not in fields
    assert quality_fields(SimpleNamespace(quality={"imaging_quality": 0.5})) == {
        "imaging_quality": 0.5, "quality_absent": {}, "quality_hash": None}


def test_metric_is_dino_only_for_a_dinov2_embedder():
    assert metric_name({"name": "owl_sam_dino", "embedder": {"backend": "dinov2"}}) == "DINO"
    assert metric_name({"name": "light", "embedder": {"backend": "appearance"}}) == "light"
    assert metric_name({"name": "light"}) == "light"  # no embedder
    assert metric_name({"embedder": {"backend": "appearance"}}) == "score"  # a scorer without a name


def test_each_references_best_the_aggregation_and_the_models_hash_round_trip(tmp_path):
    score = TaskScore(task_id="t", source="real", task_type="revisit", score=0.6,
                      similarities=[0.2, 0.8, None], detection_rate=2 / 3, boxes=[[0, 0, 0.5, 0.5], [0, 0, 1, 1], None],
                      detection_scores=[0.4, 0.9, 0.1], detection_threshold=0.3, reference_mask_fallback=[False, True],
                      n_frames=3, scorer="owl_sam_dino", scorer_config_hash="h", reference_scores=[0.8, 0.4],
                      reference_best_frames=[1, 0], reference_aggregation="mean", scorer_models_hash="0123456789ab")
    written = RecordWriter(tmp_path / "records.jsonl").write(TaskRecord(task_id="t", status="ok", **scored_fields(score)))
    (back,) = read_task_records(tmp_path)
    assert back == written
    assert back.reference_scores == [0.8, 0.4] and back.reference_best_frames == [1, 0]
    assert back.reference_aggregation == "mean" and back.scorer_models_hash == "0123456789ab"
    assert back.reference_aggregates == pytest.approx({"mean": 0.6, "max": 0.8})  # both, whichever scored
    assert back.best_frame == 1  # the frame closest to any reference, the per-reference frames beside it


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"reference_aggregation": "median"}, "reference_aggregation: is 'median', expected one of mean, max"),
        ({"reference_aggregates": {"mean": 0.5}}, "reference_aggregates: is {'mean': 0.5}, expected"),
        ({"reference_aggregates": {"mean": 0.5, "max": 1.5}},
         "reference_aggregates.max: is 1.5, expected a similarity in [-1, 1]"),
        ({"reference_scores": [0.1, 0.2], "reference_best_frames": [0]},
         "reference_best_frames: has 1 entries, expected one per reference (2 reference_scores)"),
        ({"n_frames": 4, "reference_best_frames": [None, 4]},
         "reference_best_frames: holds 4, expected a frame index >= 0 below n_frames=4 or null"),
        ({"reference_best_frames": [-1]}, "reference_best_frames: holds -1, expected a frame index >= 0 or null"),
        ({"reference_best_frames": 3}, "reference_best_frames: is 3, expected a list of frame indices"),
        ({"reference_best_frames": [True]}, "reference_best_frames: holds True, expected a frame index >= 0 or null"),
        ({"reference_aggregates": {"mean": -1.5, "max": 0.5}},
         "reference_aggregates.mean: is -1.5, expected a similarity in [-1, 1]"),
    ],
)
def test_impossible_reference_fields_are_named(extra, message):
    with pytest.raises(ValueError) as err:
        TaskRecord.from_json({**ok("t"), **extra})
    assert message in str(err.value)


def test_reference_aggregates_at_either_end_of_the_cosine_range_are_kept():
    record = TaskRecord.from_json({**ok("t"), "reference_aggregates": {"mean": -1.0, "max": 1.0}})
    assert record.reference_aggregates == {"mean": -1.0, "max": 1.0}


def test_version_3_records_read_without_a_calibration_pr_and_it_is_a_fraction():
    record = TaskRecord.from_json({**ok("t"), "schema_version": 3, "target_pr": 0.8})
    assert record.schema_version == 6 and record.target_pr == 0.8 and record.calibration_pr is None
    assert TaskRecord.from_json({**ok("t"), "target_pr": 0.85, "calibration_pr": 0.8512}).calibration_pr == 0.8512
    with pytest.raises(ValueError, match="calibration_pr"):
        TaskRecord.from_json({**ok("t"), "calibration_pr": 1.5})


def test_version_2_records_read_with_the_reference_fields_empty():
    record = TaskRecord.from_json({**ok("t"), "schema_version": 2, "reference_scores": [0.5], "code_hash": "c"})
    assert record.schema_version == SCHEMA_VERSION and record.reference_scores == [0.5] and record.code_hash == "c"
    assert record.reference_best_frames is None and record.reference_aggregation is None
    assert record.scorer_models_hash is None


def test_scored_fields_carry_the_best_frame_and_its_box():
    score = TaskScore(task_id="t", source="real", task_type="reappear", score=0.9,
                      similarities=[0.2, None, 0.9, 0.5], detection_rate=0.75,
                      boxes=[[0, 0, 0.5, 0.5], None, [0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]],
                      detection_scores=[0.4, 0.1, 0.8, 0.6], detection_threshold=0.3,
                      reference_mask_fallback=[False], n_frames=4, scorer="light", scorer_config_hash="h")
    fields = scored_fields(score)
    assert fields["best_frame"] == 2 and fields["best_box"] == [0.1, 0.2, 0.3, 0.4]
    assert fields["scorer_hash"] == "h" and fields["reference_scores"] is None
    assert fields["reference_best_frames"] is None and fields["scorer_models_hash"] is None
    never = scored_fields(TaskScore(**{**score.to_json(), "score": 0.0, "similarities": [None] * 4,
                                       "boxes": [None] * 4, "detection_rate": 0.0}))
    assert never["best_frame"] is None and never["best_box"] is None
    assert TaskRecord(task_id="t", status="ok", **fields).best_frame == 2


def test_torn_last_line_is_skipped_by_readers_and_cut_by_the_next_writer(tmp_path):
    path = tmp_path / "records.jsonl"
    whole = json.dumps(ok("a")) + "\n" + json.dumps(ok("b")) + "\n"
    path.write_text(whole + json.dumps(ok("c"))[:17])  # killed mid-write
    assert [r["task_id"] for r in read_all_records(tmp_path)] == ["a", "b"]  # readers are not wedged
    assert path.read_text().count("\n") == 2  # ... and do not touch the file
    RecordWriter(path)
    assert path.read_text() == whole  # the torn line is cut, every whole line kept
    RecordWriter(path).write(ok("d"))
    assert [r["task_id"] for r in read_all_records(tmp_path)] == ["a", "b", "d"]
    assert all(json.loads(line) for line in path.read_text().splitlines())


@pytest.mark.parametrize("content", [b"", b'{"task_id": "a", "sta'])
def test_an_empty_file_or_a_lone_torn_line_holds_no_record(tmp_path, content):
    path = tmp_path / "records.jsonl"
    path.write_bytes(content)
    assert read_records_file(path) == []
    RecordWriter(path).write(ok("a"))  # a writer opens it, stamps and appends
    assert [(r.task_id, n) for r, n in read_records_file(path)] == [("a", 1)]


def test_blank_lines_are_skipped_and_lines_keep_their_numbers(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(ok("a")) + "\n\n  \n" + json.dumps(ok("b")) + "\n")
    assert [(r.task_id, n) for r, n in read_records_file(path)] == [("a", 1), ("b", 4)]


@pytest.mark.parametrize(
    "line, message",
    [
        (b"{garbage", "invalid JSON (Expecting property name enclosed in double quotes)"),
        (b'{"task_id": "\xff", "status": "ok"}', "invalid JSON (not UTF-8)"),
        (b"[" * 10**5 + b"]" * 10**5, "invalid JSON (nested too deeply)"),
        (b'{"task_id": "t", "status": "ok", "seed": 1' + b"0" * 5000 + b"}", "invalid JSON (a number too long to read)"),
        (b"[1, 2]", "a record must be a JSON object, got list"),
    ],
)
def test_an_unreadable_line_is_named_by_file_line_and_why(tmp_path, line, message):
    path = tmp_path / "records.jsonl"
    path.write_bytes(json.dumps(ok("a")).encode() + b"\n" + line + b"\n")
    with pytest.raises(RecordsError) as err:
        read_records_file(path)
    assert str(err.value) == f"{path}:2: {message}"


def test_a_garbage_line_in_the_middle_stops_with_file_and_line(tmp_path):
    (tmp_path / "records.shard-1-of-2.jsonl").write_text(
        json.dumps(ok("a")) + "\n" + "{garbage\n" + json.dumps(ok("b")) + "\n")
    with pytest.raises(RecordsError, match=r"records.shard-1-of-2.jsonl:2: invalid JSON"):
        read_all_records(tmp_path)
    with pytest.raises(RecordsError, match=r":2: invalid JSON"):
        RecordWriter(tmp_path / "records.shard-1-of-2.jsonl")


def test_an_impossible_record_in_a_file_is_named(tmp_path):
    (tmp_path / "records.jsonl").write_text(json.dumps(ok("a")) + "\n" + json.dumps(ok("b", score=11.7)) + "\n")
    with pytest.raises(RecordsError, match=r"records.jsonl:2: score: is 11.7, expected a similarity in \[-1, 1\]"):
        read_all_records(tmp_path)


def test_records_written_before_stamps_existed_come_first(tmp_path):
    (tmp_path / "records.jsonl").write_text(json.dumps(ok("a", 0.1, recorded_ns=1)) + "\n")  # any stamp, even 1 ns
    (tmp_path / "records.shard-0-of-2.jsonl").write_text(json.dumps(ok("a", 0.2)) + "\n")  # no stamp: older
    records = read_task_records(tmp_path)
    assert [r.score for r in records] == [0.2, 0.1]
    assert latest_records(records)["a"].score == 0.1


def test_the_last_record_of_each_task_wins():
    first, other, last = TaskRecord("a", "failed"), TaskRecord("b", "ok"), TaskRecord("a", "ok", score=0.5)
    assert latest_records([first, other, last]) == {"a": last, "b": other}


def test_each_shard_appends_to_its_own_file(tmp_path):
    assert records_path(tmp_path) == tmp_path / "records.jsonl"
    assert records_path(str(tmp_path), 3, 2) == tmp_path / "records.shard-2-of-3.jsonl"
    assert records_path(tmp_path, 2) == tmp_path / "records.shard-0-of-2.jsonl"


def test_records_are_ordered_by_time_across_files(tmp_path):
    newer = RecordWriter(tmp_path / "records.shard-0-of-2.jsonl")
    older = RecordWriter(tmp_path / "records.jsonl")
    older.write(ok("a", 0.1))
    newer.write(ok("a", 0.2))
    older.write(ok("b", 0.3))
    assert [(r.task_id, r.score) for r in read_task_records(tmp_path)] == [("a", 0.1), ("a", 0.2), ("b", 0.3)]
    stamps = [r.recorded_ns for r in read_task_records(tmp_path)]
    assert stamps == sorted(stamps) and len(set(stamps)) == 3


def one_record_writer(tmp_path: Path) -> tuple[Path, RecordWriter, bytes]:
    """A writer of ``records.jsonl`` holding one record, and the file's bytes then."""
    path = tmp_path / "records.jsonl"
    writer = RecordWriter(path)
    writer.write(ok("a"))
    return path, writer, path.read_bytes()


def test_a_failed_write_leaves_no_torn_line(tmp_path, monkeypatch):
    path, writer, before = one_record_writer(tmp_path)
    real_write = records_module.os.write

    def disk_full(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records_module.os, "write", disk_full)
    with pytest.raises(RecordsWriteError, match=r"cannot write .*records.jsonl: No space left on device"):
        writer.write(ok("b"))
    assert path.read_bytes() == before
    monkeypatch.undo()
    writer.write(ok("b"))
    assert [r["task_id"] for r in read_all_records(tmp_path)] == ["a", "b"]


def test_a_short_write_is_cut_back_and_named_as_a_full_disk(tmp_path, monkeypatch):
    path, writer, before = one_record_writer(tmp_path)
    real_write = records_module.os.write
    monkeypatch.setattr(records_module.os, "write", lambda fd, data: real_write(fd, data[:10]))  # no error raised
    with pytest.raises(RecordsWriteError) as err:
        writer.write(ok("b"))
    assert str(err.value) == f"cannot write {path}: short write (disk full?)"
    assert err.value.__cause__.errno == errno.ENOSPC
    assert path.read_bytes() == before


def test_a_link_at_the_records_path_is_refused_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    path = tmp_path / "records.jsonl"
    path.symlink_to(victim)
    refused = f"cannot write {path}: it is a link (records are never written through one: remove it)"
    with pytest.raises(RecordsWriteError) as err:
        RecordWriter(path)
    assert str(err.value) == refused
    path.unlink()
    writer = RecordWriter(path)
    path.symlink_to(victim)  # placed after the writer opened the folder: each write refuses it as well
    with pytest.raises(RecordsWriteError) as err:
        writer.write(ok("a"))
    assert str(err.value) == refused
    assert victim.read_text() == "precious\n"


def test_a_writer_makes_its_folders_and_a_file_others_can_read(tmp_path):
    path = tmp_path / "runs" / "r1" / "records.jsonl"
    RecordWriter(path).write(ok("a"))
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~umask
    path.write_bytes(b"")  # an existing empty file
    RecordWriter(path).write(ok("b"))
    assert [r.task_id for r, _ in read_records_file(path)] == ["b"]


def test_stamps_increase_by_one_while_the_clock_stands_still(tmp_path, monkeypatch):
    monkeypatch.setattr(records_module, "time", SimpleNamespace(time_ns=lambda: 1_000))
    path = tmp_path / "records.jsonl"
    writer = RecordWriter(path)
    assert [writer.write(ok(task)).recorded_ns for task in "abc"] == [1_000, 1_001, 1_002]
    assert RecordWriter(path).write(ok("d")).recorded_ns == 1_003  # a new writer continues after the file's newest


def test_a_record_is_one_strict_json_line_with_sorted_keys(tmp_path, monkeypatch):
    path = tmp_path / "records.jsonl"
    RecordWriter(path).write(ok("a", method_config={"beta": 1, "alpha": 2}))
    text = path.read_text()
    row = json.loads(text)
    assert text.count("\n") == 1 and text.endswith("\n")
    assert list(row) == sorted(row) and list(row["method_config"]) == ["alpha", "beta"]
    monkeypatch.setattr(records_module, "record_problem", lambda record: None)  # a NaN slips past the checks
    with pytest.raises(ValueError, match="not JSON compliant"):
        RecordWriter(path).write(ok("b", detection_threshold=float("nan")))
    assert path.read_text() == text


def test_version_1_records_read_with_the_fields_of_version_2_empty():
    record = TaskRecord.from_json({**ok("t"), "schema_version": 1, "label": "x", "config_hash": "abc"})
    assert record.schema_version == SCHEMA_VERSION and record.config_hash == "abc"
    assert record.code_hash is None and record.run_seed is None and record.attention_flops is None
    with pytest.raises(ValueError, match="attention_flops: is -1.0, expected a finite number >= 0"):
        TaskRecord(task_id="t", status="ok", attention_flops=-1.0)


@pytest.mark.parametrize("best, ok_", [(0, True), (3, True), (4, False), (-1, False)])
def test_best_frame_must_index_one_of_the_n_frames(best, ok_):
    """``best_frame`` indexes the continuation's frames: ``n_frames`` itself is one past the last."""
    row = {**ok("t"), "n_frames": 4, "best_frame": best}
    if ok_:
        assert TaskRecord.from_json(row).best_frame == best
    else:
        with pytest.raises(ValueError, match=rf"best_frame: is {best}, expected an index below n_frames=4"):
            TaskRecord.from_json(row)


def test_reference_aggregation_of_scores_of_none_and_of_an_unknown_rule():
    from cmbench.scoring.aggregation import aggregate_references

    assert aggregate_references([0.2, 0.8, 0.5], "mean") == pytest.approx(0.5)
    assert aggregate_references([0.2, 0.8, 0.5], "max") == 0.8
    assert aggregate_references([], "mean") == 0.0 and aggregate_references([], "max") == 0.0  # no reference: 0
    with pytest.raises(ValueError, match=r"^reference aggregation must be one of mean, max, got 'median'$"):
        aggregate_references([0.2], "median")
