"""`python -m cmbench run` end to end with a tiny LingBot-shaped backbone on an official-format dataset.

The backbone is loaded exactly as the real one (config in a user config folder, DiT in LingBot's
release layout, VAE / umt5 / tokenizer in diffusers layout), with camera and I2V conditioning, a
tiny AutoencoderKLWan and a tiny umt5; the task brings an explicit camera plan."""

from __future__ import annotations

import pytest
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from cmbench.data.video import read_video
from cmbench.runs.records import read_all_records
from official_fixture import official_row, write_context_video, write_manifest
from tiny_lingbot import write_tiny_lingbot

pytestmark = pytest.mark.slow  # subprocesses of the real command line

REPO = Path(__file__).resolve().parents[1]


def turning_camera(n_frames: int) -> list:
    """Camera-to-world poses turning 2 degrees per frame about the vertical axis."""
    poses = []
    for i in range(n_frames):
        a = np.deg2rad(2.0 * i)
        pose = np.eye(4)
        pose[:3, :3] = [[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]]
        poses.append(pose.tolist())
    return poses


def test_tiny_lingbot_runs_a_task_through_cmbench_run(tmp_path):
    # the memory plan runs before loading (the dataset's longest context, read from its videos), and each
    # prefilled cache is parked in host memory while its task runs
    configs = write_tiny_lingbot(tmp_path, memory={"offloads": "auto", "context_seconds": None, "park_prefill": True})
    data = tmp_path / "data"
    write_context_video(data / "videos" / "synthetic" / "syn_001.mp4", seed=0)  # 32 frames: 12 latent frames
    camera = {"c2w": turning_camera(64), "intrinsics": [8.0, 8.0, 8.0, 8.0], "image_size": [16, 16]}
    write_manifest(data, [official_row("syn_001_reappear_01", "videos/synthetic/syn_001.mp4", camera=camera)])

    cmd = [sys.executable, "-m", "cmbench", "run", "data=cmbench", f"data.root={data}", "data.check_counts=false",
           "limit=1", "backbone=lingbot_tiny", "method=decoprune", "generation.continuation_frames=4",
           f"out_dir={tmp_path / 'runs'}", "progress=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CMBENCH_CONFIG_PATH": str(configs),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]

    (run_dir,) = [p for p in (tmp_path / "runs" / "cmbench").iterdir() if p.is_dir() and p.name != "leaderboard"]
    assert run_dir.name.startswith("decoprune__lingbot_tiny__")
    (record,) = read_all_records(run_dir)
    assert record["status"] == "ok", record.get("error")
    assert record["task_id"] == "syn_001_reappear_01"
    # 4 latent frames decoded after the context's 12 (as the authors decode the timeline): 4 * 4 frames
    assert record["continuation_frames"] == 16
    assert len(record["similarities"]) == 16 and 0.0 <= record["score"] <= 1.0
    assert 0.0 <= record["pr"] < 1.0 and 0.0 <= record["context_pr"] < 1.0
    # 3 context chunks of 16 tokens and 1 generated chunk, 2 layers x 2 heads x 12 channels, K and V, float32
    assert 0 < record["peak_kv_bytes"] <= 4 * 16 * 2 * 24 * 2 * 4
    assert record["prefill_seconds"] > 0 and record["continuation_seconds"] > 0
    frames, _ = read_video(run_dir / "videos" / "syn_001_reappear_01.mp4")
    assert frames.shape == (16, 32, 32, 3)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["backbone"]["dit"]["in_channels"] == 36 and config["backbone"]["width"] == 32
    assert json.dumps(record)  # the record is plain JSON
