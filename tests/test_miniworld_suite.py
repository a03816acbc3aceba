"""The MiniWorld suite on disk: official schema, exact counts, ground truth, determinism, caching."""

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from cmbench.data.manifest import load_manifest, validate_manifest
from cmbench.data.spec import check_counts, counts, load_spec
from cmbench.data.video import read_video
from cmbench.errors import ConfigError
from cmbench.hashing import file_hash
from cmbench.miniworld import (
    MiniWorldDataError,
    build_suite,
    load_context,
    load_ground_truth,
    object_masks,
    render_video,
    scene_from_seed,
)
from cmbench.miniworld import adapter as adapter_module
from cmbench.miniworld.adapter import MiniWorldAdapter
from cmbench.miniworld.episodes import Episode, TaskPlan
from cmbench.miniworld.readers import data_file
from cmbench.miniworld.suite import SuiteConfig, episode_stats, expected_counts, suite_plan

REPO = Path(__file__).resolve().parents[1]
DATA_CFG = REPO / "configs" / "data" / "miniworld.yaml"
OFFICIAL = {
    "videos": 58,
    "tasks": 116,
    "reappear": 77,
    "revisit": 39,
    "by_source": {
        "synthetic": {"videos": 50, "tasks": 102, "reappear": 67, "revisit": 35},
        "real": {"videos": 8, "tasks": 14, "reappear": 10, "revisit": 4},
    },
}


def _data_cfg(root: Path, **over):
    cfg = OmegaConf.load(DATA_CFG)
    cfg.root = str(root)
    for key, value in over.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def _small(root: Path, **over):
    sources = {"synthetic": {"videos": 2, "reappear": 2, "revisit": 1}, "real": {"videos": 1, "reappear": 1, "revisit": 1}}
    return _data_cfg(root, sources=sources, **over)


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def full_suite(tmp_path_factory):
    root = build_suite(_data_cfg(tmp_path_factory.mktemp("mw") / "miniworld"))
    rows = [json.loads(line) for line in (root / "metadata.jsonl").read_text().splitlines()]
    return root, rows


def test_config_and_spec_agree_on_the_official_counts():
    cfg = SuiteConfig.from_data_config(OmegaConf.load(DATA_CFG))
    assert expected_counts(cfg) == OFFICIAL
    assert load_spec("miniworld")["expected"] == OFFICIAL
    plan = suite_plan(cfg)
    assert {s: len(p) for s, p in plan.items()} == {"synthetic": 50, "real": 8}
    assert sum(len(t) for t in plan["synthetic"]) == 102 and sum(t.count("revisit") for t in plan["synthetic"]) == 35
    assert sum(len(t) for t in plan["real"]) == 14 and sum(t.count("revisit") for t in plan["real"]) == 4


def test_full_suite_validates_with_exact_counts(full_suite):
    root, rows = full_suite
    tasks, problems = validate_manifest(root, "metadata.jsonl", check_videos=True)
    assert problems == []
    assert check_counts("metadata.jsonl", tasks, OFFICIAL) == []
    assert counts(tasks) == OFFICIAL
    ids = [r["task_id"] for r in rows]
    assert len(set(ids)) == 116
    assert all(re.fullmatch(r"(syn|real)_\d{3}_(reappear|revisit)_\d{2}", i) for i in ids)
    assert "syn_001_revisit_01" in ids and "real_008_reappear_01" in ids
    for row in rows:
        prefix = "syn" if row["type"] == "synthetic" else "real"
        assert row["video"] == f"videos/{row['type']}/{row['task_id'][: len(prefix) + 4]}.mp4"
        assert row["task_id"].startswith(prefix) and row["task_type"] in row["task_id"]
        assert len(row["context_clip_prompts"]) == 6 and row["target_label"] and row["target_aliases"]
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size < 100e6


def test_every_row_matches_the_renderer(full_suite):
    """References, lossless frames, camera plans and ground truth all agree with a fresh render."""
    root, rows = full_suite
    assert all(row["miniworld"]["dynamic"] for row in rows)  # the default world is the dynamic one
    _check_rows_against_the_renderer(root, rows)


