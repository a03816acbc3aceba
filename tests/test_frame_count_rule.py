"""The frame-count rule: only the frames a task defines are scored, by ``score`` and by the scorer ``run`` uses.

The attack it closes: a submitted continuation made of a weak method's frames followed by a strong method's
(twice the frames the task defines) scored as the strong one, because a reference's score is its best
similarity over frames. Stages here are hand-made: the target is the patch of every frame, embedded as its
mean colour, and the reference is red, so a red patch scores 1 and a green one about 0.1.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cmbench.data import Reference, Task
from cmbench.data.adapter import ContinuationShape
from cmbench.data.references import TaskReferences
from cmbench.data.video import write_lossless_video
from cmbench.report.leaderboard import leaderboard, markdown_table
from cmbench.report.reading import read_records
from cmbench.runs.records import TaskRecord
from cmbench.runs.score_videos import score_folder
from cmbench.scoring.boxes import box_mask
from cmbench.scoring.frame_count import CountedFrames, TooFewFrames, flagged
from cmbench.scoring.pipeline import Scorer
from cmbench.scoring.stages import Detections

RED, GREEN = (200, 10, 10), (10, 200, 10)
SIDE = 32
DEFINED = 4


def _frames(colours) -> np.ndarray:
    """``uint8 [F, 32, 32, 3]``: grey frames with a patch of each colour (rows and columns 8-23)."""
    frames = np.full((len(colours), SIDE, SIDE, 3), 60, dtype=np.uint8)
    for i, colour in enumerate(colours):
        frames[i, 8:24, 8:24] = colour
    return frames


class PatchDetector:
    """Finds the patch in every frame; counts the frames it was shown."""

    score_threshold = 0.5

    def __init__(self):
        self.seen = 0

    def detect(self, frames, target):
        self.seen += len(frames)
        boxes = np.tile([8.0, 8.0, 24.0, 24.0], (len(frames), 1))
        return Detections(boxes, np.ones(len(frames)), np.ones(len(frames), dtype=bool))


class BoxSegmenter:
    def segment(self, frames, boxes):
        return [box_mask(box, *frame.shape[:2]) for frame, box in zip(frames, boxes)]


class MeanColour:
    def embed(self, crops, masks):
        means = np.array([c[m].mean(axis=0) for c, m in zip(crops, masks)], dtype=np.float64)
        return (means / np.linalg.norm(means, axis=1, keepdims=True)).astype(np.float32)


class Stream:
    """A streamed continuation (``batches``), as :class:`cmbench.data.video.VideoReader` gives."""

    def __init__(self, frames):
        self.frames = frames

    def batches(self, size):
        for start in range(0, len(self.frames), size):
            yield self.frames[start : start + size].copy()


def _scorer() -> Scorer:
    return Scorer(PatchDetector(), BoxSegmenter(), MeanColour(), name="patch", config_hash="h", batch_size=3)


def _task(task_id="t") -> Task:
    ref = Reference(timestamp_seconds=0.0, bbox_xyxy_normalized=[0.25, 0.25, 0.75, 0.75], frame_index=0)
    return Task(task_id=task_id, source="real", scene="s", video="v.mp4", context_clip_prompts=("p",) * 6,
                continue_prompt="c", task_type="revisit", target_label="mug", target_aliases=(), references=(ref,))


REFERENCES = [_frames([RED])[0]]
WEAK = _frames([GREEN] * DEFINED)
STRONG = _frames([RED] * DEFINED)
GLUED = np.concatenate([WEAK, STRONG])  # the weak continuation followed by the strong one


# ------------------------------------------------------------------ the rule itself


def test_an_array_is_cut_to_the_frames_the_task_defines_and_counted_whole():
    counted = CountedFrames(GLUED, DEFINED)
    assert counted.received == 2 * DEFINED and np.array_equal(counted.frames, WEAK)
    every = CountedFrames(GLUED, None)  # a dataset that does not define the length: every frame
    assert every.received == 2 * DEFINED and np.array_equal(every.frames, GLUED)
    exact = CountedFrames(WEAK, DEFINED)
    assert exact.received == DEFINED and np.array_equal(exact.frames, WEAK)


def test_a_stream_yields_the_defined_frames_and_counts_the_rest():
    counted = CountedFrames(Stream(GLUED), DEFINED)
    assert counted.received is None  # known after a pass
    batches = list(counted.frames.batches(3))
    assert [len(b) for b in batches] == [3, 1]  # 4 of the 8 frames, whatever the batch size
    assert np.array_equal(np.concatenate(batches), WEAK) and counted.received == 2 * DEFINED
    assert [len(b) for b in CountedFrames(Stream(GLUED), None).frames.batches(5)] == [5, 3]


def test_too_few_frames_are_refused_not_padded():
    with pytest.raises(TooFewFrames, match=r"3 frame\(s\), the task defines 4: a short continuation is scored as "
                                           r"missing, not padded") as err:
        CountedFrames(WEAK[:3], DEFINED)
    assert (err.value.received, err.value.defined) == (3, DEFINED)
    counted = CountedFrames(Stream(WEAK[:3]), DEFINED)
    with pytest.raises(TooFewFrames) as err:
        list(counted.frames.batches(2))
    assert (err.value.received, err.value.defined, counted.received) == (3, DEFINED, 3)
    with pytest.raises(ValueError, match="at least 1 frame, got 0"):
        CountedFrames(WEAK, 0)


def test_flagged_when_received_and_scored_differ():
    assert flagged(8, 4) and flagged(3, 0)
    assert not flagged(4, 4) and not flagged(None, 4) and not flagged(4, None)


# ------------------------------------------------------------------ the scorer


@pytest.mark.parametrize("source", [lambda f: f, Stream], ids=["array", "stream"])
def test_appended_frames_do_not_raise_the_score(source):
    alone = _scorer().score_task(_task(), source(WEAK), REFERENCES, frames_defined=DEFINED)
    scorer = _scorer()
    glued = scorer.score_task(_task(), source(GLUED), REFERENCES, frames_defined=DEFINED)
    unruled = _scorer().score_task(_task(), source(GLUED), REFERENCES)  # without the rule: the attack works
    assert unruled.score == pytest.approx(1.0) and alone.score < 0.5
    assert glued.score == alone.score and glued.similarities == alone.similarities
    assert (glued.n_frames, glued.frames_received) == (DEFINED, 2 * DEFINED)
    assert (alone.n_frames, alone.frames_received) == (DEFINED, DEFINED)


@pytest.mark.parametrize("source", [lambda f: f, Stream], ids=["array", "stream"])
def test_a_short_continuation_is_not_scored(source):
    scorer = _scorer()
    with pytest.raises(TooFewFrames):
        scorer.score_task(_task(), source(STRONG[:2]), REFERENCES, frames_defined=DEFINED)
    assert scorer.detector.seen == 0  # refused before any detection


def test_quality_metrics_see_only_the_scored_frames():
    from cmbench.scoring.quality import QualityScorer, TemporalFlickering

    scorer = _scorer()
    scorer.quality = QualityScorer([TemporalFlickering()], {}, "q")
    steady = np.concatenate([WEAK, np.zeros_like(WEAK)])  # the appended black frames would flicker
    got = scorer.score_task(_task(), Stream(steady), REFERENCES, frames_defined=DEFINED)
    assert not got.quality  # the scored frames alone are a still video: undefined, not a flicker value
    assert f"all {DEFINED} frames of the continuation are identical" in got.quality_absent["temporal_flickering"]


# ------------------------------------------------------------------ score: records, leaderboard


class Adapter:
    """What ``score`` asks of a dataset: the continuation's shape and each task's references."""

    def continuation_shape(self) -> ContinuationShape:
        return ContinuationShape(DEFINED, SIDE, SIDE)

    def references(self, task: Task) -> TaskReferences:
        return TaskReferences.from_arrays(REFERENCES)


def _score(tmp_path: Path, videos: dict[str, np.ndarray], name: str) -> Path:
    folder = tmp_path / name
    for task_id, frames in videos.items():
        write_lossless_video(folder / f"{task_id}.mkv", frames, 16)
    out = tmp_path / f"scores_{name}"
    tasks = [_task(t) for t in videos]
    score_folder(_scorer(), tasks, Adapter(), folder, out, label=name, metric="patch")
    return out


def _records(out: Path) -> dict[str, dict]:
    return {r["task_id"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}


def test_score_records_what_came_and_what_was_scored(tmp_path, capsys):
    out = _score(tmp_path, {"a": GLUED, "b": WEAK, "c": STRONG[:2]}, "mine")
    records = _records(out)
    alone = _records(_score(tmp_path, {"a": WEAK}, "alone"))["a"]
    assert records["a"]["status"] == "ok" and records["a"]["score"] == alone["score"] < 0.5
    assert (records["a"]["n_frames"], records["a"]["frames_received"]) == (DEFINED, 2 * DEFINED)
    assert (records["b"]["n_frames"], records["b"]["frames_received"]) == (DEFINED, DEFINED)
    short = records["c"]
    assert short["status"] == "failed" and short["score"] is None
    assert (short["n_frames"], short["frames_received"]) == (0, 2)
    assert short["error"] == ("TooFewFrames: 2 frame(s), the task defines 4: a short continuation is scored as "
                              "missing, not padded")
    assert "c: failed: 2 frame(s), the task defines 4" in capsys.readouterr().err


def test_the_leaderboard_flags_entries_with_another_frame_count(tmp_path):
    flagged_run = read_records(_score(tmp_path, {"a": GLUED, "b": WEAK, "c": STRONG[:2]}, "glued"))
    clean_run = read_records(_score(tmp_path, {"a": WEAK, "b": WEAK, "c": WEAK}, "clean"))
    board = leaderboard([flagged_run, clean_run]).set_index("method")
    assert board.loc["glued", "frame_count_flags"] == 2 and board.loc["clean", "frame_count_flags"] == 0
    table = markdown_table(board.reset_index())
    glued_row = next(line for line in table.splitlines() if line.startswith("| glued"))
    clean_row = next(line for line in table.splitlines() if line.startswith("| clean"))
    assert "‡" in glued_row and "‡" not in clean_row
    assert "‡ 2 continuation(s) had another frame count than the task defines" in table


def test_older_records_without_frame_counts_are_not_flagged(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    row = {"task_id": "a", "status": "ok", "kind": "score", "label": "old", "score": 0.5, "n_frames": 16,
           "context_id": "c", "source": "real", "task_type": "revisit", "scorer_hash": "h", "metric": "patch",
           "schema_version": 5, "recorded_ns": 1}
    (folder / "records.jsonl").write_text(json.dumps(row) + "\n")
    assert TaskRecord.from_json(row).frames_received is None
    board = leaderboard([read_records(folder)])
    assert board.loc[0, "frame_count_flags"] == 0
    assert "‡" not in markdown_table(board)
    assert isinstance(board, pd.DataFrame)


def test_the_report_page_marks_the_flag_column_and_notes_it(tmp_path):
    from cmbench.report.html import table
    from cmbench.report.leaderboard import frame_count_note

    board = leaderboard([read_records(_score(tmp_path, {"a": GLUED, "b": WEAK}, "glued"))])
    shown = table("leaderboard", "Leaderboard", board)
    headers = dict(shown.columns)
    assert headers["frame_count_flags"] == "Frame-count flags ‡"
    flag_cell = shown.rows[0][list(headers).index("frame_count_flags")]
    assert flag_cell.text == "1"
    assert frame_count_note(board).startswith("‡ 1 continuation(s) had another frame count")
    assert frame_count_note(board.drop(columns="frame_count_flags")) == ""  # a board written before the column
