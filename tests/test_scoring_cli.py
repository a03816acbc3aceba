"""``python -m cmbench score``: a folder with a matched, a distractor, a missing, a corrupt and an
extra video, scored with the light scorer against a small MiniWorld-made dataset."""

from __future__ import annotations

import json
import shutil
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from cmbench.config_paths import CONFIG_DIR
from official_fixture import official_row, write_manifest

from cmbench.data import write_video
from cmbench.miniworld import object_boxes, render_video, scene_from_seed
from cmbench.runs.records import TaskRecord
from cmbench.runs.score_videos import match_videos
from cmbench.runs.summary import summarise

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


def official_data(root: Path) -> list[str]:
    """The fixture is an official-layout dataset of 32x32 videos."""
    return ["data=cmbench", f"data.root={root}", "data.height=32", "data.width=32"]


def _score(root: Path, videos: Path, out: Path, cache: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cmbench", "score", f"videos={videos}", *official_data(root), f"out={out}",
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
    assert target["scorer"] == "light" and target["scorer_hash"] == twin["scorer_hash"]
    assert target["kind"] == "score" and target["metric"] == "light" and target["seed"] is None
    assert target["label"] == videos.name and target["context_id"] == "videos/synthetic/syn_001"
    assert target["reference_aggregation"] == "mean" and target["reference_scores"] == [target["score"]]
    assert target["reference_best_frames"] == [target["best_frame"]]  # one reference: its best is the task's
    assert len(target["scorer_models_hash"]) == 12 and target["scorer_models_hash"] == twin["scorer_models_hash"]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["missing_task_ids"] == ["syn_001_reappear_03"] and summary["extra"] == ["syn_999_reappear_01.mp4"]
    assert (summary["tasks_expected"], summary["tasks_recorded"], summary["tasks_ok"], summary["tasks_failed"]) == (
        4, 3, 2, 1)
    assert summary["score"] == pytest.approx((target["score"] + twin["score"]) / 2)
    assert summary["score_all_tasks"] == pytest.approx((target["score"] + twin["score"]) / 4)
    assert summary["scorer_config"]["detector"]["score_threshold"] == target["detection_threshold"]
    assert summary["cache"] == {"hits": 0, "misses": 2}

    (videos / "syn_001_reappear_04.mp4").unlink()  # now simply missing: nothing fails
    again = _score(root, videos, tmp_path / "out2", cache)
    assert again.returncode == 0, again.stdout + again.stderr
    summary2 = json.loads((tmp_path / "out2" / "summary.json").read_text())
    assert summary2["cache"] == {"hits": 2, "misses": 0}  # rescoring reads the feature cache
    assert summary2["missing_task_ids"] == ["syn_001_reappear_03", "syn_001_reappear_04"]
    records2 = [json.loads(line) for line in (tmp_path / "out2" / "records.jsonl").read_text().splitlines()]
    written_at = lambda r: {k: v for k, v in r.items() if k != "recorded_ns"}  # noqa: E731
    assert list(map(written_at, records2)) == list(map(written_at, [target, twin]))


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
    match = match_videos([task(1), task(2), task(3)], tmp_path)
    matched, missing, extra = [t for t, _ in match.matched], match.missing, match.extra
    assert [t.task_id for t in matched] == ["t1", "t3"] and missing == ["t2"] and extra == ["zz.mp4"]
    records = [
        TaskRecord(task_id="t1", status="ok", score=0.8, source="real", task_type="reappear", detection_rate=1.0),
        TaskRecord(task_id="t2", status="ok", score=0.2, source="synthetic", task_type="revisit", detection_rate=0.5),
        TaskRecord(task_id="t3", status="failed", source="real", task_type="revisit"),
    ]
    summary = summarise(records, ["t1", "t2", "t3", "t4"])
    assert summary["tasks_ok"] == 2 and summary["tasks_failed"] == 1
    assert summary["score"] == pytest.approx(0.5) and summary["score_all_tasks"] == pytest.approx(0.25)
    assert summary["by_source"] == {"real": {"n": 1, "score": 0.8}, "synthetic": {"n": 1, "score": 0.2}}
    assert summary["detection_rate"] == pytest.approx(0.75)


def fresh_videos(videos: Path, folder: Path) -> Path:
    """The fixture's folder as first built (another test removes its corrupt video)."""
    folder.mkdir(parents=True)
    for name in ("syn_001_reappear_01.mp4", "syn_001_reappear_02.mp4", "syn_999_reappear_01.mp4", "notes.txt"):
        shutil.copy(videos / name, folder / name)
    (folder / "syn_001_reappear_04.mp4").write_bytes(b"\x00" * 100)
    return folder


def score_in_process(root: Path, videos: Path, out: Path, *args: str) -> int:
    from cmbench.cli.main import main

    return main(["score", f"videos={videos}", *official_data(root), f"out={out}", _scorer_override(), *args])


def test_videos_are_matched_recursively_in_any_case_and_every_skipped_file_is_listed(dataset, tmp_path, capsys):
    root, videos = dataset
    tree = tmp_path / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    (tree / "other").mkdir()
    shutil.copy(videos / "syn_001_reappear_01.mp4", tree / "sub" / "deeper" / "syn_001_reappear_01.MP4")
    shutil.copy(videos / "syn_001_reappear_02.mp4", tree / "sub" / "syn_001_reappear_02.mp4")
    shutil.copy(videos / "syn_001_reappear_02.mp4", tree / "other" / "syn_001_reappear_02.Mp4")  # a second one
    shutil.copy(videos / "syn_999_reappear_01.mp4", tree / "syn_999_reappear_01.mp4")
    (tree / "sub" / "notes.txt").write_text("hi")
    (tree / "syn_001_reappear_03.avi").write_bytes(b"")
    code = score_in_process(root, tree, tmp_path / "out", f"scorer.cache_dir={tmp_path / 'cache'}")
    assert code == 1  # the ambiguous task failed
    stdout, stderr = capsys.readouterr()
    assert "SKIPPED 3 file(s)" in stdout
    assert "  sub/notes.txt: not a .mkv or .mp4 video" in stdout
    assert "  syn_001_reappear_03.avi: not a .mkv or .mp4 video" in stdout
    assert "  syn_999_reappear_01.mp4: names no task of the manifest" in stdout
    records = {r["task_id"]: r for r in map(json.loads, (tmp_path / "out" / "records.jsonl").read_text().splitlines())}
    assert records["syn_001_reappear_01"]["status"] == "ok"
    assert records["syn_001_reappear_01"]["video"].endswith("sub/deeper/syn_001_reappear_01.MP4")
    ambiguous = records["syn_001_reappear_02"]
    assert ambiguous["status"] == "failed"
    assert "several videos for this task: other/syn_001_reappear_02.Mp4, sub/syn_001_reappear_02.mp4" in ambiguous["error"]
    assert "syn_001_reappear_02: failed" in stderr


def test_any_exception_of_one_task_is_its_failure_and_scoring_goes_on(dataset, tmp_path, capsys, monkeypatch):
    """A CUDA out-of-memory error (simulated) on one task: recorded as failed, the rest scored, a summary."""
    from cmbench.scoring.pipeline import Scorer

    root, videos = dataset
    videos = fresh_videos(videos, tmp_path / "videos")
    real = Scorer.score_task

    def out_of_memory(self, task, frames, refs, **rule):
        if task.task_id == "syn_001_reappear_01":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, task, frames, refs, **rule)

    monkeypatch.setattr(Scorer, "score_task", out_of_memory)
    assert score_in_process(root, videos, tmp_path / "out", "scorer.cache_dir=null") == 1
    records = {r["task_id"]: r for r in map(json.loads, (tmp_path / "out" / "records.jsonl").read_text().splitlines())}
    assert records["syn_001_reappear_01"]["status"] == "failed"
    assert records["syn_001_reappear_01"]["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert records["syn_001_reappear_02"]["status"] == "ok"  # the next task was scored
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["tasks_ok"], summary["tasks_failed"]) == (1, 2)  # the OOM and the corrupt video
    assert "syn_001_reappear_01: failed: CUDA out of memory" in capsys.readouterr().err