def test_a_dynamic_suite_keeps_every_target_guarantee_and_changes_with_time(tmp_path):
    """Same schema, targets and plans as the static suite of the same seeds; only the pixels move."""
    static = build_suite(_small(tmp_path / "static", dynamic=False))
    dynamic = build_suite(_small(tmp_path / "dynamic"))
    rows = [json.loads(line) for line in (dynamic / "metadata.jsonl").read_text().splitlines()]
    static_rows = [json.loads(line) for line in (static / "metadata.jsonl").read_text().splitlines()]
    assert all(row["miniworld"]["dynamic"] for row in rows)
    for row, twin in zip(rows, static_rows, strict=True):  # same tasks, references and plans
        assert {k: v for k, v in row["miniworld"].items() if k != "dynamic"} == {
            k: v for k, v in twin["miniworld"].items() if k != "dynamic"}
        assert {k: v for k, v in row.items() if k != "miniworld"} == {k: v for k, v in twin.items() if k != "miniworld"}
    _check_rows_against_the_renderer(dynamic, rows)
    ext = rows[0]["miniworld"]
    frames = np.load(dynamic / ext["context_frames"])["frames"]
    assert not np.array_equal(frames, np.load(static / ext["context_frames"])["frames"])
    cams = np.asarray(ext["context_camera_x"])
    held = np.flatnonzero(cams[1:] == cams[:-1])  # frames where the camera rests: the image still changes
    assert len(held) > 10 and all(not np.array_equal(frames[i], frames[i + 1]) for i in held)


def _check_rows_against_the_renderer(root: Path, rows: list[dict]) -> None:
    scenes = {}
    for row in rows:
        ext = row["miniworld"]
        key = (ext["scene_seed"], row["type"])
        if key not in scenes:
            scenes[key] = scene_from_seed(ext["scene_seed"], row["type"], ext["panorama_width"], ext["dynamic"])
        scene, target = scenes[key], ext["target_object_id"]
        obj = scene.objects[target]
        assert row["target_label"] == obj.category and ext["target_description"] == obj.description
        assert all(scene.objects[d].category == obj.category for d in ext["distractor_object_ids"])
        assert len(ext["distractor_object_ids"]) >= 1
        context = np.load(root / ext["context_frames"])
        cams = np.asarray(ext["context_camera_x"])
        assert np.array_equal(context["camera_x"], cams) and len(cams) == 192
        if row["task_type"] == "reappear" and row["task_id"].endswith("_01"):  # once per context is enough
            assert np.array_equal(context["frames"], render_video(scene, cams))

        # the reference box holds the whole target, tightly, in the referenced frame
        (ref,) = row["references"]
        frame = ref["frame_index"]
        assert ref["timestamp_seconds"] == frame / 16
        mask = object_masks(scene, cams[frame : frame + 1], target)[0]
        assert mask.sum() == obj.area
        assert ext["event_clip"] == frame // ext["clip_frames"]  # the clip in which the target is seen
        x0, y0, x1, y1 = np.asarray(ref["bbox_xyxy_normalized"]) * 32
        rows_, cols = np.nonzero(mask)
        assert (x0, y0, x1, y1) == (cols.min(), rows_.min(), cols.max() + 1, rows_.max() + 1)

        # memory is required: absent from the sink and the last 8 (indeed 32) context frames
        seen = object_masks(scene, cams, target).sum(axis=(1, 2))
        assert seen[:4].sum() == 0 and seen[-8:].sum() == 0 and seen[-32:].sum() == 0

        # the ground-truth continuation shows the target, with its boxes
        truth = np.load(root / ext["ground_truth"])
        plan = np.asarray(ext["continuation_camera_x"])
        assert np.array_equal(truth["camera_x"], plan) and len(plan) == 16
        assert np.array_equal(truth["frames"], render_video(scene, plan, first_frame=192))
        masks = object_masks(scene, plan, target)
        assert np.array_equal(truth["target_masks"], masks)
        whole = masks.sum(axis=(1, 2)) == obj.area
        assert whole.sum() >= 4 and whole[-1]
        assert np.array_equal(np.isnan(truth["target_boxes"]).all(axis=1), ~masks.any(axis=(1, 2)))
        assert np.allclose(truth["target_visible_fraction"], masks.sum(axis=(1, 2)) / obj.area)


def test_mp4_round_trip_error_is_measured_and_recorded(full_suite):
    root, rows = full_suite
    record = json.loads((root / "build.json").read_text())
    row = rows[0]
    decoded, fps = read_video(root / row["video"])
    lossless = np.load(root / row["miniworld"]["context_frames"])["frames"]
    assert fps == 16 and decoded.shape == lossless.shape == (192, 32, 32, 3)
    error = np.abs(decoded.astype(int) - lossless).mean()
    assert 0 < error < 12  # lossy, hence the lossless npz next to every video
    assert record["video_roundtrip_mean_abs_error"]["max"] >= round(error, 3) - 1e-9


