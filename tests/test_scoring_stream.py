"""Streamed scoring: a continuation read a batch at a time scores exactly as when held whole."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
from omegaconf import OmegaConf

from cmbench.config_paths import CONFIG_DIR
from cmbench.data import Reference, Task
from cmbench.hashing import frames_hash
from cmbench.scoring import build_scorer
from cmbench.scoring.tiny_models import tiny_deep_scorer_config

BATCH = 3
N_FRAMES = 11  # not a multiple of BATCH: the last batch is short


class RecordingFrames:
    """A frame source that hands out fresh copies a batch at a time and records how many of the
    frames it handed out are alive at once (a batch is dead once nothing references it: neither the
    batch nor a view of it, such as a crop)."""

    def __init__(self, frames: np.ndarray):
        self.frames = frames
        self.alive = 0
        self.max_alive = 0
        self.passes = 0

    def batches(self, size: int):
        self.passes += 1
        for start in range(0, len(self.frames), size):
            batch = self.frames[start : start + size].copy()
            self.alive += len(batch)
            self.max_alive = max(self.max_alive, self.alive)
            weakref.finalize(batch, self._release, len(batch))
            yield batch
            del batch

    def _release(self, n: int) -> None:
        self.alive -= n


def _background(seed: int, h: int = 40, w: int = 56) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.uniform(90, 130, size=3) + rng.normal(0, 4, size=(h, w, 3)), 0, 255).astype(np.uint8)


def _scene(seed: int, x: int, y: int) -> np.ndarray:
    """A background with a striped 12x12 square at (x, y)."""
    frame = _background(seed)
    stripes = np.where(((np.arange(12) // 2) % 2 == 0)[:, None, None], [220, 30, 30], [250, 250, 250])
    frame[y : y + 12, x : x + 12] = stripes.astype(np.uint8)
    return frame


def _continuation() -> np.ndarray:
    """``uint8 [N_FRAMES, 40, 56, 3]``: the square moving, absent from frames 4 and 5."""
    frames = [_scene(10 + i, 3 + 3 * i, 5 + i) for i in range(N_FRAMES)]
    frames[4], frames[5] = _background(40), _background(41)
    return np.stack(frames)


def _task() -> Task:
    box = (4 / 56, 6 / 40, 16 / 56, 18 / 40)
    return Task(
        task_id="syn_001_reappear_01", source="synthetic", scene="s", video="videos/synthetic/syn_001.mp4",
        context_clip_prompts=("p",) * 6, continue_prompt="c", task_type="reappear",
        target_label="red cube", target_aliases=("box",), references=(Reference(timestamp_seconds=0.0, bbox_xyxy_normalized=box),),
    )


def _light_config() -> dict:
    cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "scorer" / "light.yaml"))
    return {**cfg, "batch_size": BATCH}


@pytest.fixture(scope="module")
def deep_config(tmp_path_factory):
    """The paper scorer's tiny random models, SAM masks never empty: on :func:`_noise` the random
    detector's boxes are valid in some frames only."""
    cfg = tiny_deep_scorer_config(tmp_path_factory.mktemp("tiny_models"))
    return {**cfg, "batch_size": BATCH, "segmenter": {**cfg["segmenter"], "mask_threshold": -1e9}}


def _noise() -> np.ndarray:
    """``uint8 [N_FRAMES, 48, 64, 3]`` of noise."""
    return np.random.default_rng(0).integers(0, 256, (N_FRAMES, 48, 64, 3), dtype=np.uint8)


@pytest.mark.parametrize("which", ["light", "deep"])
def test_streamed_scoring_equals_scoring_all_frames_at_once(which, request):
    cfg = _light_config() if which == "light" else request.getfixturevalue("deep_config")
    frames, reference = (_continuation() if which == "light" else _noise()), [_scene(0, 4, 6)]
    whole = build_scorer(cfg, cache_dir="")
    streamed = build_scorer(cfg, cache_dir="")
    source = RecordingFrames(frames)

    expected = whole.score_task(_task(), frames, reference)
    got = streamed.score_task(_task(), source, reference)

    assert got.to_json() == expected.to_json()  # every field, floats bit for bit
    assert got.n_frames == N_FRAMES and 0 < got.detection_rate < 1  # detections in several batches
    assert source.passes == 2  # one pass to name the video for the cache key, one to score it
    assert 0 < source.max_alive <= BATCH and source.alive == 0
    want = whole.features(frames, _task().queries, reference, [_task().references[0].bbox_xyxy_normalized])
    have = streamed.features(source, _task().queries, reference, [_task().references[0].bbox_xyxy_normalized])
    for name in ("boxes", "scores", "detected", "embeddings", "reference_embeddings", "frame_size"):
        assert np.array_equal(getattr(have, name), getattr(want, name), equal_nan=name in ("boxes", "scores")), name


def test_streamed_video_hits_the_cache_on_a_second_call_and_shares_it_with_frames_in_memory(tmp_path):
    frames, reference = _continuation(), [_scene(0, 4, 6)]
    scorer = build_scorer(_light_config(), cache_dir=str(tmp_path / "cache"))
    source = RecordingFrames(frames)

    first = scorer.score_task(_task(), source, reference)
    assert (scorer.cache_hits, scorer.cache_misses, source.passes) == (0, 1, 2)
    second = scorer.score_task(_task(), source, reference)
    assert (scorer.cache_hits, scorer.cache_misses, source.passes) == (1, 1, 3)  # a hit only hashes
    assert source.max_alive <= BATCH
    in_memory = scorer.score_task(_task(), frames, reference)
    assert (scorer.cache_hits, scorer.cache_misses) == (2, 1)
    assert first.to_json() == second.to_json() == in_memory.to_json()

    changed = frames.copy()
    changed[-1, 0, 0, 0] ^= 1  # one value of the last batch
    scorer.score_task(_task(), RecordingFrames(changed), reference)
    assert scorer.cache_misses == 2


def test_frames_hash_ignores_batching_but_not_content_or_shape():
    frames = _continuation()
    whole = frames_hash([frames])
    assert frames_hash([frames[:3], frames[3:7], frames[7:]]) == whole
    assert frames_hash(list(frames[:, None])) == whole
    assert frames_hash([frames[:-1]]) != whole
    assert frames_hash([frames.reshape(N_FRAMES, 56, 40, 3)]) != whole
    with pytest.raises(ValueError, match="differ"):
        frames_hash([frames[:2], frames[2:, :20]])
    with pytest.raises(ValueError, match="no frames"):
        frames_hash([])


def test_a_streamed_batch_of_another_size_or_type_is_named():
    scorer = build_scorer(_light_config(), cache_dir="")

    class Resized(RecordingFrames):
        def batches(self, size):
            yield self.frames[:size]
            yield self.frames[size:, :20]

    with pytest.raises(ValueError, match="change size mid-video: 40x56 then 20x56"):
        scorer.score_task(_task(), Resized(_continuation()), [_scene(0, 4, 6)])
    with pytest.raises(ValueError, match="non-empty uint8"):
        scorer.score_task(_task(), RecordingFrames(_continuation().astype(np.float32)), [_scene(0, 4, 6)])
    with pytest.raises(ValueError, match="got no frames"):
        scorer.score_task(_task(), RecordingFrames(_continuation()[:0]), [_scene(0, 4, 6)])
