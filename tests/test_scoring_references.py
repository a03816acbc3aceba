"""Reference frames out of context video files: sequential decode of the referenced frames only,
content names for the cache, and no decode at all when the cache already holds what is needed."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from omegaconf import OmegaConf

from cmbench.config_paths import CONFIG_DIR
from cmbench.data import Reference, Task, read_video, write_video
from cmbench.data import video as video_module
from cmbench.data.adapter import DatasetAdapter
from cmbench.data.video import VideoError, read_frames_at
from cmbench.hashing import file_hash
from cmbench.runs.score_videos import score_folder
from cmbench.scoring import build_scorer
from cmbench.data.references import ReferenceFrameError, TaskReferences
from cmbench.scoring.tiny_models import tiny_deep_scorer_config

FPS = 8.0
OPENCV_CAPTURE = cv2.VideoCapture


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A 24-frame context video (each frame a distinct grey level) under a dataset root."""
    root = tmp_path_factory.mktemp("data")
    frames = np.repeat(np.arange(0, 240, 10, dtype=np.uint8)[:, None, None, None], 3, axis=3) * np.ones((1, 32, 48, 1), np.uint8)
    frames[:, 8:24, 12:36] = 255 - frames[:, 8:24, 12:36]  # an object in the middle
    write_video(root / "videos" / "ctx.mp4", frames, FPS)
    return root


def _task(root, refs) -> Task:
    references = tuple(Reference(timestamp_seconds=t, bbox_xyxy_normalized=(0.25, 0.25, 0.75, 0.75), frame_index=i)
                       for t, i in refs)
    return Task("syn_001_reappear_01", "synthetic", "s", "videos/ctx.mp4", ("p",) * 6, "c", "reappear", "cube", (),
                references, root=root)


class CountingCapture:
    """``cv2.VideoCapture`` counting the frames read (decoded or grabbed) per file."""

    frames_read: dict[str, int] = {}

    def __init__(self, path: str):
        self.path = path
        self._cap = OPENCV_CAPTURE(path)
        self.frames_read.setdefault(path, 0)

    def read(self):
        ok, frame = self._cap.read()
        self.frames_read[self.path] += ok
        return ok, frame

    def grab(self):
        ok = self._cap.grab()
        self.frames_read[self.path] += ok
        return ok

    def __getattr__(self, name):
        return getattr(self._cap, name)


@pytest.fixture
def counted(monkeypatch):
    """Frames read per video file while a test runs."""
    counts: dict[str, int] = {}
    monkeypatch.setattr(CountingCapture, "frames_read", counts)
    monkeypatch.setattr(video_module.cv2, "VideoCapture", CountingCapture)
    return counts


def _light_scorer(cache):
    light = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "scorer" / "light.yaml"))
    return build_scorer(light, cache_dir=str(cache))


def test_the_adapter_decodes_up_to_the_last_reference_only(dataset, counted):
    task = _task(dataset, [(0.0, 9), (0.0, 3)])
    adapter = DatasetAdapter({"root": str(dataset), "height": 32, "width": 48})
    refs = adapter.references(task)
    context = str(task.video_path)
    assert counted.get(context, 0) == 0 and not refs.decoded  # naming the references reads the header only
    frames = refs.frames()
    assert counted[context] == 10  # frames 0..9 of 24: the decoder stops at the last reference
    everything, _ = read_video(task.video_path)
    np.testing.assert_array_equal(frames[0], everything[9])
    np.testing.assert_array_equal(frames[1], everything[3])


def test_score_reads_only_the_referenced_context_and_nothing_on_a_full_cache_hit(dataset, tmp_path, counted):
    task = _task(dataset, [(0.0, 9), (0.0, 3)])
    continuation, _ = read_video(task.video_path)
    videos = tmp_path / "videos"
    write_video(videos / f"{task.task_id}.mp4", continuation[8:16], FPS)
    adapter = DatasetAdapter({"root": str(dataset), "height": 32, "width": 48})
    context = str(task.video_path)
    counted.clear()

    first = score_folder(_light_scorer(tmp_path / "cache"), [task], adapter, videos, tmp_path / "out1",
                         label="x", metric="light")
    assert first["tasks_ok"] == 1 and first["cache"] == {"hits": 0, "misses": 1}
    assert counted[context] == 10  # a miss decodes the context up to its last reference, not its 24 frames

    counted.clear()
    again = score_folder(_light_scorer(tmp_path / "cache"), [task], adapter, videos, tmp_path / "out2",
                         label="x", metric="light")
    assert again["tasks_ok"] == 1 and again["cache"] == {"hits": 1, "misses": 0}
    assert counted.get(context, 0) == 0  # a full cache hit decodes no context frame
    assert counted[str(videos / f"{task.task_id}.mp4")] == 8  # only the continuation is read


