"""Every file CMBench reads from a folder it did not write is a regular file read under its kind's limit:
FIFOs, devices, sparse giants and decompression bombs are refused in one line naming the file, its size
and the limit, before anything large is read (docs/runs.md, "Reading limits")."""

from __future__ import annotations

import json
import os
import signal
import tracemalloc
import zipfile

import numpy as np
import pytest

from cmbench import bounded_read
from cmbench.bounded_read import GiB, ReadLimitError
from cmbench.calibration.matched_pr import read_log
from cmbench.data.manifest import validate_manifest
from cmbench.data.video import VideoError, VideoReader, read_frames_at, read_video, write_video
from cmbench.miniworld.readers import MiniWorldDataError, load_context
from cmbench.report.reading import folder_config, read_records, read_table
from cmbench.lock import RunFolderError
from cmbench.runs.records import RecordsError, RecordWriter, read_task_records
from cmbench.runs.score_videos import check_output

ROW = {"task_id": "a1", "status": "ok", "label": "x", "score": 0.5}


@pytest.fixture(autouse=True)
def no_hang():
    """A read that blocks (a FIFO opened without O_NONBLOCK) fails the test instead of hanging it."""
    def expired(*_):
        raise TimeoutError("the read blocked")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def run_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "records.jsonl").write_text(json.dumps(ROW) + "\n")
    return folder


# ---------------------------------------------------------------- the reader itself


def test_a_regular_file_under_its_limit_is_read_whole(tmp_path):
    (tmp_path / "c.yaml").write_text("seed: 3\n")
    assert bounded_read.read_text(tmp_path / "c.yaml", "config") == "seed: 3\n"
    (tmp_path / "link.yaml").symlink_to(tmp_path / "c.yaml")  # a link to a regular file is read
    assert bounded_read.read_text(tmp_path / "link.yaml", "config") == "seed: 3\n"
    assert bounded_read.read_optional_text(tmp_path / "none.yaml", "config") is None


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory"])
def test_anything_but_a_regular_file_is_refused_by_what_it_is(tmp_path, kind):
    path = tmp_path / "config.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    what = {"fifo": "a FIFO", "dev_zero": "a character device", "directory": "a directory"}[kind]
    with pytest.raises(ReadLimitError, match=rf"^{path}: is {what}"):
        bounded_read.read_bytes(path, "config")


def test_a_file_over_its_limit_is_refused_naming_its_size_and_the_limit_before_reading(tmp_path):
    path = sparse(tmp_path / "summary.json", 6 * GiB)
    with pytest.raises(ReadLimitError, match=rf"^{path}: 6.0 GiB, over the 64.0 MiB limit of a summary"):
        bounded_read.read_bytes(path, "summary")


def test_a_file_at_its_limit_is_read_and_one_byte_more_is_not(tmp_path, monkeypatch):
    monkeypatch.setitem(bounded_read.LIMITS, "config", 8)
    (tmp_path / "a").write_bytes(b"12345678")
    assert bounded_read.read_bytes(tmp_path / "a", "config") == b"12345678"
    (tmp_path / "b").write_bytes(b"123456789")
    with pytest.raises(ReadLimitError, match="9 bytes, over the 8 bytes limit"):
        bounded_read.read_bytes(tmp_path / "b", "config")


def test_a_small_file_read_allocates_its_size_not_its_kinds_limit(tmp_path):
    """A 20-byte manifest is read without allocating the manifest limit (256 MiB; a report reads one
    manifest per run folder)."""
    (tmp_path / "metadata.jsonl").write_text('{"task_id": "t"}\n\n\n')
    tracemalloc.start()
    try:
        assert bounded_read.read_text(tmp_path / "metadata.jsonl", "manifest") == '{"task_id": "t"}\n\n\n'
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 * 2**20


def test_a_file_longer_than_its_measured_size_is_read_whole_up_to_its_limit(monkeypatch):
    """A file that grows after it is measured (here /proc/self/status: regular, measured as 0 bytes) is
    read to its end, and refused once past the limit."""
    text = bounded_read.read_text("/proc/self/status", "config")
    assert text.startswith("Name:") and "\nPid:" in text and len(text) > 100
    monkeypatch.setitem(bounded_read.LIMITS, "config", 16)
    with pytest.raises(ReadLimitError, match="over the 16 bytes limit of a config"):
        bounded_read.read_bytes("/proc/self/status", "config")