def test_readers_return_the_lossless_context_and_ground_truth(full_suite):
    root, rows = full_suite
    tasks = load_manifest(root)
    task = next(t for t in tasks if t.task_id == "real_003_revisit_01")
    ext = task.extra["miniworld"]
    frames, cams = load_context(task)
    scene = scene_from_seed(ext["scene_seed"], "real", ext["panorama_width"], ext["dynamic"])
    assert np.array_equal(cams, ext["context_camera_x"]) and np.array_equal(frames, render_video(scene, cams))
    truth = load_ground_truth(task)
    assert int(truth["first_frame"]) == 192 and truth["frames"].shape == (16, 32, 32, 3)
    assert np.array_equal(truth["camera_x"], ext["continuation_camera_x"])
    foreign = dataclasses.replace(task, extra={"miniworld": {**ext, "ground_truth": "../../etc/passwd"}})
    with pytest.raises(MiniWorldDataError, match="outside the dataset root"):
        load_ground_truth(foreign)
    with pytest.raises(MiniWorldDataError, match="no 'miniworld' extension"):
        load_context(dataclasses.replace(task, extra={}))


def test_episode_stats_on_a_hand_made_path():
    scene = scene_from_seed(0)
    still = np.zeros(64, dtype=np.int64)  # the camera never moves: 8 token columns, place 0 only
    tasks = tuple(TaskPlan("reappear", 0, 0, 0, np.full(16, x, dtype=np.int64), 1) for x in (128, 4))
    stats = episode_stats(scene, Episode(still, ("",) * 6, tasks))
    assert stats["first_sight_fraction"] == 8 / (64 * 8)
    assert stats["continuation_seen_fraction"] == [0.0, 7 / 8]
    assert stats["absence_frames"] == [0, 0]
    assert stats["distractor_seen"] == [False, False]  # the twin lives at another place


def test_full_suite_memory_stats(full_suite):
    root, _ = full_suite
    stats = json.loads((root / "build.json").read_text())["memory_stats"]
    assert stats["absence_frames"]["min"] >= 32  # no target in the last clip
    assert stats["first_sight_fraction"]["max"] < 0.1  # most of every context repeats earlier views
    assert stats["continuation_seen_fraction"]["mean"] > 0.9
    assert stats["distractor_seen_fraction"] > 0.75


def test_same_seed_same_suite_other_seed_other_suite(full_suite, tmp_path):
    root, _ = full_suite
    again = build_suite(_data_cfg(tmp_path / "again"))
    assert _tree_digest(again) == _tree_digest(root)
    other = build_suite(_small(tmp_path / "other", world_seed=1))
    small = build_suite(_small(tmp_path / "small"))
    assert (other / "metadata.jsonl").read_bytes() != (small / "metadata.jsonl").read_bytes()


def test_build_is_cached_and_rebuilt_when_a_knob_changes(tmp_path):
    root = tmp_path / "mw"
    build_suite(_small(root))
    manifest = root / "metadata.jsonl"
    stamp = manifest.stat().st_mtime_ns
    first = json.loads((root / "build.json").read_text())["build_hash"]
    assert build_suite(_small(root)) == root
    assert manifest.stat().st_mtime_ns == stamp  # nothing rewritten
    build_suite(_small(root, min_target_frames=5))
    second = json.loads((root / "build.json").read_text())["build_hash"]
    assert second != first
    build_suite(_small(root, min_target_frames=5, dynamic=False))
    assert json.loads((root / "build.json").read_text())["build_hash"] not in (first, second)
    assert manifest.stat().st_mtime_ns != stamp
    assert not (tmp_path / ".mw.building").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mw"]  # no staging folder, no lock file left
    (tmp_path / "plain").mkdir()
    assert root.stat().st_mode == (tmp_path / "plain").stat().st_mode  # permissions of any new folder


def test_bad_configs_and_foreign_roots_are_refused(tmp_path):
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"not ours")
    with pytest.raises(ConfigError, match="not a MiniWorld build"):
        build_suite(_small(foreign))
    assert (foreign / "holiday.jpg").read_bytes() == b"not ours"
    with pytest.raises(ConfigError, match="cannot be spread"):
        build_suite(_data_cfg(tmp_path / "a", sources={"synthetic": {"videos": 5, "reappear": 2, "revisit": 1}}))
    with pytest.raises(ConfigError, match="height/width"):
        build_suite(_small(tmp_path / "b", height=64))
    with pytest.raises(ConfigError, match="panorama width"):
        build_suite(_small(tmp_path / "c", panorama_width=200))
    with pytest.raises(ConfigError, match="data.dynamic must be true or false, got 'yes'"):
        build_suite(_small(tmp_path / "e", dynamic="yes"))
    with pytest.raises(ConfigError, match="sources"):
        build_suite(_data_cfg(tmp_path / "d", sources={"cartoon": {"videos": 1, "reappear": 1, "revisit": 0}}))