def test_an_unreadable_cache_entry_is_recomputed_and_overwritten(dataset, tmp_path):
    root, videos = dataset
    videos = fresh_videos(videos, tmp_path / "videos")
    cache = tmp_path / "cache"
    assert score_in_process(root, videos, tmp_path / "first", f"scorer.cache_dir={cache}") == 1
    first = [json.loads(x) for x in (tmp_path / "first" / "records.jsonl").read_text().splitlines()]
    entries = sorted(p for p in cache.rglob("*.npz") if "references" not in p.relative_to(cache).parts)  # task entries
    assert len(entries) == 2
    entries[0].write_bytes(b"")  # a full disk
    entries[1].write_bytes(b"PK\x03\x04 not a zip")  # a torn write
    assert score_in_process(root, videos, tmp_path / "second", f"scorer.cache_dir={cache}") == 1  # the corrupt video
    summary = json.loads((tmp_path / "second" / "summary.json").read_text())
    assert summary["cache"] == {"hits": 0, "misses": 2} and summary["tasks_ok"] == 2
    second = [json.loads(x) for x in (tmp_path / "second" / "records.jsonl").read_text().splitlines()]
    assert [r["score"] for r in second] == [r["score"] for r in first]
    assert all(p.stat().st_size > 100 for p in entries)  # overwritten with good entries
    assert score_in_process(root, videos, tmp_path / "third", f"scorer.cache_dir={cache}") == 1
    assert json.loads((tmp_path / "third" / "summary.json").read_text())["cache"] == {"hits": 2, "misses": 0}