def test_lines_are_bounded_one_at_a_time_and_a_torn_last_line_is_marked(tmp_path, monkeypatch):
    monkeypatch.setitem(bounded_read.LIMITS, "records line", 4)
    (tmp_path / "r").write_bytes(b"abcd\nab\ncd")
    assert list(bounded_read.read_lines(tmp_path / "r")) == [(1, b"abcd", True), (2, b"ab", True), (3, b"cd", False)]
    (tmp_path / "s").write_bytes(b"ab\nabcde\n")
    with pytest.raises(ReadLimitError, match=r"/s:2: a line of more than 4 bytes"):
        list(bounded_read.read_lines(tmp_path / "s"))


# ---------------------------------------------------------------- records files


@pytest.mark.parametrize("attack", ["fifo", "dev_zero", "sparse_8g", "directory"])
def test_a_records_file_that_is_no_regular_file_of_lines_is_refused_naming_it(tmp_path, attack):
    folder = run_folder(tmp_path)
    shard = folder / "records.shard-0-of-2.jsonl"
    if attack == "fifo":
        os.mkfifo(shard)
    elif attack == "dev_zero":
        shard.symlink_to("/dev/zero")
    elif attack == "sparse_8g":
        sparse(shard, 8 * GiB)
    else:
        shard.mkdir()
    said = {"fifo": "is a FIFO", "dev_zero": "is a character device", "directory": "is a directory",
            "sparse_8g": ":1: a line of more than 16.0 MiB"}[attack]
    with pytest.raises(RecordsError, match=rf"{shard}{said if attack == 'sparse_8g' else ': ' + said}"):
        read_task_records(folder)


@pytest.mark.parametrize("attack, said", [("fifo", "is a FIFO"), ("dev_zero", "is a character device"),
                                          ("sparse_8g", ":1: a line of more than 16.0 MiB")])
def test_resuming_into_a_records_file_that_is_no_regular_file_of_lines_is_refused_before_reading_it(
        tmp_path, attack, said):
    path = tmp_path / "records.jsonl"
    if attack == "fifo":
        os.mkfifo(path)
    elif attack == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        sparse(path, 8 * GiB)
    with pytest.raises(RecordsError, match=f"{path}{said if attack == 'sparse_8g' else ': ' + said}"):
        RecordWriter(path)


# ---------------------------------------------------------------- a run folder's other files


@pytest.mark.parametrize("name", ["config.yaml", "run.json", "summary.json"])
def test_a_sparse_6_gib_file_in_a_run_folder_is_refused_naming_it(tmp_path, name):
    folder = run_folder(tmp_path)
    sparse(folder / name, 6 * GiB)
    with pytest.raises(ReadLimitError, match=rf"{folder / name}: 6.0 GiB, over the .* limit of a"):
        read_records(folder)


def test_a_score_folders_sparse_config_is_refused_naming_its_size_before_a_rescore(tmp_path):
    out = tmp_path / "scores"
    out.mkdir()
    sparse(out / "config.yaml", 6 * GiB)
    with pytest.raises(RunFolderError, match=rf"out={out}: {out / 'config.yaml'}: 6.0 GiB, over the 4.0 MiB limit"):
        check_output(out, tmp_path / "videos")


def test_a_sparse_curves_table_is_refused_naming_its_size(tmp_path):
    path = sparse(tmp_path / "curves.csv", 6 * GiB)
    with pytest.raises(ReadLimitError, match=rf"{path}: 6.0 GiB, over the 64.0 MiB limit of a table"):
        read_table(path, ["method"], "curves", "curves")


def test_a_config_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    folder = run_folder(tmp_path)
    os.mkfifo(folder / "config.yaml")
    with pytest.raises(ReadLimitError, match="config.yaml: is a FIFO"):
        folder_config(folder)


# ---------------------------------------------------------------- manifests


@pytest.mark.parametrize("attack", ["fifo", "dev_zero", "sparse_6g"])
def test_validate_names_a_manifest_that_is_no_regular_file_or_too_large(tmp_path, attack):
    path = tmp_path / "metadata.jsonl"
    if attack == "fifo":
        os.mkfifo(path)
    elif attack == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        sparse(path, 6 * GiB)
    tasks, problems = validate_manifest(tmp_path, check_videos=False)
    assert tasks == [] and len(problems) == 1
    said = {"fifo": "is a FIFO", "dev_zero": "is a character device",
            "sparse_6g": "6.0 GiB, over the 256.0 MiB limit of a manifest"}[attack]
    assert problems[0].file == str(path) and said in problems[0].message


