"""The task record: schema, versions, the writer's durability and the reader's repairs and refusals."""

from __future__ import annotations

import errno
import json

import pytest

from cmbench.runs import records as records_module
from cmbench.runs.records import (
    SCHEMA_VERSION,
    RecordsError,
    RecordsWriteError,
    RecordWriter,
    TaskRecord,
    metric_name,
    read_all_records,
    read_task_records,
    scored_fields,
)
from cmbench.scoring.pipeline import TaskScore


def ok(task_id: str, score: float = 0.5, **extra) -> dict:
    return {"task_id": task_id, "status": "ok", "score": score, **extra}


def test_record_round_trips_and_names_its_version():
    record = TaskRecord(task_id="t1", status="ok", context_id="videos/a", source="real", task_type="revisit",
                        label="x", seed=3, score=0.25, pr=0.5, metric="DINO")
    row = record.to_json()
    assert row["schema_version"] == SCHEMA_VERSION == 5
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
        ("status", "done", "status: is 'done'"),
    ],
)
def test_impossible_values_are_named(field, value, message):
    with pytest.raises(ValueError) as err:
        TaskRecord.from_json({**ok("t"), field: value})
    assert message in str(err.value)


def test_metric_is_dino_only_for_a_dinov2_embedder():
    assert metric_name({"name": "owl_sam_dino", "embedder": {"backend": "dinov2"}}) == "DINO"
    assert metric_name({"name": "light", "embedder": {"backend": "appearance"}}) == "light"


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
    ],
)
def test_impossible_reference_fields_are_named(extra, message):
    with pytest.raises(ValueError) as err:
        TaskRecord.from_json({**ok("t"), **extra})
    assert message in str(err.value)


def test_version_3_records_read_without_a_calibration_pr_and_it_is_a_fraction():
    record = TaskRecord.from_json({**ok("t"), "schema_version": 3, "target_pr": 0.8})
    assert record.schema_version == 5 and record.target_pr == 0.8 and record.calibration_pr is None
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
    path.write_text(json.dumps(ok("a")) + "\n" + json.dumps(ok("b"))[:17])  # killed mid-write
    assert [r["task_id"] for r in read_all_records(tmp_path)] == ["a"]  # readers are not wedged
    assert path.read_text().count("\n") == 1  # ... and do not touch the file
    RecordWriter(path).write(ok("c"))
    assert [r["task_id"] for r in read_all_records(tmp_path)] == ["a", "c"]
    assert all(json.loads(line) for line in path.read_text().splitlines())


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


def test_records_are_ordered_by_time_across_files(tmp_path):
    newer = RecordWriter(tmp_path / "records.shard-0-of-2.jsonl")
    older = RecordWriter(tmp_path / "records.jsonl")
    older.write(ok("a", 0.1))
    newer.write(ok("a", 0.2))
    older.write(ok("b", 0.3))
    assert [(r.task_id, r.score) for r in read_task_records(tmp_path)] == [("a", 0.1), ("a", 0.2), ("b", 0.3)]
    stamps = [r.recorded_ns for r in read_task_records(tmp_path)]
    assert stamps == sorted(stamps) and len(set(stamps)) == 3


def test_a_failed_write_leaves_no_torn_line(tmp_path, monkeypatch):
    path = tmp_path / "records.jsonl"
    writer = RecordWriter(path)
    writer.write(ok("a"))
    before = path.read_bytes()
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
