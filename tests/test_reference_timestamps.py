"""The frame a timestamp-only reference picks, against the frame the authors' harness reads.

The authors' harness seeks the context video with OpenCV's ``CAP_PROP_POS_MSEC`` and reads the next
frame (``dataset.py``, ``decode_reference``); OpenCV's FFmpeg backend turns the time into frame
``int(seconds * fps + 0.5)`` and seeks there. CMBench picks that frame by arithmetic (halves round up,
as OpenCV's cast does) and reads frames sequentially. On a 12.5-fps fixture the two agree wherever the
seek lands where OpenCV's own arithmetic says, including the half-frame times Python's ``round``
(half to even) would send one frame earlier; they differ where OpenCV's seek lands one frame early
(docs/protocol.md, "Scorer")."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from cmbench.data.task import Reference
from cmbench.data.video import probe_video, write_video

FPS = 12.5  # a non-integer rate: a timestamp of a whole number of milliseconds can fall on a half frame
LEVEL = 6  # frame i is a flat grey of level 6 i: the decoded pixels say which frame a seek read


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    frames = np.stack([np.full((32, 32, 3), LEVEL * i, np.uint8) for i in range(40)])
    path = tmp_path_factory.mktemp("timestamps") / "context.mp4"
    write_video(path, frames, FPS)
    return path


def opencv_seek(path, seconds: float) -> int:
    """The frame the authors' harness reads for a timestamp: seek by milliseconds, read one frame."""
    capture = cv2.VideoCapture(str(path))
    capture.set(cv2.CAP_PROP_POS_MSEC, seconds * 1000)
    ok, frame = capture.read()
    capture.release()
    assert ok
    return int(round(float(frame.mean()) / LEVEL))


@pytest.mark.parametrize("seconds, frame", [(0.04, 1), (0.2, 3), (0.36, 5), (0.52, 7), (0.6, 8), (0.3, 4)])
def test_half_frame_timestamps_pick_the_frame_opencv_seeks_to(video, seconds, frame):
    fps = probe_video(video)[1]
    assert fps == FPS
    assert Reference(seconds, (0, 0, 1, 1)).frame_at(fps) == frame == opencv_seek(video, seconds)


def test_where_opencvs_seek_lands_a_frame_early_cmbench_keeps_the_timestamps_frame(video):
    """t = 0.48 s is exactly frame 6 at 12.5 fps; OpenCV's millisecond seek on this file reads frame 5."""
    assert Reference(0.48, (0, 0, 1, 1)).frame_at(FPS) == 6
    assert opencv_seek(video, 0.48) == 5