def test_a_build_record_over_its_read_limit_is_not_the_builders(tmp_path, monkeypatch):
    """``build.json`` is read through the bounded reader (the "build record" limit): one over it is not
    taken as the builder's record, so its folder is refused, not rebuilt over."""
    from cmbench import bounded_read
    from cmbench.miniworld.suite import build_record, check_root

    root = tmp_path / "mw"
    build_suite(_small(root))
    assert build_record(root) is not None
    monkeypatch.setitem(bounded_read.LIMITS, "build record", (root / "build.json").stat().st_size - 1)
    assert build_record(root) is None
    with pytest.raises(ConfigError, match=f"^data.root={root}: not empty and not a MiniWorld build"):
        check_root(root)


def test_a_rebuild_never_replaces_a_folder_the_builder_did_not_make_alone(tmp_path):
    """A rebuild replaces the whole root: a user's file beside a build, a folder whose build.json is
    someone else's, a build.json that is a link, and a file as the root are each refused in one line
    naming data.root, and left as they were."""
    root = tmp_path / "mw"
    build_suite(_small(root))
    digest = _tree_digest(root)
    (root / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=f"^data.root={root}: a MiniWorld build that also holds notes.txt, which the "
                                          "builder did not write .*; move it away, or choose an empty or new data.root"):
        build_suite(_small(root, min_target_frames=5))
    assert (root / "notes.txt").read_text() == "mine"
    (root / "notes.txt").unlink()
    assert _tree_digest(root) == digest

    project = tmp_path / "project"
    project.mkdir()
    (project / "build.json").write_text(json.dumps({"build_hash": "x", "tool": "make"}))
    (project / "metadata.jsonl").write_text("my rows\n")
    with pytest.raises(ConfigError, match=f"^data.root={project}: not empty and not a MiniWorld build "
                                          r"\(it holds build.json, metadata.jsonl; no build.json of the builder's\)"):
        build_suite(_small(project))
    assert (project / "metadata.jsonl").read_text() == "my rows\n"

    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "build.json").symlink_to(root / "build.json")
    with pytest.raises(ConfigError, match="not a MiniWorld build"):
        build_suite(_small(linked))
    assert _tree_digest(root) == digest and [p.name for p in linked.iterdir()] == ["build.json"]

    afile = tmp_path / "a-file"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=f"^data.root={afile}: is a file, not a folder"):
        build_suite(_small(afile))
    assert afile.read_text() == "x"


# A child process that builds the suite of the config given as JSON, starting only once ``go`` exists
# (after writing ``ready``), so that two children really build at the same moment.
BUILDER = """
import json, sys, time
from pathlib import Path
from omegaconf import OmegaConf
from cmbench.miniworld import build_suite
cfg, ready, go = OmegaConf.create(json.loads(sys.argv[1])), Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.01)
print(build_suite(cfg))
"""


