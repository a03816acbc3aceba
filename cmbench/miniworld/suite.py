"""Build the MiniWorld suite on disk in the official CMBench layout.

``build_suite(cfg.data)`` writes under ``cfg.data.root``::

    metadata.jsonl                         one official row per task, plus a "miniworld" extension
    videos/synthetic/syn_001.mp4 ...       context videos (16 fps, 32x32, lossy)
    videos/real/real_001.mp4 ...
    context/<source>/<id>.npz              lossless context: frames uint8 [F,32,32,3], camera_x int64 [F]
    ground_truth/<task_id>.npz             true continuation: frames, camera_x, target boxes/masks/visibility
    build.json                             build hash, config, counts, measured mp4 round-trip error

mp4 at 32x32 is lossy (chroma subsampling smears 12-px objects), so the lossless context frames are
stored next to every video and named by the row's ``miniworld.context_frames`` field (read them
with :func:`cmbench.miniworld.readers.load_context`).

The build is deterministic (a seed tree from ``world_seed``) and cached: ``build.json`` holds a hash
of every knob that changes the output; a second call with the same knobs returns at once.

Several processes may build one root at once (two lanes of a sweep, two runs on a fresh machine): the
build holds an inter-process lock (``.<root>.lock`` beside the root), writes into a private hidden
sibling folder and publishes it with a rename, so a reader never sees a half suite and a build killed
mid-way leaves only a hidden folder that the next build removes. A process that finds the lock held
waits, then uses the suite the holder published.

A rebuild replaces the root as a whole, so the builder writes only into a root that is missing, empty,
or a build of its own: one whose ``build.json`` is the builder's record (a regular file, not a link,
holding the build hash, version, config and counts) and which holds nothing but the suite's entries
(:data:`SUITE_ENTRIES`). A file, or a folder holding anything else (a user's files beside a suite, or
a folder of another kind), is refused in one line naming it and what is in the way.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cmbench import bounded_read
from cmbench.data.task import Reference, Task, as_box
from cmbench.data.video import read_video, write_video
from cmbench.errors import ConfigError, some
from cmbench.hashing import json_digest, sequence_seed
from cmbench.miniworld.episodes import EpisodeConfig, Episode, TaskPlan, allocate_tasks, continue_prompt, plan_episode
from cmbench.miniworld.readers import EXTENSION
from cmbench.miniworld.render import object_boxes, object_masks, render_video, visible_fraction
from cmbench.miniworld.scene import FRAME, SOURCES, Scene, check_width, scene_from_seed
from cmbench.lock import RunLock

BUILD_VERSION = 1  # bump when the generator changes what a given config produces
SUITE_ENTRIES = ("build.json", "metadata.jsonl", "videos", "context", "ground_truth")
"""What a suite root holds at its top level: a root that holds anything else is not the builder's."""
ID_PREFIX = {"synthetic": "syn", "real": "real"}


@dataclass(frozen=True)
class SourceCounts:
    """Contexts and tasks of one source."""

    videos: int
    reappear: int
    revisit: int

    @property
    def tasks(self) -> int:
        return self.reappear + self.revisit


@dataclass(frozen=True)
class SuiteConfig:
    """Every knob that changes the suite's content (hashed into ``build.json``)."""

    world_seed: int = 0
    fps: int = 16
    panorama_width: int = 256
    dynamic: bool = False
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    sources: dict[str, SourceCounts] = field(
        default_factory=lambda: {"synthetic": SourceCounts(50, 67, 35), "real": SourceCounts(8, 10, 4)}
    )

    @classmethod
    def from_data_config(cls, data: Any) -> "SuiteConfig":
        """Read the build knobs of ``configs/data/miniworld.yaml`` (a DictConfig or a dict)."""
        from omegaconf import OmegaConf

        raw = OmegaConf.to_container(data, resolve=True) if OmegaConf.is_config(data) else dict(data)
        if not isinstance(raw, dict):
            raise ConfigError(f"the MiniWorld data config must be a mapping of build knobs, got {type(raw).__name__}")
        if int(raw.get("height", FRAME)) != FRAME or int(raw.get("width", FRAME)) != FRAME:
            raise ConfigError(f"data.height/width must be {FRAME} for MiniWorld, got {raw.get('height')}x{raw.get('width')}")
        try:
            episode = EpisodeConfig(**{k: int(raw[k]) for k in EpisodeConfig.__dataclass_fields__ if k in raw})
            sources = {
                name: SourceCounts(int(c["videos"]), int(c["reappear"]), int(c["revisit"]))
                for name, c in (raw.get("sources") or {}).items()
            }
            cfg = cls(
                world_seed=int(raw.get("world_seed", 0)),
                fps=int(raw.get("fps", 16)),
                panorama_width=int(raw.get("panorama_width", 256)),
                dynamic=_flag(raw.get("dynamic", False)),
                episode=episode,
                sources=sources,
            )
            check_width(cfg.panorama_width)
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"invalid MiniWorld build config: {err}") from err
        unknown = set(cfg.sources) - set(SOURCES)
        if unknown or not cfg.sources:
            raise ConfigError(f"data.sources must name some of {SOURCES}, got {sorted(cfg.sources)}")
        return cfg

    def build_hash(self) -> str:
        return json_digest({"version": BUILD_VERSION, "config": asdict(self)})[:16]


