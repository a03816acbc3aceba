"""The scoring protocol with hand-made stages: box clipping, the max, references, the cache."""

from __future__ import annotations

import numpy as np
import pytest

from cmbench.data import Reference, Task
from cmbench.scoring.boxes import box_mask, boxes_valid, clip_boxes, denormalize_box, masked_crop
from cmbench.scoring.pipeline import Scorer
from cmbench.data.references import ReferenceFrameError, reference_frames
from cmbench.scoring.stages import Detections


class ListDetector:
    """Returns fixed (box, score) candidates, one per frame."""

    def __init__(self, boxes, scores, score_threshold=0.5):
        self.boxes, self.scores, self.score_threshold = np.asarray(boxes, float), np.asarray(scores, float), score_threshold
        self.targets = []

    def detect(self, frames, target):
        self.targets.append(target)
        found = np.nan_to_num(self.scores, nan=-np.inf) >= self.score_threshold
        return Detections(self.boxes.copy(), self.scores.copy(), found)


class BoxSegmenter:
    """The box itself is the mask (optionally empty for frames of a given size)."""

    def __init__(self, empty_for_shape=None):
        self.empty_for_shape = empty_for_shape

    def segment(self, frames, boxes):
        out = []
        for frame, box in zip(frames, boxes):
            mask = box_mask(box, *frame.shape[:2])
            out.append(np.zeros_like(mask) if frame.shape[:2] == self.empty_for_shape else mask)
        return out


class MeanColourEmbedder:
    """Unit-norm mean colour of the masked pixels."""

    def embed(self, crops, masks):
        means = np.array([c[m].mean(axis=0) for c, m in zip(crops, masks)], dtype=np.float64)
        return (means / np.linalg.norm(means, axis=1, keepdims=True)).astype(np.float32)


def _unit(v):
    v = np.asarray(v, float)
    return v / np.linalg.norm(v)


def _task(boxes, frame_indices=None) -> Task:
    frame_indices = frame_indices or [None] * len(boxes)
    refs = tuple(Reference(timestamp_seconds=0.5 * i, bbox_xyxy_normalized=b, frame_index=f) for i, (b, f) in enumerate(zip(boxes, frame_indices)))
    return Task(
        task_id="t", source="real", scene="s", video="v.mp4", context_clip_prompts=("p",) * 6, continue_prompt="c",
        task_type="revisit", target_label="mug", target_aliases=("cup", "mug"), references=refs,
    )


def _frames():
    """Four 20x40 frames, a solid patch of a known colour in the middle of each."""
    frames = np.full((4, 20, 40, 3), 10, dtype=np.uint8)
    for i, colour in enumerate([(200, 10, 10), (10, 200, 10), (200, 200, 10), (10, 10, 200)]):
        frames[i, 5:15, 10:30] = colour
    return frames


def test_clip_boxes_orders_and_clips():
    boxes = np.array([[-5, -5, 50, 50], [30, 15, 10, 5], [45, 2, 60, 8], [3.5, 2.25, 3.5, 9]])
    clipped = clip_boxes(boxes, height=20, width=40)
    np.testing.assert_array_equal(clipped, [[0, 0, 40, 20], [10, 5, 30, 15], [40, 2, 40, 8], [3.5, 2.25, 3.5, 9]])
    np.testing.assert_array_equal(boxes_valid(clipped), [True, True, False, False])
    assert not boxes_valid(np.array([[np.nan] * 4]))[0]
    assert box_mask(np.array([3.5, 2.25, 5.0, 4.0]), 6, 8).sum() == 2 * 2  # partially covered pixels count