def _builder(cfg, ready: Path, go: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the checkout under test
    config = json.dumps(OmegaConf.to_container(cfg))
    return subprocess.Popen([sys.executable, "-c", BUILDER, config, str(ready), str(go)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.slow
def test_two_processes_building_one_suite_at_once_both_get_the_single_build(tmp_path):
    root = tmp_path / "shared" / "mw"
    go = tmp_path / "go"
    children = [_builder(_small(root), tmp_path / f"ready{i}", go) for i in range(2)]
    _wait_for(lambda: all((tmp_path / f"ready{i}").exists() for i in range(2)), "both builders to start")
    go.touch()
    results = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err for _, err in results]
    assert [out.strip() for out, _ in results] == [str(root)] * 2
    waited = [err for _, err in results if "waiting for process" in err]
    assert len(waited) == 1, [err for _, err in results]  # one built, the other waited for it
    single = build_suite(_small(tmp_path / "single" / "mw"))
    assert _tree_digest(root) == _tree_digest(single)
    rows = load_manifest(root)
    assert len(rows) == 5 and all((root / row.video).is_file() for row in rows)
    assert sorted(p.name for p in root.parent.iterdir()) == ["mw"]  # no staging folder, no lock file left


@pytest.mark.slow
def test_a_build_killed_midway_is_never_taken_as_finished(tmp_path):
    root = tmp_path / "mw"
    bigger = {"synthetic": {"videos": 8, "reappear": 8, "revisit": 4}, "real": {"videos": 1, "reappear": 1, "revisit": 1}}
    staged = lambda: any(tmp_path.glob(".mw.building-*/ground_truth/*.npz"))  # noqa: E731
    # A first build killed mid-way leaves no suite at the root, only a hidden leftover.
    go = tmp_path / "go"
    go.touch()
    child = _builder(_data_cfg(root, sources=bigger), tmp_path / "ready", go)
    _wait_for(staged, "the build to write ground truth")
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=30)
    assert not root.exists()
    assert list(tmp_path.glob(".mw.building-*"))
    # The next build starts over (removing the leftover) and equals an uninterrupted build.
    build_suite(_small(root))
    assert _tree_digest(root) == _tree_digest(build_suite(_small(tmp_path / "clean" / "mw")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clean", "go", "mw", "ready"]
    # A rebuild with another knob killed mid-way leaves the previous suite whole and still valid.
    before = _tree_digest(root)
    child = _builder(_data_cfg(root, sources=bigger), tmp_path / "ready2", go)
    _wait_for(staged, "the rebuild to write ground truth")
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=30)
    assert _tree_digest(root) == before
    stamp = (root / "metadata.jsonl").stat().st_mtime_ns
    assert build_suite(_small(root)) == root and (root / "metadata.jsonl").stat().st_mtime_ns == stamp


def test_references_are_named_by_the_npz_and_read_only_when_needed(full_suite, monkeypatch):
    root, _ = full_suite
    task = next(t for t in load_manifest(root) if t.task_id == "real_003_revisit_01")
    adapter = MiniWorldAdapter(_data_cfg(root))
    loads = []
    monkeypatch.setattr(adapter_module, "load_context", lambda t: loads.append(t.task_id) or load_context(t))
    refs = adapter.references(task)
    digest = file_hash(data_file(task, "context_frames"))
    assert refs.keys == tuple(f"{digest}@{r.frame_index}" for r in task.references) and loads == []
    frames, _ = load_context(task)
    for frame, ref in zip(refs.frames(), task.references):
        assert np.array_equal(frame, frames[ref.frame_index])
    assert loads == ["real_003_revisit_01"]


def test_context_is_the_lossless_frames_at_the_tasks_own_rate(full_suite):
    root, _ = full_suite
    task = next(t for t in load_manifest(root) if t.task_id == "real_003_revisit_01")
    adapter = MiniWorldAdapter(_data_cfg(root))
    frames, _ = load_context(task)
    context = adapter.context(task, None)  # the tiny backbone's size and rate: the shape is not used
    assert np.array_equal(context.frames, frames) and np.array_equal(context.reference_source, frames)
    assert context.reference_fps == 16.0
    slow = dataclasses.replace(task, extra={"miniworld": {**task.extra["miniworld"], "fps": 8}})
    assert adapter.context(slow, None).reference_fps == 8.0


def test_a_context_npz_is_read_for_its_two_arrays_only(full_suite, tmp_path):
    """A member someone added beside ``frames`` and ``camera_x`` (here bytes that are no array) is never
    decompressed: the context still loads, and only its two arrays come back."""
    import shutil
    import zipfile

    root, _ = full_suite
    task = next(t for t in load_manifest(root) if t.task_id == "real_003_revisit_01")
    own = tmp_path / "ctx"
    shutil.copytree(root, own, ignore=shutil.ignore_patterns("videos"))
    moved = dataclasses.replace(task, root=own)
    with zipfile.ZipFile(data_file(moved, "context_frames"), "a") as npz:
        npz.writestr("notes.npy", b"not an array")
    frames, cams = load_context(moved)
    want_frames, want_cams = load_context(task)
    assert np.array_equal(frames, want_frames) and np.array_equal(cams, want_cams)


def test_the_manifest_name_is_fixed_and_may_be_left_out(full_suite, tmp_path):
    root, _ = full_suite
    with pytest.raises(ConfigError, match="MiniWorld always writes metadata.jsonl; leave data.manifest at its default"):
        build_suite(_data_cfg(root, manifest="tasks.jsonl"))
    cfg = _data_cfg(root)
    del cfg["manifest"]  # a data config without the key: the default name
    assert build_suite(cfg) == root


def test_a_row_without_the_miniworld_extension_is_named_whatever_it_is():
    from types import SimpleNamespace

    from cmbench.miniworld.readers import extension

    assert extension(SimpleNamespace(task_id="t", extra={"miniworld": {"fps": 16}})) == {"fps": 16}
    for row in (SimpleNamespace(task_id="t", extra={}), SimpleNamespace(task_id="t"),
                SimpleNamespace(task_id="t", extra={"miniworld": [1, 2]})):
        with pytest.raises(MiniWorldDataError, match=r"^task t has no 'miniworld' extension \(not a MiniWorld row\)$"):
            extension(row)
