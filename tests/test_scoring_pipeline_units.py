"""The scoring pipeline's own bookkeeping, with hand-made stages and hand-computed records.

``tests/test_scoring_pipeline.py`` checks the protocol (max over frames, fallbacks, aggregations); these tests
pin the rest exactly: the frame checks and their messages, which frames reach the segmenter and how
(views of runs, chunks of ``SEGMENT_CHUNK``), the per-frame bookkeeping across streamed batches (offsets,
the reference crops embedded with the first batch), every field of a record, the quality metrics riding on
the hashing pass, the defaults, and the feature cache's counters, keys and dtypes.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cmbench.data.references import TaskReferences
from cmbench.hashing import frames_hash, json_digest
from cmbench.scoring import pipeline
from cmbench.scoring.boxes import box_mask
from cmbench.scoring.feature_cache import FeatureCache, FrameFeatures
from cmbench.scoring.pipeline import (
    SEGMENT_CHUNK,
    Scorer,
    _check_batch,
    frame_similarities,
    frames_of,
    reference_similarities,
)
from cmbench.scoring.stages import Detections
from test_scoring_pipeline import MeanColourEmbedder, _task, _unit

RED, GREEN, BLUE = (200, 10, 10), (10, 200, 10), (10, 10, 200)
PATCH = [10, 5, 30, 15]  # the coloured patch of every frame, pixels (x0, y0, x1, y1)


def _frames(colours) -> np.ndarray:
    """20 x 40 frames of grey 10 with a solid patch of each colour (rows 5-14, columns 10-29); pixel (0, 0) of
    frame ``i`` holds ``i`` so the stages below recognise a frame in any batch."""
    frames = np.full((len(colours), 20, 40, 3), 10, dtype=np.uint8)
    for i, colour in enumerate(colours):
        frames[i, 5:15, 10:30] = colour
        frames[i, 0, 0, 0] = i
    return frames


def _solid(colour, size=7) -> np.ndarray:
    """A reference frame of one colour, ``uint8 [size, size, 3]``."""
    return np.ascontiguousarray(np.broadcast_to(np.array(colour, np.uint8), (size, size, 3)))


class IndexedDetector:
    """Per-frame boxes and scores, looked up by the frame's index pixel (so any batching gives the same answer);
    found where the score passes the threshold. Records the targets and batch sizes it sees."""

    def __init__(self, boxes, scores, score_threshold=0.5, **attributes):
        self.boxes, self.scores = np.asarray(boxes, float), np.asarray(scores, float)
        self.score_threshold = score_threshold
        self.targets, self.batches = [], []
        self.__dict__.update(attributes)

    def detect(self, frames, target):
        self.targets.append(target)
        self.batches.append(len(frames))
        index = frames[:, 0, 0, 0].astype(int)
        scores = self.scores[index]
        return Detections(self.boxes[index], scores, np.nan_to_num(scores, nan=-np.inf) >= self.score_threshold)


class RecordingSegmenter:
    """The box is the mask (less its top row with ``trim``), except for the frames whose index pixel is in
    ``empty`` (and reference frames of ``empty_shape``); records what each call received."""

    def __init__(self, empty=(), empty_shape=None, trim=False):
        self.empty, self.empty_shape, self.trim, self.calls = set(empty), empty_shape, trim, []

    def segment(self, frames, boxes):
        self.calls.append((type(frames), len(frames), np.array(boxes, float)))
        masks = []
        for frame, box in zip(frames, boxes):
            mask = box_mask(box, *frame.shape[:2])
            if self.trim:
                mask[np.flatnonzero(mask.any(axis=1))[:1]] = False
            if frame.shape[:2] == self.empty_shape or (frame.shape[:2] == (20, 40) and frame[0, 0, 0] in self.empty):
                mask = np.zeros_like(mask)
            masks.append(mask)
        return masks


class RecordingEmbedder(MeanColourEmbedder):
    """Unit-norm mean colour of the masked pixels; records how many crops each call embeds."""

    def __init__(self):
        self.calls = []

    def embed(self, crops, masks):
        self.calls.append(len(crops))
        return super().embed(crops, masks)


class Stream:
    """A FrameBatches source over ``frames``; records every ``batches`` size asked for."""

    def __init__(self, frames):
        self.frames, self.sizes = frames, []

    def batches(self, size):
        self.sizes.append(size)
        for start in range(0, len(self.frames), size):
            yield self.frames[start : start + size].copy()


class FakeQuality:
    """A QualityScorer double: each pass records the batches it was given and reports their frame count."""

    config_hash = "q-hash"

    def __init__(self):
        self.passes = []

    def start(self):
        seen = []
        self.passes.append(seen)
        return SimpleNamespace(add=lambda frames: seen.append(frames.shape),
                               result=lambda: SimpleNamespace(values={"frames": float(sum(s[0] for s in seen))},
                                                              absent={"motion": "no model"}))


def _scorer(detector, segmenter=None, embedder=None, **kwargs) -> Scorer:
    """A Scorer named "stub" with config hash "cfg" over the given (or default recording) stages."""
    return Scorer(detector, segmenter or RecordingSegmenter(), embedder or RecordingEmbedder(),
                  name="stub", config_hash="cfg", **kwargs)


def _cos(a, b) -> float:
    return float(_unit(a) @ _unit(b))


# ---------------------------------------------------------------- frame checks and frame selection


@pytest.mark.parametrize("frames", [
    np.zeros((2, 4, 5, 3), np.float32),  # 4-D, 3 channels, not uint8
    np.zeros((4, 5, 3), np.uint8),  # one frame without the batch axis
    np.zeros((2, 4, 5, 4), np.uint8),  # RGBA
    np.zeros((0, 4, 5, 3), np.uint8),  # empty
])
def test_check_batch_wants_non_empty_uint8_frames(frames):
    with pytest.raises(ValueError, match=rf"frames must be non-empty uint8 \[F, H, W, 3\], got {frames.dtype} "
                                         + rf"\({', '.join(map(str, frames.shape))}\)"):
        _check_batch(frames, None)


def test_check_batch_accepts_frames_of_the_size_given():
    """H = 4 and W = 5 (neither is 3), one frame: no error, with or without a size to match."""
    one = np.zeros((1, 4, 5, 3), np.uint8)
    assert _check_batch(one, None) is None and _check_batch(one, (4, 5)) is None
    with pytest.raises(ValueError, match="^frames change size mid-video: 4x5 then 6x7$"):
        _check_batch(np.zeros((1, 6, 7, 3), np.uint8), (4, 5))


def test_frames_of_gives_a_view_for_a_run_and_a_list_otherwise():
    frames = _frames([RED] * 6)
    run = frames_of(frames, np.array([2, 3, 4]))
    assert isinstance(run, np.ndarray) and run.base is frames and [f[0, 0, 0] for f in run] == [2, 3, 4]
    single = frames_of(frames, np.array([5]))
    assert isinstance(single, np.ndarray) and single.shape == (1, 20, 40, 3) and single[0, 0, 0, 0] == 5
    for indices in ([1, 3], [0, 1, 3], [0, 2, 3]):
        picked = frames_of(frames, np.array(indices))
        assert isinstance(picked, list) and [f[0, 0, 0] for f in picked] == indices
        assert all(f.base is frames for f in picked)


# ---------------------------------------------------------------- similarities


def test_similarities_by_hand_in_float64():
    """References (1, 0) and (0.6, 0.8); frames (0.6, 0.8), undetected, (0, 1): cosines [0.6, 0.6^2 + 0.8^2],
    NaN, [0, 0.8], taken in float64 from the float32 embeddings and clamped to [-1, 1] (0.6^2 + 0.8^2 of the float32
    values is 1 + 4.8e-8); per frame the closest reference."""
    f32 = np.float32
    features = FrameFeatures(
        reference_embeddings=np.array([[1, 0], [0.6, 0.8]], f32), reference_mask_fallback=np.zeros(2, bool),
        boxes=np.zeros((3, 4)), scores=np.zeros(3), detected=np.array([True, False, True]),
        embeddings=np.array([[0.6, 0.8], [0.3, 0.3], [0, 1]], f32), frame_size=np.array([20, 40]))
    six, eight = float(f32(0.6)), float(f32(0.8))
    assert six * six + eight * eight > 1  # what the clamp is for
    sims = reference_similarities(features)
    assert sims.dtype == np.float64
    np.testing.assert_array_equal(sims, [[six, 1.0], [np.nan, np.nan], [0.0, eight]])
    np.testing.assert_array_equal(frame_similarities(features), [1.0, np.nan, eight])
    none = FrameFeatures(**{**features.__dict__, "detected": np.zeros(3, bool)})
    assert np.isnan(reference_similarities(none)).all() and np.isnan(frame_similarities(none)).all()


# ---------------------------------------------------------------- the scorer's settings


def test_scorer_defaults_and_identity(tmp_path):
    """min box 1 px, batches of 8, mean aggregation, no cache; the models hash is 12 digits over each stage's
    identity (``{}`` for a stage without one)."""
    detector = IndexedDetector([PATCH], [0.9], identity=lambda: {"weights": "abc"})
    scorer = _scorer(detector)
    assert (scorer.min_box_size, scorer.batch_size, scorer.reference_aggregation) == (1.0, 8, "mean")
    assert scorer.cache is None and (scorer.cache_hits, scorer.cache_misses) == (0, 0)
    assert (scorer.detector, scorer.name, scorer.config_hash, scorer.quality) == (detector, "stub", "cfg", None)
    want = json_digest({"detector": {"weights": "abc"}, "segmenter": {}, "embedder": {}})[:12]
    assert scorer.models_hash == want and len(want) == 12
    cached = _scorer(detector, cache_dir=str(tmp_path), batch_size="3", min_box_size=2)
    assert cached.cache.folder == tmp_path / "cfg" / want and (cached.batch_size, cached.min_box_size) == (3, 2.0)


def test_scorer_rejects_a_batch_size_below_1_and_unknown_aggregations():
    detector = IndexedDetector([PATCH], [0.9])
    with pytest.raises(ValueError, match="^batch_size must be >= 1, got 0$"):
        _scorer(detector, batch_size=0)
    assert _scorer(detector, batch_size=1).batch_size == 1
    with pytest.raises(ValueError, match="^reference_aggregation must be one of mean, max, got 'median'$"):
        _scorer(detector, reference_aggregation="median")
    assert _scorer(detector, reference_aggregation="max").reference_aggregation == "max"


def test_a_box_counts_from_the_minimum_size():
    """A 1 x 1 px box is a detection with the default minimum of 1 px, not with 1.5."""
    frames = _frames([RED])
    detector = IndexedDetector([[10, 5, 11, 6]], [0.9])
    assert _scorer(detector).score_task(_task([(0.25, 0.25, 0.75, 0.75)]), frames, [frames[0]]).detection_rate == 1.0
    strict = _scorer(detector, min_box_size=1.5)
    assert strict.score_task(_task([(0.25, 0.25, 0.75, 0.75)]), frames, [frames[0]]).detection_rate == 0.0


# ---------------------------------------------------------------- one record, field by field


def _record_case():
    """Five frames: red (box on the patch), no candidate, an infinite box (score 0.95: no detection), blue
    (box 12..28 x 6..14 inside the patch), green with an empty mask. References: the blue frame's patch
    (box 0.25..0.75 of it) and a 7 x 7 purple frame whose mask comes back empty (the whole box is used)."""
    frames = _frames([RED, RED, RED, BLUE, GREEN])
    boxes = [PATCH, [np.nan] * 4, [0, 0, np.inf, 20], [12, 6, 28, 14], PATCH]
    detector = IndexedDetector(boxes, [0.9, np.nan, 0.95, 0.8, 0.7], identity=lambda: {"w": 1})
    task = _task([(0.25, 0.25, 0.75, 0.75), (0.0, 0.0, 1.0, 1.0)])
    return frames, detector, task, [frames[3], _solid((200, 10, 120))]


def _expected(models_hash, aggregation="mean", quality=None) -> dict:
    """The record of :func:`_record_case`, worked out by hand: frames 0 and 3 detected (frame 4's mask is
    empty); the blue reference's best frame is 3 (cosine 1), the purple one's frame 0 (red is closer to
    purple than blue is); boxes divided by (40, 20, 40, 20)."""
    purple = (200, 10, 120)
    to_purple = [_cos(RED, purple), _cos(BLUE, purple)]
    assert to_purple[0] > to_purple[1]
    reference_scores = [1.0, to_purple[0]]
    return {
        "task_id": "t", "source": "real", "task_type": "revisit",
        "score": (1.0 + to_purple[0]) / 2 if aggregation == "mean" else 1.0,
        "similarities": [max(_cos(RED, BLUE), to_purple[0]), None, None, 1.0, None],
        "detection_rate": 0.4,
        "boxes": [[0.25, 0.25, 0.75, 0.75], None, None, [0.3, 0.3, 0.7, 0.7], None],
        "detection_scores": [0.9, None, 0.95, 0.8, 0.7],
        "detection_threshold": 0.5,
        "reference_mask_fallback": [False, True],
        "n_frames": 5, "scorer": "stub", "scorer_config_hash": "cfg",
        "reference_scores": reference_scores, "reference_best_frames": [3, 0], "reference_aggregation": aggregation,
        "scorer_models_hash": models_hash,
        "quality": None if quality is None else {"frames": 5.0},
        "quality_absent": None if quality is None else {"motion": "no model"},
        "quality_hash": None if quality is None else "q-hash",
        "frames_received": 5,  # frames_defined not given: every frame received is scored
    }


def _assert_record(record, want):
    got = record.to_json()
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == (pytest.approx(value, abs=1e-6) if key in ("score", "similarities", "reference_scores")
                            else value), key


@pytest.mark.parametrize("aggregation", ["mean", "max"])
def test_score_task_record_by_hand(aggregation):
    frames, detector, task, references = _record_case()
    segmenter = RecordingSegmenter(empty={4}, empty_shape=(7, 7), trim=True)
    scorer = _scorer(detector, segmenter, reference_aggregation=aggregation)
    record = scorer.score_task(task, frames, references)
    _assert_record(record, _expected(scorer.models_hash, aggregation))
    assert isinstance(record.detection_threshold, float) and isinstance(record.detection_scores[0], float)
    assert detector.targets[0].queries == ("mug", "cup")
    # the references: boxes denormalised on their own frames (20 x 40 and 7 x 7) and clipped
    ref_call = segmenter.calls[0]
    assert ref_call[1] == 2
    np.testing.assert_array_equal(ref_call[2], [[10, 5, 30, 15], [0, 0, 7, 7]])
    views = detector.targets[0].references
    assert [v.frame.shape for v in views] == [(20, 40, 3), (7, 7, 3)]
    np.testing.assert_array_equal(views[0].box, [10, 5, 30, 15])
    assert views[0].mask.sum() == 200 - 20 and views[1].mask.all()  # the segmenter's mask; the box for an empty one
    # the frames: candidates 0, 3, 4 (not a run: a list), the detections' boxes
    frame_call = segmenter.calls[1]
    assert frame_call[:2] == (list, 3)
    np.testing.assert_array_equal(frame_call[2], [PATCH, [12, 6, 28, 14], PATCH])


def test_reference_boxes_are_clipped_to_their_frames():
    """A reference box reaching past its 20 x 40 frame, (-0.5, 0.25, 1.5, 0.75) -> (-20, 5, 60, 15) px, is
    clipped to (0, 5, 40, 15)."""
    frames = _frames([RED])
    detector = IndexedDetector([PATCH], [0.9])
    segmenter = RecordingSegmenter()
    _scorer(detector, segmenter).score_task(_task([(-0.5, 0.25, 1.5, 0.75)]), frames, [frames[0]])
    np.testing.assert_array_equal(segmenter.calls[0][2], [[0, 5, 40, 15]])
    np.testing.assert_array_equal(detector.targets[0].references[0].box, [0, 5, 40, 15])


def test_detector_boxes_are_ordered_and_clipped_to_the_frame():
    """A swapped box reaching past both sides of the 20 x 40 frame, (45, 25, -5, -5), is segmented and recorded
    as the whole frame (0, 0, 40, 20)."""
    frames = _frames([RED])
    segmenter = RecordingSegmenter()
    scorer = _scorer(IndexedDetector([[45, 25, -5, -5]], [0.9]), segmenter)
    record = scorer.score_task(_task([(0.25, 0.25, 0.75, 0.75)]), frames, [frames[0]])
    np.testing.assert_array_equal(segmenter.calls[1][2], [[0, 0, 40, 20]])
    assert record.boxes == [[0.0, 0.0, 1.0, 1.0]]


def test_nothing_detected_scores_zero_with_no_best_frame():
    frames = _frames([RED, BLUE])
    detector = IndexedDetector([PATCH, PATCH], [0.1, 0.2])
    record = _scorer(detector).score_task(_task([(0.25, 0.25, 0.75, 0.75)] * 2), frames, [frames[0], frames[1]])
    assert (record.score, record.reference_scores, record.reference_best_frames) == (0.0, [0.0, 0.0], [None, None])
    assert record.similarities == [None, None] and record.boxes == [None, None]
    assert record.detection_scores == [pytest.approx(0.1), pytest.approx(0.2)]


# ---------------------------------------------------------------- streaming, batches and quality


def test_a_streamed_video_gives_the_same_record_batch_by_batch():
    """Batches of 2 over 5 frames (2, 2, 1): the same record as in memory; the references' crops are embedded
    with the first batch's (2 references + frame 0), then only the frames' (frame 3; none in the last batch)."""
    frames, detector, task, references = _record_case()
    embedder = RecordingEmbedder()
    quality = FakeQuality()
    scorer = _scorer(detector, RecordingSegmenter(empty={4}, empty_shape=(7, 7)), embedder, batch_size=2,
                     quality=quality)
    stream = Stream(frames)
    record = scorer.score_task(task, stream, references)
    _assert_record(record, _expected(scorer.models_hash, quality=quality))
    assert stream.sizes == [2, 2]  # read twice on a miss: hashed, then scored
    assert detector.batches == [2, 2, 1] and embedder.calls == [3, 1]
    assert quality.passes == [[(2, 20, 40, 3), (2, 20, 40, 3), (1, 20, 40, 3)]]  # the hashing pass only
    in_memory = _scorer(detector, RecordingSegmenter(empty={4}, empty_shape=(7, 7)), quality=FakeQuality())
    memory_quality = in_memory.quality
    assert in_memory.score_task(task, frames, references) == record
    assert memory_quality.passes == [[(5, 20, 40, 3)]]


def test_streamed_frame_embeddings_land_on_their_frames():
    """Six frames in batches of 4 and 2 (red, green, undetected, blue | green, red): each detected frame's
    embedding is its own colour, whatever its batch; the reference (red) is embedded once."""
    frames = _frames([RED, GREEN, RED, BLUE, GREEN, RED])
    detector = IndexedDetector([PATCH] * 6, [0.9, 0.9, 0.1, 0.9, 0.9, 0.9])
    detector.scores = detector.scores.astype(np.float32)  # recorded as float64 all the same
    embedder = RecordingEmbedder()
    scorer = _scorer(detector, embedder=embedder, batch_size=4)
    features = scorer.features(Stream(frames), ["mug"], [_solid(RED)], [(0.0, 0.0, 1.0, 1.0)])
    assert embedder.calls == [1 + 3, 2]
    np.testing.assert_array_equal(features.detected, [True, True, False, True, True, True])
    colours = [RED, GREEN, None, BLUE, GREEN, RED]
    for i, colour in enumerate(colours):
        want = np.zeros(3) if colour is None else _unit(colour)
        np.testing.assert_allclose(features.embeddings[i], want, atol=1e-6)
    np.testing.assert_allclose(features.reference_embeddings, [_unit(RED)], atol=1e-6)
    assert features.embeddings.dtype == np.float32 and features.reference_embeddings.dtype == np.float32
    assert features.scores.dtype == np.float64 and features.frame_size.tolist() == [20, 40]
    np.testing.assert_array_equal(features.boxes, [PATCH, PATCH, PATCH, PATCH, PATCH, PATCH])


def test_stream_errors():
    scorer = _scorer(IndexedDetector([PATCH], [0.9]))
    args = (["mug"], [_solid(RED)], [(0.0, 0.0, 1.0, 1.0)])
    with pytest.raises(ValueError, match=r"^frames must be non-empty uint8 \[F, H, W, 3\], got no frames$"):
        scorer.features(Stream(np.zeros((0, 20, 40, 3), np.uint8)), *args)
    changing = SimpleNamespace(batches=lambda size: iter([np.zeros((1, 20, 40, 3), np.uint8),
                                                          np.zeros((1, 20, 30, 3), np.uint8)]))
    with pytest.raises(ValueError, match="^frames change size mid-video: 20x40 then 20x30$"):
        scorer.features(changing, *args)
    with pytest.raises(ValueError, match=r"got float32 \(1, 20, 40, 3\)"):
        scorer.features(SimpleNamespace(batches=lambda size: iter([np.zeros((1, 20, 40, 3), np.float32)])), *args)
    with pytest.raises(ValueError, match=r"got uint8 \(0, 20, 40, 3\)"):
        scorer.features(np.zeros((0, 20, 40, 3), np.uint8), *args)
    with pytest.raises(ValueError, match=r"got int64 \(1, 20, 40, 3\)"):  # a nested list is made an array first
        scorer.features(np.zeros((1, 20, 40, 3), np.int64).tolist(), *args)


def test_segmentation_goes_in_chunks_of_full_frame_masks():
    """18 detected frames in one batch: the segmenter gets frames 0-15 (one view), then 16-17."""
    assert SEGMENT_CHUNK == 16
    frames = _frames([RED] * 18)
    segmenter = RecordingSegmenter()
    scorer = _scorer(IndexedDetector([PATCH] * 18, [0.9] * 18), segmenter, batch_size=32)
    record = scorer.score_task(_task([(0.25, 0.25, 0.75, 0.75)]), frames, [frames[0]])
    assert [call[:2] for call in segmenter.calls[1:]] == [(np.ndarray, 16), (np.ndarray, 2)]
    assert record.detection_rate == 1.0


# ---------------------------------------------------------------- inputs


def test_features_checks_its_inputs():
    frames = _frames([RED])
    scorer = _scorer(IndexedDetector([PATCH], [0.9]))
    box = [(0.25, 0.25, 0.75, 0.75)]
    with pytest.raises(ValueError, match="^the target needs at least one text query$"):
        scorer.features(frames, [], [frames[0]], box)
    with pytest.raises(ValueError, match="^need one reference frame per reference box, got 0 frames$"):
        scorer.features(frames, ["mug"], [], box)
    with pytest.raises(ValueError, match="^need one reference frame per reference box, got 2 frames and 1 boxes$"):
        scorer.features(frames, ["mug"], [frames[0], frames[0]], box)
    given = TaskReferences.from_arrays([frames[0]])
    assert scorer.features(frames, ["mug"], given, box).detected.tolist() == [True]


def test_score_task_reads_the_references_from_the_task_by_default(monkeypatch):
    frames = _frames([RED])
    seen = []

    def from_video(task):
        seen.append(task)
        return TaskReferences.from_arrays([frames[0]])

    monkeypatch.setattr(pipeline.TaskReferences, "from_video", from_video)
    task = _task([(0.25, 0.25, 0.75, 0.75)])
    record = _scorer(IndexedDetector([PATCH], [0.9])).score_task(task, frames)
    assert seen == [task] and record.reference_scores == [pytest.approx(1.0)]


# ---------------------------------------------------------------- the feature cache


def test_cache_counts_hits_and_misses_under_documented_keys(tmp_path):
    """Task entries are keyed by the frames' hash and the digest of queries, reference keys and boxes (as
    floats); reference entries by the digest of the reference key and box. A hit skips every stage."""
    frames, detector, task, references = _record_case()
    quality = FakeQuality()
    scorer = _scorer(detector, RecordingSegmenter(empty={4}, empty_shape=(7, 7)), cache_dir=str(tmp_path),
                     quality=quality)
    first = scorer.score_task(task, frames, references)
    assert (scorer.cache_hits, scorer.cache_misses) == (0, 1)
    cache = FeatureCache(tmp_path, "cfg", scorer.models_hash)
    keys = TaskReferences.from_arrays(references).keys
    boxes = [[0.25, 0.25, 0.75, 0.75], [0.0, 0.0, 1.0, 1.0]]
    target = json_digest({"queries": ["mug", "cup"], "references": list(keys), "boxes": boxes})
    stored = cache.load(frames_hash([frames]), target)
    assert stored is not None and stored.detected.tolist() == [True, False, False, True, False]
    for key, box, fallback in zip(keys, boxes, [False, True]):
        entry = cache.load_reference(json_digest({"reference": key, "box": box}))
        assert entry is not None and entry.embedding.dtype == np.float32 and bool(entry.mask_fallback) is fallback
    calls = len(detector.targets)
    again = scorer.score_task(task, frames, references)
    assert again == first and (scorer.cache_hits, scorer.cache_misses) == (1, 1) and len(detector.targets) == calls
    assert scorer.score_task(task, frames, references) == first and scorer.cache_hits == 2
    assert len(quality.passes) == 3 and quality.passes[1] == [(5, 20, 40, 3)]  # quality runs on a hit too
    other = scorer.score_task(_task([(0.25, 0.25, 0.75, 0.75), (0.0, 0.0, 1.0, 1.0)]), frames[:4], references)
    assert (scorer.cache_hits, scorer.cache_misses) == (2, 2) and other.n_frames == 4


def test_cached_references_spare_the_context_only_for_text_detectors(tmp_path):
    """With the references cached, a new video still decodes them for a detector that looks at them (the
    default), and not for one with ``needs_reference_views = False`` (then its target has no views)."""
    frames = _frames([RED, BLUE])
    box = [(0.0, 0.0, 1.0, 1.0)]
    looking = IndexedDetector([PATCH, PATCH], [0.9, 0.9])
    text = IndexedDetector([PATCH, PATCH], [0.9, 0.9], needs_reference_views=False)
    for detector in (looking, text):
        scorer = _scorer(detector, cache_dir=str(tmp_path / str(id(detector))))
        first = TaskReferences.from_arrays([_solid(RED)])
        assert scorer.features(frames[:1], ["mug"], first, box).detected.tolist() == [True]
        assert first.decoded  # nothing cached yet: decoded by both
        refs = TaskReferences.from_arrays([_solid(RED)])
        features = scorer.features(frames, ["mug"], refs, box)  # another video, the same reference
        assert features.detected.tolist() == [True, True]
        np.testing.assert_allclose(features.reference_embeddings, [_unit(RED)], atol=1e-6)
        assert refs.decoded is (detector is looking)
        assert len(detector.targets[-1].references) == (1 if detector is looking else 0)
    assert (scorer.cache_hits, scorer.cache_misses) == (0, 2)