def test_protocol_max_over_frames_and_degenerate_boxes():
    frames = _frames()
    ref_frame = np.full((30, 30, 3), 10, dtype=np.uint8)
    ref_frame[0:15, 0:15] = (200, 10, 10)  # the reference object is red
    detector = ListDetector(
        boxes=[[10, 5, 30, 15], [25, 30, 5, 10], [45, 0, 80, 20], [np.nan] * 4],  # ok, swapped, outside, none
        scores=[0.9, 0.8, 0.99, np.nan],
    )
    scorer = Scorer(detector, BoxSegmenter(), MeanColourEmbedder(), name="stub", config_hash="abc")
    record = scorer.score_task(_task([(0.0, 0.0, 0.5, 0.5)]), frames, [ref_frame])
    red, green = _unit([200, 10, 10]), _unit([10, 200, 10])
    # frame 1's swapped box becomes (5, 10, 25, 20) after clipping: 75 green pixels, 125 background
    mixed = _unit(np.array([10, 200, 10]) * 75 / 200 + np.array([10, 10, 10]) * 125 / 200)
    assert record.similarities[0] == pytest.approx(1.0, abs=1e-6)
    assert record.similarities[1] == pytest.approx(float(red @ mixed), abs=1e-6)
    assert record.similarities[2] is None  # clipped to zero width: no detection
    assert record.similarities[3] is None  # no candidate at all
    assert record.detection_scores == [0.9, 0.8, 0.99, None]
    assert record.boxes[0] == [0.25, 0.25, 0.75, 0.75] and record.boxes[1] == [0.125, 0.5, 0.625, 1.0]
    assert record.score == pytest.approx(1.0) and record.detection_rate == 0.5
    assert float(red @ green) < record.similarities[1] < 1.0
    assert detector.targets[0].queries == ("mug", "cup")  # label, then aliases, deduplicated


def test_below_threshold_everywhere_scores_zero():
    frames = _frames()
    detector = ListDetector(boxes=[[10, 5, 30, 15]] * 4, scores=[0.1, 0.2, 0.3, 0.4])
    scorer = Scorer(detector, BoxSegmenter(), MeanColourEmbedder(), name="stub", config_hash="abc")
    record = scorer.score_task(_task([(0.25, 0.25, 0.75, 0.75)]), frames, [frames[0]])
    assert record.score == 0.0 and record.similarities == [None] * 4 and record.detection_rate == 0.0


def test_best_reference_wins_and_empty_reference_mask_falls_back_to_box():
    frames = _frames()
    detector = ListDetector(boxes=[[10, 5, 30, 15]] * 4, scores=[0.9] * 4)
    red_ref = frames[0]
    blue_ref = np.ascontiguousarray(np.broadcast_to(np.array([10, 10, 200], np.uint8), (7, 7, 3)))
    scorer = Scorer(detector, BoxSegmenter(empty_for_shape=(7, 7)), MeanColourEmbedder(), name="stub", config_hash="abc")
    record = scorer.score_task(_task([(0.25, 0.25, 0.75, 0.75), (0.0, 0.0, 1.0, 1.0)]), frames, [red_ref, blue_ref])
    assert record.reference_mask_fallback == [False, True]
    assert record.similarities[0] == pytest.approx(1.0, abs=1e-6)  # red frame matches the red reference
    assert record.similarities[3] == pytest.approx(1.0, abs=1e-6)  # blue frame matches the blue reference
    assert detector.targets[0].references[1].mask.all()  # the fallback mask is the whole box


def test_reference_scores_and_their_mean_or_max():
    frames = _frames()  # red, green, yellow, blue patches
    detector = ListDetector(boxes=[[10, 5, 30, 15]] * 4, scores=[0.9] * 4)
    red_ref = frames[0]
    cyan = np.array([10, 150, 200], np.uint8)
    cyan_ref = np.ascontiguousarray(np.broadcast_to(cyan, (7, 7, 3)))
    task = _task([(0.25, 0.25, 0.75, 0.75), (0.0, 0.0, 1.0, 1.0)])
    colours = [(200, 10, 10), (10, 200, 10), (200, 200, 10), (10, 10, 200)]
    to_cyan = [float(_unit(c) @ _unit(cyan)) for c in colours]
    records = {}
    for aggregation in ("mean", "max"):
        scorer = Scorer(detector, BoxSegmenter(), MeanColourEmbedder(), name="stub", config_hash="abc",
                        reference_aggregation=aggregation)
        records[aggregation] = record = scorer.score_task(task, frames, [red_ref, cyan_ref])
        assert record.reference_aggregation == aggregation
        assert record.reference_scores == pytest.approx([1.0, max(to_cyan)], abs=1e-6)
        assert record.reference_best_frames == [0, int(np.argmax(to_cyan))] == [0, 3]
        # per frame: the closest reference
        assert record.similarities == pytest.approx([max(1.0 if i == 0 else float(_unit(c) @ _unit(colours[0])), to_cyan[i])
                                                     for i, c in enumerate(colours)], abs=1e-6)
    assert records["mean"].score == pytest.approx((1.0 + max(to_cyan)) / 2, abs=1e-6)  # the authors' harness
    assert records["max"].score == pytest.approx(1.0, abs=1e-6)  # best reference, best frame
    assert max(to_cyan) < 0.99  # the two aggregations differ here

    never = Scorer(ListDetector(boxes=[[10, 5, 30, 15]] * 4, scores=[0.1] * 4), BoxSegmenter(), MeanColourEmbedder(),
                   name="stub", config_hash="abc")
    record = never.score_task(task, frames, [red_ref, cyan_ref])
    assert record.score == 0.0 and record.reference_scores == [0.0, 0.0] and record.reference_best_frames == [None, None]
    with pytest.raises(ValueError, match="reference_aggregation must be one of mean, max"):
        Scorer(detector, BoxSegmenter(), MeanColourEmbedder(), name="s", config_hash="h", reference_aggregation="median")