def _flag(value: Any) -> bool:
    """A yes/no build knob (a YAML boolean; a string or number is refused rather than guessed)."""
    if not isinstance(value, bool):
        raise ValueError(f"data.dynamic must be true or false, got {value!r}")
    return value


def expected_counts(cfg: SuiteConfig) -> dict[str, Any]:
    """Counts of a suite built from ``cfg``, in the shape of a dataset spec's ``expected`` block."""
    by_source = {
        name: {"videos": c.videos, "tasks": c.tasks, "reappear": c.reappear, "revisit": c.revisit}
        for name, c in cfg.sources.items()
    }
    totals = {key: sum(block[key] for block in by_source.values()) for key in ("videos", "tasks", "reappear", "revisit")}
    return {**totals, "by_source": by_source}


def suite_plan(cfg: SuiteConfig) -> dict[str, list[list[str]]]:
    """Task types of every context, per source in :data:`SOURCES` order (the exact-count
    allocation, without rendering)."""
    max_tasks = min(cfg.episode.clips - 1, cfg.panorama_width // 32 - 2)
    plan = {}
    for source in (s for s in SOURCES if s in cfg.sources):
        counts = cfg.sources[source]
        rng = np.random.default_rng(sequence_seed(cfg.world_seed, SOURCES.index(source), 0))
        try:
            plan[source] = allocate_tasks(counts.videos, counts.reappear, counts.revisit, rng, max_tasks)
        except ValueError as err:
            raise ConfigError(f"data.sources.{source}: {err}") from err
    return plan


def _task_row(
    cfg: SuiteConfig, context_id: str, task_id: str, scene: Scene, scene_seed: int, episode: Episode, task: TaskPlan, video: str
) -> Task:
    source = scene.source
    ref_frame = task.reference_frame
    box = object_boxes(scene, episode.context_x[ref_frame : ref_frame + 1], task.target_id)[0]
    target = scene.objects[task.target_id]
    extension = {
        "scene_seed": scene_seed,
        "source": source,
        "panorama_width": scene.width,
        "dynamic": scene.dynamics is not None,
        "fps": cfg.fps,
        "clip_frames": cfg.episode.clip_frames,
        "context_camera_x": episode.context_x.tolist(),
        "continuation_camera_x": task.continuation_x.tolist(),
        "target_object_id": task.target_id,
        "target_description": target.description,
        "distractor_object_ids": scene.twins(task.target_id),
        "event_clip": task.event_clip,
        "context_frames": f"context/{source}/{context_id}.npz",
        "ground_truth": f"ground_truth/{task_id}.npz",
    }
    return Task(
        task_id=task_id,
        source=source,
        scene=f"{scene.background} with {len(scene.objects)} objects",
        video=video,
        context_clip_prompts=episode.clip_prompts,
        continue_prompt=continue_prompt(task, scene),
        task_type=task.task_type,
        target_label=target.category,
        target_aliases=target.aliases,
        references=(Reference(ref_frame / cfg.fps, as_box(box), ref_frame),),
        extra={EXTENSION: extension},
    )


def episode_stats(scene: Scene, episode: Episode) -> dict[str, Any]:
    """Memory statistics of one episode, on the token grid (a token column is 4 px wide).

    Returns
    -------
    dict with
        ``first_sight_fraction``: distinct world token columns seen / token columns shown by the
        context (what a cache keeping only first sightings would keep, 1 - its pruning ratio);
        ``continuation_seen_fraction``: per task, share of the continuation's token columns that the
        context showed; ``absence_frames``: per task, context frames after the target's last sighting;
        ``distractor_seen``: per task, whether a same-category twin appears in the context.
    """
    step = 4
    columns = scene.width // step

    def world_columns(cams: np.ndarray) -> np.ndarray:
        return (cams[:, None] // step + np.arange(FRAME // step)) % columns  # [F, 8]

    seen_columns = np.unique(world_columns(episode.context_x))
    shown = visible_fraction(scene, episode.context_x) > 0  # [F, n_objects]
    n = len(episode.context_x)
    return {
        "first_sight_fraction": len(seen_columns) / world_columns(episode.context_x).size,
        "continuation_seen_fraction": [
            float(np.isin(world_columns(t.continuation_x), seen_columns).mean()) for t in episode.tasks
        ],
        "absence_frames": [int(n - 1 - np.flatnonzero(shown[:, t.target_id])[-1]) for t in episode.tasks],
        "distractor_seen": [bool(shown[:, scene.twins(t.target_id)].any()) for t in episode.tasks],
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {name: round(float(f(values)), 4) for name, f in (("min", np.min), ("mean", np.mean), ("max", np.max))}


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # numpy's stub types the keyword arrays as the ``allow_pickle`` flag; the names here are field names
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]


def _build_into(out: Path, cfg: SuiteConfig) -> dict[str, Any]:
    """Write the whole suite under ``out``; returns the build record."""
    rows, video_errors, stats = [], {}, []
    ep = cfg.episode
    for source, contexts in suite_plan(cfg).items():
        index = SOURCES.index(source)
        for number, task_types in enumerate(contexts, start=1):
            context_id = f"{ID_PREFIX[source]}_{number:03d}"
            scene_seed = sequence_seed(cfg.world_seed, index, number, 1)
            scene = scene_from_seed(scene_seed, source, cfg.panorama_width, cfg.dynamic)
            rng = np.random.default_rng(sequence_seed(cfg.world_seed, index, number, 2))
            episode = plan_episode(scene, task_types, rng, ep)
            stats.append(episode_stats(scene, episode))
            frames = render_video(scene, episode.context_x)
            video = f"videos/{source}/{context_id}.mp4"
            write_video(out / video, frames, cfg.fps)
            decoded, _ = read_video(out / video)
            video_errors[context_id] = round(float(np.abs(decoded.astype(np.int16) - frames).mean()), 3)
            _write_npz(out / "context" / source / f"{context_id}.npz", frames=frames, camera_x=episode.context_x)
            numbers = {"reappear": 0, "revisit": 0}
            for task in episode.tasks:
                numbers[task.task_type] += 1
                task_id = f"{context_id}_{task.task_type}_{numbers[task.task_type]:02d}"
                row = _task_row(cfg, context_id, task_id, scene, scene_seed, episode, task, video)
                rows.append(row.to_json())
                cams = task.continuation_x
                _write_npz(
                    out / "ground_truth" / f"{task_id}.npz",
                    frames=render_video(scene, cams, first_frame=ep.context_frames),
                    camera_x=cams,
                    target_boxes=object_boxes(scene, cams, task.target_id),
                    target_masks=object_masks(scene, cams, task.target_id),
                    target_visible_fraction=visible_fraction(scene, cams)[:, task.target_id],
                    first_frame=np.int64(ep.context_frames),
                )
    (out / "metadata.jsonl").write_text("".join(json.dumps(r, sort_keys=False) + "\n" for r in rows))
    errors = np.array(list(video_errors.values()))
    return {
        "build_hash": cfg.build_hash(),
        "version": BUILD_VERSION,
        "config": asdict(cfg),
        "counts": expected_counts(cfg),
        "video_roundtrip_mean_abs_error": {"mean": round(float(errors.mean()), 3), "max": round(float(errors.max()), 3)},
        "memory_stats": {
            "first_sight_fraction": _summary([s["first_sight_fraction"] for s in stats]),
            "continuation_seen_fraction": _summary([v for s in stats for v in s["continuation_seen_fraction"]]),
            "absence_frames": _summary([v for s in stats for v in s["absence_frames"]]),
            "distractor_seen_fraction": round(float(np.mean([v for s in stats for v in s["distractor_seen"]])), 4),
        },
    }


def build_suite(data_cfg: Any) -> Path:
    """Build the MiniWorld suite at ``data_cfg.root`` unless an identical build is already there.

    Parameters
    ----------
    data_cfg : DictConfig or dict
        ``configs/data/miniworld.yaml`` (``root``, ``manifest``, ``fps``, ``height``, ``width`` and the
        build knobs: ``world_seed``, ``panorama_width``, the episode shape, ``sources``).

    Returns
    -------
    Path
        The suite root.

    Raises
    ------
    ConfigError
        For invalid knobs, or a non-empty root that was not written by this builder.
    """
    cfg = SuiteConfig.from_data_config(data_cfg)
    root = Path(str(data_cfg["root"]))
    if str(data_cfg.get("manifest", "metadata.jsonl")) != "metadata.jsonl":
        raise ConfigError("MiniWorld always writes metadata.jsonl; leave data.manifest at its default")
    if _is_build_of(root, cfg):  # the common case needs no lock
        return root
    with RunLock(root, on_wait=lambda who: print(f"MiniWorld: waiting for {who}, which is building {root}",
                                                 file=sys.stderr)):
        if _is_build_of(root, cfg):  # another process built it while this one waited
            return root
        check_root(root)
        for leftover in root.parent.glob(f".{root.name}.building-*"):  # of killed builds: the lock is ours
            shutil.rmtree(leftover, ignore_errors=True)
        staging = root.with_name(f".{root.name}.building-{os.getpid()}")  # the lock holder's alone
        staging.mkdir()
        try:
            built = _build_into(staging, cfg)
            (staging / "build.json").write_text(json.dumps(built, indent=2) + "\n")
            _publish(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return root


def check_root(root: Path) -> None:
    """Refuse to build at ``root`` unless it is missing, empty, or a build of this builder's alone.

    Raises
    ------
    ConfigError
        One line naming ``data.root``: a file; a folder whose ``build.json`` is not the builder's record;
        a build that also holds entries the builder did not write.
    """
    hint = "choose an empty or new data.root, so nothing of yours is replaced"
    if root.exists() and not root.is_dir():
        raise ConfigError(f"data.root={root}: is a file, not a folder; {hint}")
    if not root.exists():
        return
    try:
        entries = sorted(os.listdir(root))
    except OSError as err:
        raise ConfigError(f"data.root={root}: cannot be read: {err.strerror or err}; {hint}") from err
    if not entries:
        return
    others = [e for e in entries if e not in SUITE_ENTRIES]
    if build_record(root) is None:
        raise ConfigError(f"data.root={root}: not empty and not a MiniWorld build (it holds {some(entries)}; no build.json "
                          f"of the builder's); {hint}")
    if others:
        raise ConfigError(f"data.root={root}: a MiniWorld build that also holds {some(others)}, which the builder did not "
                          f"write (a rebuild replaces the whole folder); move {'them' if len(others) > 1 else 'it'} "
                          f"away, or {hint}")


def build_record(root: Path) -> dict[str, Any] | None:
    """``root``'s ``build.json`` when it is the builder's record (a regular file, not a link, within the
    bounded reader's limit of a build record, a JSON object with the build hash, version, config and
    counts), else None."""
    path = root / "build.json"
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        record = json.loads(bounded_read.read_bytes(path, "build record"))
    except (OSError, ValueError, bounded_read.ReadLimitError):
        return None
    keys = ("build_hash", "version", "config", "counts")
    return record if isinstance(record, dict) and all(k in record for k in keys) else None


def _is_build_of(root: Path, cfg: SuiteConfig) -> bool:
    """Whether ``root`` holds a finished build of ``cfg`` (``build.json`` is written last, and a root
    only ever appears whole, by a rename)."""
    if not (root / "metadata.jsonl").is_file():
        return False
    record = build_record(root)
    return record is not None and record.get("build_hash") == cfg.build_hash()


def _publish(staging: Path, root: Path) -> None:
    """Put the finished build ``staging`` at ``root`` by renames, so ``root`` is at every moment either
    the old build, missing, or the new build, never a mix; an old build is moved aside, then removed."""
    if not root.exists():
        staging.rename(root)
        return
    retired = root.with_name(f".{root.name}.building-{os.getpid()}-old")
    retired.mkdir()
    root.rename(retired / root.name)
    staging.rename(root)
    shutil.rmtree(retired, ignore_errors=True)
