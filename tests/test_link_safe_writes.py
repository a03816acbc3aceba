"""Writing into a received run folder never writes through a link: a records file, a video or a lock file
that is a hard link to a file outside the folder is replaced by a file of its own (the outside file keeps
its bytes), and a symbolic link is refused in one line (cmbench/runs/atomic.py, cmbench/lock.py)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from cmbench.data.video import read_video
from cmbench.lock import RunLock, sole_file
from cmbench.runs import atomic
from cmbench.runs.evaluator import ModelEvaluator, VideoOutput
from cmbench.runs.records import RecordsWriteError, RecordWriter, TaskRecord, read_records_file

VICTIM = b"v" * 1000  # someone's file outside the received folder


def make_record(task_id: str) -> TaskRecord:
    return TaskRecord(task_id=task_id, status="failed", error="x")


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "outside" / "victim.bin"
    path.parent.mkdir()
    path.write_bytes(VICTIM)
    return path


def linked(victim, path, content: bytes | None = None):
    """``path`` made a hard link to ``victim`` (whose bytes become ``content`` first, when given)."""
    if content is not None:
        victim.write_bytes(content)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.link(victim, path)
    return path


def test_appending_a_record_to_a_hard_linked_records_file_leaves_the_other_name_alone(tmp_path, victim):
    earlier = (json.dumps(make_record("a").to_json()) + "\n").encode()
    records = linked(victim, tmp_path / "run" / "records.jsonl", earlier)
    RecordWriter(records).write(make_record("b"))

    assert victim.read_bytes() == earlier
    assert [r.task_id for r, _ in read_records_file(records)] == ["a", "b"]
    assert sole_file(os.stat(records))


def test_cutting_a_torn_line_of_a_hard_linked_records_file_leaves_the_other_name_alone(tmp_path, victim):
    records = linked(victim, tmp_path / "run" / "records.jsonl")  # no newline at the end: a "torn" line
    RecordWriter(records)

    assert victim.read_bytes() == VICTIM
    assert records.read_bytes() == b""


def test_a_symbolic_link_at_a_records_path_is_refused_in_one_line(tmp_path, victim):
    records = tmp_path / "run" / "records.jsonl"
    records.parent.mkdir()
    records.symlink_to(victim)
    with pytest.raises(RecordsWriteError, match=r"records.jsonl: it is a link"):
        RecordWriter(records).write(make_record("a"))
    assert victim.read_bytes() == VICTIM


def test_a_hard_linked_lock_file_is_created_fresh(tmp_path, victim):
    records = tmp_path / "run" / "records.jsonl"
    lock = linked(victim, records.with_name(".records.jsonl.lock"))
    with RunLock(records):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert sole_file(os.stat(lock))
    assert victim.read_bytes() == VICTIM


def test_a_fifo_at_a_lock_path_is_replaced_not_opened_as_the_lock(tmp_path):
    records = tmp_path / "run" / "records.jsonl"
    records.parent.mkdir()
    os.mkfifo(records.with_name(".records.jsonl.lock"))
    with RunLock(records) as held:
        assert sole_file(os.stat(held.path))


@pytest.mark.parametrize("suffix", ["mp4", "mkv"])
def test_a_saved_video_replaces_a_hard_linked_one(tmp_path, victim, suffix):
    run = tmp_path / "run"
    video = linked(victim, run / "videos" / f"t1.{suffix}")
    saver = SimpleNamespace(videos=VideoOutput(run, fps=8.0, lossless_max_pixels=10_000), score_source="frames")
    frames = np.random.default_rng(0).integers(0, 255, (3, 16, 16, 3), dtype=np.uint8)
    ModelEvaluator.save(saver, SimpleNamespace(task_id="t1"), frames)  # type: ignore[arg-type]

    assert victim.read_bytes() == VICTIM
    assert read_video(video)[0].shape == frames.shape
    assert sorted(p.name for p in video.parent.iterdir()) == ["t1.mkv", "t1.mp4"]  # no temporary file left


def test_unshare_copies_a_hard_linked_file_and_refuses_what_is_not_a_regular_file(tmp_path, victim):
    path = linked(victim, tmp_path / "here.txt")
    atomic.unshare(path)
    path.write_bytes(b"mine")
    assert victim.read_bytes() == VICTIM and path.read_bytes() == b"mine"

    (tmp_path / "folder").mkdir()
    with pytest.raises(atomic.OutputError, match="folder: it is not a regular file"):
        atomic.unshare(tmp_path / "folder")