def test_read_frames_at_decodes_exactly_the_asked_frames(dataset):
    path = dataset / "videos" / "ctx.mp4"
    everything, _ = read_video(path)
    frames = read_frames_at(path, [5, 2, 5, 23])
    assert sorted(frames) == [2, 5, 23]
    for index, frame in frames.items():
        np.testing.assert_array_equal(frame, everything[index])
    with pytest.raises(VideoError, match="ends after 24 frames; frame 30 was asked for"):
        read_frames_at(path, [3, 30])
    with pytest.raises(VideoError, match="not found"):
        read_frames_at(dataset / "nope.mp4", [0])


def test_task_references_are_named_by_file_content_and_decoded_on_demand(dataset):
    task = _task(dataset, [(0.0, 7), (2.0, None)])  # annotated index 7; t = 2 s -> frame 16
    refs = TaskReferences.from_video(task)
    digest = file_hash(dataset / "videos" / "ctx.mp4")
    assert refs.keys == (f"{digest}@7", f"{digest}@16") and not refs.decoded
    everything, _ = read_video(task.video_path)
    for frame, index in zip(refs.frames(), (7, 16)):
        np.testing.assert_array_equal(frame, everything[index])
    assert refs.decoded
    late = TaskReferences.from_video(_task(dataset, [(0.0, 3), (9.0, None)]))  # t = 9 s -> frame 72 of 24
    with pytest.raises(ReferenceFrameError, match="syn_001_reappear_01: reference 1 is frame 72 .* ends after 24 frames"):
        late.frames()


def test_cached_tasks_and_references_never_decode_the_context(dataset, tmp_path):
    cfg = dict(tiny_deep_scorer_config(tmp_path / "models"), cache_dir=str(tmp_path / "cache"))
    task = _task(dataset, [(0.0, 7)])
    video_a = np.random.default_rng(0).integers(0, 256, (3, 32, 48, 3), dtype=np.uint8)
    video_b = np.random.default_rng(1).integers(0, 256, (3, 32, 48, 3), dtype=np.uint8)

    first = build_scorer(cfg)
    record = first.score_task(task, video_a)  # references default to the task's context video
    assert (first.cache_hits, first.cache_misses) == (0, 1)

    again = build_scorer(cfg)
    refs = TaskReferences.from_video(task)
    assert again.score_task(task, video_a, refs) == record
    assert (again.cache_hits, again.cache_misses) == (1, 0) and not refs.decoded  # full hit: no decode

    refs = TaskReferences.from_video(task)
    other = again.score_task(task, video_b, refs)
    assert again.cache_misses == 1 and not refs.decoded  # new video, cached reference: OWL-ViT needs no pixels
    assert other.reference_mask_fallback == record.reference_mask_fallback

    # the same frame passed as pixels is another name, so it is embedded again (and matches)
    pixels = build_scorer(dict(cfg, cache_dir=None)).features(video_a, task.queries, [read_video(task.video_path)[0][7]],
                                                               [task.references[0].bbox_xyxy_normalized])
    np.testing.assert_allclose(pixels.reference_embeddings, first.features(
        video_a, task.queries, TaskReferences.from_video(task), [task.references[0].bbox_xyxy_normalized]).reference_embeddings,
        atol=1e-6)


def test_a_detector_that_looks_at_the_references_decodes_them(dataset, tmp_path):
    light = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "scorer" / "light.yaml"))
    scorer = build_scorer(light, cache_dir=str(tmp_path / "cache"))
    task = _task(dataset, [(0.0, 7)])
    video = read_video(task.video_path)[0][5:9]
    scorer.score_task(task, video)
    refs = TaskReferences.from_video(task)
    scorer.score_task(task, video[::-1].copy(), refs)  # another video: the template detector needs the reference
    assert refs.decoded