def test_input_checks():
    scorer = Scorer(ListDetector([[0, 0, 1, 1]], [1.0]), BoxSegmenter(), MeanColourEmbedder(), name="s", config_hash="h")
    with pytest.raises(ValueError, match="uint8"):
        scorer.score_task(_task([(0, 0, 1, 1)]), np.zeros((1, 8, 8, 3), np.float32), [np.zeros((8, 8, 3), np.uint8)])
    with pytest.raises(ValueError, match="one reference frame per reference box"):
        scorer.score_task(_task([(0, 0, 1, 1)]), np.zeros((1, 8, 8, 3), np.uint8), [])


def test_reference_frames_use_frame_index_else_timestamp():
    context = np.arange(40, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 2, 3), np.uint8)
    task = _task([(0, 0, 1, 1)] * 3, frame_indices=[7, None, None])  # timestamps 0.0, 0.5, 1.0
    frames = reference_frames(task, context, fps=16.0)
    assert [int(f[0, 0, 0]) for f in frames] == [7, 8, 16]
    resampled = reference_frames(task, context, fps=16.0, native=False)
    assert int(resampled[0][0, 0, 0]) == 0  # annotated native index ignored for resampled frames
    with pytest.raises(ReferenceFrameError, match="reference 1 is frame 20 .* has 20 frames"):
        reference_frames(task, context[:20], fps=40.0)


def test_feature_cache_corrupt_entry_is_a_miss(tmp_path):
    frames = _frames()
    detector = ListDetector(boxes=[[10, 5, 30, 15]] * 4, scores=[0.9] * 4)
    scorer = Scorer(detector, BoxSegmenter(), MeanColourEmbedder(), name="stub", config_hash="cfg", cache_dir=str(tmp_path))
    first = scorer.score_task(_task([(0.25, 0.25, 0.75, 0.75)]), frames, [frames[0]])
    [entry] = list((tmp_path / "cfg").rglob("*.npz"))  # the task entry (reference entries live beside)
    entry.write_bytes(b"not a zip file")
    again = scorer.score_task(_task([(0.25, 0.25, 0.75, 0.75)]), frames, [frames[0]])
    assert again == first and (scorer.cache_hits, scorer.cache_misses) == (0, 2)
    third = scorer.score_task(_task([(0.25, 0.25, 0.75, 0.75)]), frames, [frames[0]])
    assert third == first and scorer.cache_hits == 1  # the corrupt entry was rewritten
    assert not list(tmp_path.rglob("*.tmp"))


def test_masked_crop_and_denormalize():
    frame = np.arange(6 * 8 * 3, dtype=np.uint8).reshape(6, 8, 3)
    mask = np.zeros((6, 8), bool)
    mask[2, 3] = mask[4, 5] = True
    crop, crop_mask = masked_crop(frame, mask)
    assert crop.shape == (3, 3, 3) and crop_mask.sum() == 2 and (crop[0, 0] == frame[2, 3]).all()
    np.testing.assert_array_equal(denormalize_box((0.25, 0.5, 0.5, 1.0), 6, 8), [2, 3, 4, 6])
