"""Quality metrics that compare frames are undefined on a still, black or one-frame continuation: absent with
the reason in the scorer's result, counted and shown as undefined on the leaderboard (VBench's formulas
would give such a video a perfect 1.0, rewarding a continuation that froze)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cmbench.report.leaderboard import UNDEFINED_COLUMN, leaderboard, load_runs, markdown_table
from cmbench.scoring.quality import FlickerAccumulator, MeanAccumulator, QualityScorer, TemporalFlickering
from cmbench.scoring.quality_light import BackgroundConsistencyLight, SubjectConsistencyLight
from cmbench.scoring.quality_names import TEMPORAL_QUALITY, is_undefined

rng = np.random.default_rng(0)
TEXTURE = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)  # uint8 [H, W, 3]


class PerFrameMean:
    """A per-frame metric (as aesthetic quality is): defined on any video with a frame."""

    name = "aesthetic_quality"

    def accumulator(self) -> MeanAccumulator:
        return MeanAccumulator(self.name, lambda frames: frames.reshape(len(frames), -1).mean(axis=1) / 255.0)


def scorer() -> QualityScorer:
    return QualityScorer([TemporalFlickering(), SubjectConsistencyLight(), BackgroundConsistencyLight(), PerFrameMean()],
                         {"motion_smoothness": "AMT-S is not here"}, "q")


def score(video: np.ndarray, batch: int = 3):
    """The scorer's result over ``video`` ``uint8 [F, H, W, 3]`` fed in batches of ``batch`` frames."""
    return scorer().score(video[i : i + batch] for i in range(0, len(video), batch))


TEMPORAL = {"temporal_flickering", "subject_consistency_light", "background_consistency_light"}


@pytest.mark.parametrize("video, why", [
    (np.stack([TEXTURE] * 7), "all 7 frames of the continuation are identical"),
    (np.zeros((5, 16, 16, 3), dtype=np.uint8), "all 5 frames of the continuation are identical"),
    (TEXTURE[None], "the continuation has 1 frame"),
], ids=["constant", "black", "one-frame"])
def test_frame_comparing_metrics_are_undefined(video, why):
    result = score(video)
    assert set(result.values) == {"aesthetic_quality"}  # a per-frame metric stays defined
    assert result.values["aesthetic_quality"] == pytest.approx(video.mean() / 255.0)
    for name in TEMPORAL:
        assert is_undefined(result.absent[name]) and why in result.absent[name]
    assert result.absent["motion_smoothness"] == "AMT-S is not here"  # unavailable stays unavailable
    assert TEMPORAL <= set(TEMPORAL_QUALITY)


def test_a_video_that_moves_after_a_still_batch_is_defined():
    """Identical frames for a whole batch, then a change in the next: the rule sees every frame, not a batch."""
    video = np.stack([TEXTURE] * 6 + [255 - TEXTURE])
    result = score(video, batch=3)
    assert TEMPORAL <= set(result.values) and not any(map(is_undefined, result.absent.values()))
    flicker = FlickerAccumulator()
    flicker.add(video)
    assert result.values["temporal_flickering"] == flicker.value() < 1.0


def test_a_normal_video_is_unchanged():
    """A moving video's values are the formulas' own, whatever the batches."""
    video = np.stack([np.roll(TEXTURE, shift, axis=1) for shift in range(6)])
    result = score(video, batch=4)
    assert set(result.values) == TEMPORAL | {"aesthetic_quality"}
    assert set(result.absent) == {"motion_smoothness"}
    for metric in (TemporalFlickering(), SubjectConsistencyLight(), BackgroundConsistencyLight()):
        acc = metric.accumulator()
        acc.add(video)
        assert result.values[metric.name] == pytest.approx(acc.value(), abs=1e-12)


def write_run(path, label, tasks):
    """A run folder whose records carry ``tasks``: ``(task_id, flickering or None, undefined)``."""
    path.mkdir(parents=True)
    rows = []
    for task_id, flicker, undefined in tasks:
        absent = {"temporal_flickering": "undefined: all 16 frames of the continuation are identical"} if undefined else {}
        rows.append(json.dumps({"task_id": task_id, "context_id": task_id[0], "source": "synthetic",
                                "task_type": "reappear", "seed": 0, "label": label, "status": "ok", "score": 0.5,
                                "pr": 0.9, "continuation_frames": 16, "continuation_seconds": 1.0, "scorer_hash": "s",
                                "metric": "light", "temporal_flickering": flicker, "quality_absent": absent}) + "\n")
    (path / "records.jsonl").write_text("".join(rows))
    return path


def test_leaderboard_means_over_defined_tasks_with_the_count(tmp_path):
    frozen = write_run(tmp_path / "frozen", "frozen", [("a1", None, True), ("b1", None, True), ("c1", None, True)])
    mixed = write_run(tmp_path / "mixed", "mixed", [("a1", 0.9, False), ("b1", None, True), ("c1", 0.8, False)])
    moving = write_run(tmp_path / "moving", "moving", [("a1", 0.95, False), ("b1", 0.97, False), ("c1", 0.96, False)])
    board = leaderboard(load_runs([frozen, mixed, moving])).set_index("method")
    assert board[UNDEFINED_COLUMN].to_dict() == {"frozen": 3, "mixed": 1, "moving": 0}
    assert board.loc["mixed", "temporal_flickering"] == pytest.approx(0.85)  # the still task left out
    assert np.isnan(board.loc["frozen", "temporal_flickering"])
    text = markdown_table(board.reset_index())
    assert "| frozen | undefined |" in text
    assert "| mixed | 0.8500" in text
    note = next(line for line in text.splitlines() if line.startswith("Undefined:"))
    assert note.endswith("frozen 3 of 3, mixed 1 of 3 tasks.")


def test_a_board_of_still_continuations_alone_shows_its_quality_undefined(tmp_path):
    frozen = write_run(tmp_path / "frozen", "frozen", [("a1", None, True), ("b1", None, True)])
    board = leaderboard(load_runs([frozen]))
    assert np.isnan(board.loc[0, "temporal_flickering"]) and board.loc[0, UNDEFINED_COLUMN] == 2
    text = markdown_table(board)
    assert "| frozen | undefined |" in text and text.rstrip().endswith("frozen 2 of 2 tasks.")


def test_the_html_board_says_undefined_where_the_markdown_does(tmp_path):
    """The report's leaderboard table: an entry whose continuations were all still shows "undefined" for
    its frame-comparing metrics, an entry with a defined mean shows the number, a NaN of another column
    (or of an entry without still tasks) stays "—"."""
    from cmbench.report.html import table

    frozen = write_run(tmp_path / "frozen", "frozen", [("a1", None, True), ("b1", None, True)])
    mixed = write_run(tmp_path / "mixed", "mixed", [("a1", 0.9, False), ("b1", None, True)])
    board = leaderboard(load_runs([frozen, mixed]))
    board["aesthetic_quality"] = np.nan
    shown = table("leaderboard", "Leaderboard", board)
    column = [name for name, _ in shown.columns]
    cells = {row[column.index("method")].text: row for row in shown.rows}
    flicker, aesthetic = column.index("temporal_flickering"), column.index("aesthetic_quality")
    assert cells["frozen"][flicker].text == "undefined" and cells["mixed"][flicker].text == "0.9000"
    assert cells["frozen"][aesthetic].text == "—"  # not a frame-comparing metric
    assert cells["frozen"][column.index("temporal_flickering_ci95")].text == "—"