# ---------------------------------------------------------------- context arrays (npz)


class MiniTask:
    """What the MiniWorld readers need of a task: its id, root and ``miniworld`` extension."""

    def __init__(self, root, name):
        self.task_id, self.root, self.extra = "t1", root, {"miniworld": {"context_frames": name}}


def test_an_npz_whose_arrays_declare_more_than_the_limit_is_refused_before_decompressing(tmp_path):
    path = tmp_path / "ctx.npz"
    # the header of a bomb: 1.5 GiB of uint8 declared; the data after it is never read, so a few bytes of it
    # make the test cheap (the hostile pass builds the whole 3 GiB bomb)
    header = {"descr": "|u1", "fortran_order": False, "shape": (1536, 1024, 1024)}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("frames.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            member.write(bytes(2**20))
        with archive.open("camera_x.npy", "w") as member:
            np.lib.format.write_array(member, np.zeros(4, np.int64))
    with pytest.raises(MiniWorldDataError, match=r"t1: .*ctx.npz: its arrays declare 1.5 GiB \(frames: uint8 "
                                                 r"\[1536, 1024, 1024\]\), over the 1.0 GiB limit of a context array"):
        load_context(MiniTask(tmp_path, "ctx.npz"))


def test_a_small_npz_reads_as_numpy_reads_it(tmp_path):
    frames, camera = np.arange(96, dtype=np.uint8).reshape(1, 4, 8, 3), np.arange(1)
    np.savez_compressed(tmp_path / "ctx.npz", frames=frames, camera_x=camera)
    got = load_context(MiniTask(tmp_path, "ctx.npz"))
    assert np.array_equal(got[0], frames) and np.array_equal(got[1], camera)


def test_a_context_file_that_is_a_fifo_is_named_for_what_it_is(tmp_path):
    os.mkfifo(tmp_path / "ctx.npz")
    with pytest.raises(MiniWorldDataError, match="ctx.npz: is a FIFO"):
        load_context(MiniTask(tmp_path, "ctx.npz"))


# ---------------------------------------------------------------- videos and calibration logs


def test_a_video_declaring_frames_over_the_decode_limits_is_refused_before_decoding(tmp_path, monkeypatch):
    video = write_video(tmp_path / "v.mkv", np.full((6, 16, 32, 3), 90, np.uint8), 8.0, codec="FFV1")
    monkeypatch.setattr(bounded_read, "FRAME_PIXELS", 16 * 32 - 1)  # one pixel fewer than a frame
    with pytest.raises(VideoError, match=r"v.mkv: declares 32x16 frames, over the 511-pixel limit"):
        VideoReader(video)
    with pytest.raises(VideoError, match="over the 511-pixel limit"):
        read_frames_at(video, [0])
    monkeypatch.setattr(bounded_read, "FRAME_PIXELS", 16 * 32)
    monkeypatch.setattr(bounded_read, "DECODE_BUDGET", 6 * 16 * 32 * 3 - 1)  # one byte short of the whole video
    assert len(list(VideoReader(video))) == 6  # streamed: one frame held at a time
    with pytest.raises(VideoError, match=r"declares 6 frames of 32x16 \(9.0 KiB decoded\), over the 9.0 KiB decode "
                                         r"budget"):
        read_video(video)
    monkeypatch.setattr(bounded_read, "DECODE_BUDGET", 6 * 16 * 32 * 3)
    assert read_video(video)[0].shape == (6, 16, 32, 3)


def test_a_video_that_is_a_fifo_is_refused_not_opened(tmp_path):
    os.mkfifo(tmp_path / "v.mp4")
    with pytest.raises(VideoError, match="v.mp4: is a FIFO"):
        VideoReader(tmp_path / "v.mp4")


def test_a_calibration_log_over_its_limit_is_refused(tmp_path):
    path = sparse(tmp_path / "decoprune_pr90.json", 6 * GiB)
    with pytest.raises(ReadLimitError, match=r"decoprune_pr90.json: 6.0 GiB, over the 16.0 MiB limit of a calibration log"):
        read_log(path)
