"""``python -m cmbench score``: a folder with a matched, a distractor, a missing, a corrupt and an
extra video, scored with the light scorer against a small MiniWorld-made dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from cmbench.config_paths import CONFIG_DIR
from official_fixture import official_row, write_manifest

from cmbench.data import write_video
from cmbench.miniworld import object_boxes, render_video, scene_from_seed
from cmbench.runs.score_videos import match_videos, summarize

pytestmark = pytest.mark.slow  # subprocesses of the real command line

ROOT = Path(__file__).resolve().parent.parent
FPS = 16
DWELL = 4  # context frames per place


def _scorer_override() -> str:
    """``scorer=light`` when the root config has a scorer default, else ``+scorer=light``."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "config.yaml"))["defaults"]
    has_scorer = any(isinstance(d, dict) and "scorer" in d for d in defaults)
    return "scorer=light" if has_scorer else "+scorer=light"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A context video touring all 8 places of one scene, and four tasks on it."""
    root = tmp_path_factory.mktemp("data")
    scene = scene_from_seed(11, "synthetic")
    context_cams = np.repeat([scene.place_offset(p) for p in range(scene.n_places)], DWELL)
    write_video(root / "videos/synthetic/syn_001.mp4", render_video(scene, context_cams), FPS)
    target, other = scene.objects[0], scene.objects[1]
    twin = scene.objects[scene.twins(other.object_id)[0]]

    def row(task_id, obj):
        frame = obj.place * DWELL + 1
        box = object_boxes(scene, context_cams[frame : frame + 1], obj.object_id)[0]
        ref = {"timestamp_seconds": frame / FPS, "frame_index": int(frame), "bbox_xyxy_normalized": [float(v) for v in box]}
        return official_row(task_id, "videos/synthetic/syn_001.mp4", target_label=obj.category, target_aliases=list(obj.aliases), references=[ref])

    write_manifest(root, [row(f"syn_001_reappear_0{i}", obj) for i, obj in enumerate([target, other, target, other], start=1)])

    videos = tmp_path_factory.mktemp("videos")
    near = lambda obj: (scene.place_offset(obj.place) + np.array([-4, 0, 0, 4, 4, 0, -4, 0])) % scene.width  # noqa: E731
    write_video(videos / "syn_001_reappear_01.mp4", render_video(scene, near(target), first_frame=64), FPS)  # the target
    write_video(videos / "syn_001_reappear_02.mp4", render_video(scene, near(twin), first_frame=64), FPS)  # its twin only
    (videos / "syn_001_reappear_04.mp4").write_bytes(b"\x00" * 100)  # corrupt
    write_video(videos / "syn_999_reappear_01.mp4", render_video(scene, near(target)), FPS)  # names no task
    (videos / "notes.txt").write_text("not a video")
    return root, videos


def _score(root: Path, videos: Path, out: Path, cache: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cmbench", "score", f"videos={videos}", f"data.root={root}", f"out={out}",
           _scorer_override(), f"scorer.cache_dir={cache}"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)


def test_score_folder_reports_missing_and_extra_and_scores_the_rest(dataset, tmp_path):
    root, videos = dataset
    out, cache = tmp_path / "out", tmp_path / "cache"
    run = _score(root, videos, out, cache)
    assert run.returncode == 1, run.stdout + run.stderr  # one video is corrupt
    assert "MISSING 1 video(s)" in run.stdout and "syn_001_reappear_03" in run.stdout
    assert "EXTRA 1 file(s)" in run.stdout and "syn_999_reappear_01.mp4" in run.stdout
    assert "syn_001_reappear_04: failed" in run.stderr

    records = {r["task_id"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}
    assert list(records) == ["syn_001_reappear_01", "syn_001_reappear_02", "syn_001_reappear_04"]
    target, twin, broken = records.values()
    assert broken["status"] == "failed" and "syn_001_reappear_04.mp4" in broken["error"]
    assert target["status"] == twin["status"] == "ok"
    assert target["n_frames"] == twin["n_frames"] == 8
    assert target["detection_rate"] == 1.0 and target["score"] > 0.9
    assert target["score"] > twin["score"] + 0.4  # the same entity beats its same-category twin
    assert target["scorer"] == "light" and target["scorer_config_hash"] == twin["scorer_config_hash"]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["missing"] == ["syn_001_reappear_03"] and summary["extra"] == ["syn_999_reappear_01.mp4"]
    assert (summary["n_tasks"], summary["n_videos_matched"], summary["n_scored"], summary["n_failed"]) == (4, 3, 2, 1)
    assert summary["mean_score"] == pytest.approx((target["score"] + twin["score"]) / 2)
    assert summary["mean_score_all_tasks"] == pytest.approx((target["score"] + twin["score"]) / 4)
    assert summary["scorer_config"]["detector"]["score_threshold"] == target["detection_threshold"]
    assert summary["cache"] == {"hits": 0, "misses": 2}

    (videos / "syn_001_reappear_04.mp4").unlink()  # now simply missing: nothing fails
    again = _score(root, videos, tmp_path / "out2", cache)
    assert again.returncode == 0, again.stdout + again.stderr
    summary2 = json.loads((tmp_path / "out2" / "summary.json").read_text())
    assert summary2["cache"] == {"hits": 2, "misses": 0}  # rescoring reads the feature cache
    assert summary2["missing"] == ["syn_001_reappear_03", "syn_001_reappear_04"]
    records2 = [json.loads(line) for line in (tmp_path / "out2" / "records.jsonl").read_text().splitlines()]
    assert records2 == [target, twin]


def test_score_needs_a_videos_folder(dataset, tmp_path):
    root, _ = dataset
    run = _score(root, tmp_path / "nope", tmp_path / "out", tmp_path / "cache")
    assert run.returncode == 1 and "videos=" in run.stderr and "not a folder" in run.stderr


def test_match_videos_and_summary(tmp_path):
    from cmbench.data import Reference, Task

    def task(i, source="synthetic"):
        return Task(f"t{i}", source, "s", "v.mp4", ("p",) * 6, "c", "reappear", "x", (), (Reference(0.0, (0, 0, 1, 1)),))

    for name in ("t1.mp4", "t3.mp4", "zz.mp4", "t2.avi"):
        (tmp_path / name).write_bytes(b"")
    matched, missing, extra = match_videos([task(1), task(2), task(3)], tmp_path)
    assert [t.task_id for t in matched] == ["t1", "t3"] and missing == ["t2"] and extra == ["zz.mp4"]
    records = [
        {"status": "ok", "score": 0.8, "source": "real", "task_type": "reappear", "detection_rate": 1.0},
        {"status": "ok", "score": 0.2, "source": "synthetic", "task_type": "revisit", "detection_rate": 0.5},
        {"status": "failed", "source": "real", "task_type": "revisit"},
    ]
    summary = summarize(records, n_tasks=4)
    assert summary["n_scored"] == 2 and summary["n_failed"] == 1
    assert summary["mean_score"] == pytest.approx(0.5) and summary["mean_score_all_tasks"] == pytest.approx(0.25)
    assert summary["by_source"] == {"real": {"n": 1, "mean_score": 0.8}, "synthetic": {"n": 1, "mean_score": 0.2}}
    assert summary["mean_detection_rate"] == pytest.approx(0.75)
