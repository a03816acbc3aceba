"""Continuity: a continuation must start where its context ends and move as the task's camera does.

Frames are real MiniWorld renders (crops of a panorama along a camera plan), so a true continuation is known
exactly: it continues with error ~0, and the attacks a submitter could make (a context frame copied in as
every frame, the context replayed at another size, a still frame while the camera pans) exceed the
threshold. Boards flag suspect entries and rank them after the others unless ``allow_suspect``; a cosine
rounded past 1 is a similarity of 1, not an impossible record.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import cv2
import numpy as np
import pytest

from cmbench.miniworld import render_video, scene_from_seed
from cmbench.report import write_reports
from cmbench.report.suspect import SUSPECT_COLUMN, ranked
from cmbench.runs.records import TaskRecord
from cmbench.miniworld.readers import camera_plan
from cmbench.scoring.continuity import (CONTINUITY_THRESHOLD, CameraPlan, continuity_error, continuity_fields,
                                        shifted_difference)
from test_report import record, write_run

SCENE = scene_from_seed(11, "synthetic")
CONTEXT_X = np.array([0] * 8 + [4 * i for i in range(1, 9)], dtype=np.int64)  # rests, then pans right 4 px a frame
PLAN_X = np.array([32 + 8 * i for i in range(1, 9)] + [96] * 8, dtype=np.int64)  # pans on 8 px a frame, then rests


def task(context_x=CONTEXT_X, continuation_x=PLAN_X, width=SCENE.width) -> SimpleNamespace:
    return SimpleNamespace(task_id="syn_001_revisit_01", extra={"miniworld": {
        "context_camera_x": [int(x) for x in context_x], "continuation_camera_x": [int(x) for x in continuation_x],
        "panorama_width": width}})


CONTEXT = render_video(SCENE, CONTEXT_X)
TRUE = render_video(SCENE, PLAN_X, first_frame=len(CONTEXT_X))  # what a perfect model would generate


def fields(frames, t=None):
    return continuity_fields(camera_plan(t or task()), lambda: CONTEXT, frames)


def test_a_true_continuation_continues_and_the_camera_step_has_its_sign():
    plan = camera_plan(task())
    assert plan is not None and plan.steps() == [8] * 8 + [0] * 8
    assert continuity_error(CONTEXT[-1], TRUE, plan) == pytest.approx(0.0, abs=1e-3)
    assert fields(TRUE) == {"continuity": pytest.approx(0.0, abs=1e-3), "suspect": None}
    # moved the wrong way, the same frames no longer line up
    backwards = CameraPlan(plan.last_context_x, plan.last_context_x - (PLAN_X - plan.last_context_x), plan.width)
    assert continuity_error(CONTEXT[-1], TRUE, backwards) > CONTINUITY_THRESHOLD


def test_steps_take_the_short_way_round_the_panorama():
    assert CameraPlan(252, np.array([0, 4, 252]), 256).steps() == [4, 4, -8]
    assert shifted_difference(CONTEXT[0], CONTEXT[0], 32) is None  # no column seen by both


@pytest.mark.parametrize("attack", ["reference frame x16 +-3", "context replay 64x64", "still while panning"])
def test_a_copied_or_replayed_context_is_suspect(attack):
    rng = np.random.default_rng(0)
    reference = render_video(SCENE, np.array([160]))[0]  # a view the context's end does not show
    frames = {
        "reference frame x16 +-3": np.clip(reference[None].astype(int) + rng.integers(-3, 4, (16, 32, 32, 3)),
                                           0, 255).astype(np.uint8),
        "context replay 64x64": np.stack([cv2.resize(f, (64, 64)) for f in CONTEXT]),
        "still while panning": np.repeat(CONTEXT[-1:], 16, axis=0),
    }[attack]
    got = fields(frames)
    assert got["continuity"] > CONTINUITY_THRESHOLD
    assert got["suspect"].startswith(f"continuity {got['continuity']:.3f} > {CONTINUITY_THRESHOLD}: its frames do "
                                     "not continue the context's last frame")


def test_frames_of_another_size_are_compared_at_the_contexts():
    larger = np.stack([cv2.resize(f, (64, 64), interpolation=cv2.INTER_NEAREST) for f in TRUE])
    assert fields(larger)["continuity"] < CONTINUITY_THRESHOLD / 4


def test_only_the_planned_frames_are_read_and_a_task_without_a_plan_is_not_checked():
    read = []

    def stream():
        for frame in [*TRUE, *TRUE]:
            read.append(1)
            yield frame

    assert fields(stream())["suspect"] is None and len(read) == len(PLAN_X)
    called = []
    no_plan = SimpleNamespace(task_id="t", extra={})
    assert camera_plan(no_plan) is None
    assert continuity_fields(None, lambda: called.append(1), TRUE) == {"continuity": None, "suspect": None}
    assert called == []  # the context is not even read
    assert camera_plan(task(width=True)) is None and camera_plan(task(continuation_x=[])) is None


# ---------------------------------------------------------------- records and boards


def test_a_cosine_rounded_past_one_is_a_similarity_of_one():
    from cmbench.scoring.pipeline import reference_similarities

    unit = np.array([[0.6, 0.8]])
    features = SimpleNamespace(detected=np.array([True]), embeddings=unit * (1 + 5e-9), reference_embeddings=unit)
    assert reference_similarities(features)[0, 0] == 1.0
    TaskRecord("t", "ok", score=1 + 5e-9, reference_aggregates={"mean": 1 + 5e-9, "max": 1 + 5e-9})
    with pytest.raises(ValueError, match="score: is 1.001, expected a similarity in"):
        TaskRecord("t", "ok", score=1.001)
    with pytest.raises(ValueError, match=r"continuity: is 1.5, expected a fraction in \[0, 1\]"):
        TaskRecord("t", "ok", continuity=1.5)


def board(tmp_path, allow_suspect=False, name="board"):
    tmp_path = tmp_path / name
    full = write_run(tmp_path / "fullkv", [record("fullkv", t, 0.9) for t in ("a1", "a2", "b1", "b2")])
    copy = [{**record("copier", t, 0.99), "continuity": 0.2, "suspect": "continuity 0.200 > 0.08: ..."}
            for t in ("a1", "a2", "b1")] + [{**record("copier", "b2", 0.99), "continuity": 0.01}]
    honest = write_run(tmp_path / "honest", [{**record("honest", t, 0.5), "continuity": 0.02}
                                             for t in ("a1", "a2", "b1", "b2")])
    return write_reports([full, write_run(tmp_path / "copier", copy), honest], tmp_path / name,
                         allow_suspect=allow_suspect)


def test_a_suspect_entry_is_flagged_and_ranked_after_every_other_unless_asked(tmp_path):
    paths = board(tmp_path)
    csv = paths["leaderboard.csv"].read_text().splitlines()
    header = csv[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in csv[1:]]
    assert [r["method"] for r in rows] == ["fullkv", "honest", "copier"]  # copier scores 0.99, above FullKV
    assert [r[SUSPECT_COLUMN] for r in rows] == ["0", "0", "3"] and [r["ranked"] for r in rows] == ["True", "True",
                                                                                                    "False"]
    md = paths["leaderboard.md"].read_text()
    assert "| copier § |" in md and "§ suspect continuations" in md and "copier (3)" in md
    assert "listed after the ranked entries whatever their score, not ranked" in md
    rows = json.loads(paths["leaderboard.json"].read_text())["rows"]
    assert [r["method"] for r in rows] == ["fullkv", "honest", "copier"] and rows[2][SUSPECT_COLUMN] == 3
    asked = board(tmp_path, allow_suspect=True, name="asked")
    lines = asked["leaderboard.csv"].read_text().splitlines()
    assert [line.split(",")[0] for line in lines[1:]] == ["copier", "fullkv", "honest"]
    assert "ranked by score as asked" in asked["leaderboard.md"].read_text()


def test_a_record_over_the_threshold_without_a_reason_is_suspect_too_and_older_boards_rank_by_score():
    import pandas as pd

    from cmbench.report.suspect import suspect_count

    frame = pd.DataFrame({"suspect": [None, None, "why"], "continuity": [0.01, CONTINUITY_THRESHOLD + 0.01, None]})
    assert suspect_count(frame) == 2
    assert suspect_count(pd.DataFrame({"score": [0.5]})) == 0
    old = pd.DataFrame({"method": ["a", "b"], "score": [0.2, 0.9]})  # a board written before the column
    assert list(ranked(old)["method"]) == ["b", "a"] and ranked(old)["ranked"].all()