def test_videos_of_an_unexpected_size_or_length_are_warned_about(dataset, tmp_path, capsys):
    root, videos = dataset
    videos = fresh_videos(videos, tmp_path / "videos")
    from cmbench.cli.main import main

    code = main(["score", f"videos={videos}", "data=cmbench", f"data.root={root}", "data.height=64", "data.width=32",
                 f"out={tmp_path / 'out'}", _scorer_override(), "scorer.cache_dir=null"])
    assert code == 1
    err = capsys.readouterr().err
    assert "score: warning: " in err and "syn_001_reappear_01.mp4: 8 frames of 32x32, the task expects 64x32" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert len(summary["warnings"]) == 2  # the two readable videos


def test_shape_warning_names_length_and_size():
    from cmbench.data.adapter import ContinuationShape
    from cmbench.runs.score_videos import shape_warning

    frames = np.zeros((8, 32, 32, 3), np.uint8)
    assert shape_warning(Path("v.mkv"), frames.shape, ContinuationShape(8, 32, 32)) is None
    assert shape_warning(Path("v.mkv"), frames.shape, ContinuationShape(None, 32, 32)) is None
    assert shape_warning(Path("v.mkv"), frames.shape, ContinuationShape(16, 32, 32)) == (
        "v.mkv: 8 frames of 32x32, the task expects 16 frames of 32x32")


def test_a_score_output_goes_on_the_leaderboard(dataset, tmp_path):
    from cmbench.report import write_reports

    root, videos = dataset
    videos = fresh_videos(videos, tmp_path / "videos")
    assert score_in_process(root, videos, tmp_path / "out", "scorer.cache_dir=null", "label=other_generator") == 1
    paths = write_reports([tmp_path / "out"], tmp_path / "board")
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    records = [json.loads(x) for x in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    ok = [r["score"] for r in records if r["status"] == "ok"]
    assert board.loc["other_generator", "score"] == pytest.approx(sum(ok) / len(ok))
    assert board.loc["other_generator", "metric"] == "light" and board.loc["other_generator", "failures"] == 1
    assert paths["leaderboard.md"].read_text().startswith("| Method | light (95% CI) |")
