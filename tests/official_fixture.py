"""Builders of small datasets in the official CMBench layout, for tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cmbench.data.video import write_video

FPS = 16
N_FRAMES = 32  # 2 seconds per context video


def official_row(task_id: str, video: str, source: str = "synthetic", task_type: str = "reappear", **over) -> dict:
    """One well-formed metadata row; keyword arguments replace or add fields."""
    row = {
        "type": source,
        "task_id": task_id,
        "scene": f"scene of {video}",
        "video": video,
        "context_clip_prompts": [{"clip_prompt": f"clip {i} of {video}"} for i in range(6)],
        "continue_prompt": "the camera turns back",
        "task_type": task_type,
        "target_label": "red vase",
        "target_aliases": ["vase", "pot"],
        "references": [{"timestamp_seconds": 0.5, "frame_index": 8, "bbox_xyxy_normalized": [0.1, 0.2, 0.5, 0.6]}],
    }
    row.update(over)
    return row


def write_context_video(path: Path, seed: int, n_frames: int = N_FRAMES) -> None:
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 255, size=(n_frames, 16, 16, 3), dtype=np.uint8)
    write_video(path, frames, FPS)


def write_manifest(root: Path, rows: list) -> Path:
    """Write rows (dicts, or raw strings for malformed lines) as metadata.jsonl."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path = root / "metadata.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def build_official_layout(root: Path) -> list[dict]:
    """A complete official-shaped set: 58 videos, 116 tasks with the official split.

    synthetic: 50 videos, 102 tasks (67 reappear / 35 revisit); real: 8 videos, 14 tasks (10 / 4).
    """
    rows = []
    plan = [("synthetic", "syn", 50, 67, 35), ("real", "real", 8, 10, 4)]
    seed = 0
    for source, prefix, n_videos, n_reappear, n_revisit in plan:
        types = ["reappear"] * n_reappear + ["revisit"] * n_revisit
        per_video = [types[i::n_videos] for i in range(n_videos)]  # round-robin: 1-3 tasks per video
        for v, video_types in enumerate(per_video, start=1):
            video = f"videos/{source}/{prefix}_{v:03d}.mp4"
            write_context_video(root / video, seed)
            seed += 1
            for k, task_type in enumerate(video_types, start=1):
                rows.append(official_row(f"{prefix}_{v:03d}_{task_type}_{k:02d}", video, source, task_type))
    write_manifest(root, rows)
    return rows
