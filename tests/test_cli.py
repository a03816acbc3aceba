"""The command line, run as a user runs it: `python -m cmbench ...` in a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from official_fixture import build_official_layout, official_row, write_context_video, write_manifest

pytestmark = pytest.mark.slow  # subprocesses of the real command line

REPO = Path(__file__).resolve().parents[1]


def cmbench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "cmbench", *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120
    )


def test_validate_passes_on_a_complete_official_fixture(tmp_path):
    build_official_layout(tmp_path)
    out = cmbench("validate", "data=cmbench", f"data.root={tmp_path}")
    assert out.returncode == 0, out.stderr
    assert "cmbench: OK, 116 valid task(s) over 58 video(s) (77 reappear, 39 revisit)" in out.stdout
    assert "real: 14 tasks / 8 videos" in out.stdout and "synthetic: 102 tasks / 50 videos" in out.stdout


def test_validate_lists_every_problem_and_fails(tmp_path):
    write_context_video(tmp_path / "videos/synthetic/syn_001.mp4", 0)
    good = official_row("a", "videos/synthetic/syn_001.mp4")
    rows = [good, official_row("b", "../../etc/passwd"), official_row("c", "videos/synthetic/syn_001.mp4", task_type="x")]
    write_manifest(tmp_path, rows)
    out = cmbench("validate", "data=cmbench", f"data.root={tmp_path}")
    assert out.returncode == 1
    err = out.stderr
    assert "metadata.jsonl:2: video: '../../etc/passwd' contains '..'" in err
    assert "metadata.jsonl:3: task_type: is 'x', expected one of 'reappear', 'revisit'" in err
    assert "<counts>.tasks: is 1, expected 116" in err
    assert "Traceback" not in err
    subset = cmbench("validate", "data=cmbench", f"data.root={tmp_path}", "data.check_counts=false")
    assert subset.returncode == 1 and "<counts>" not in subset.stderr


def test_validate_survives_hostile_rows_and_counts_only_valid_ones(tmp_path):
    """A NUL byte, an over-long path, 100k-deep nesting, 10**400 and a 5000-digit integer are each one
    ``file:line: field: reason`` line; the summary counts the rows without problems and those with."""
    video = "videos/synthetic/syn_001.mp4"
    write_context_video(tmp_path / video, 0)
    good = json.dumps(official_row("a", video))
    rows = [
        good,
        official_row("b", "videos/x\x00.mp4"),
        official_row("c", "v/" + "a" * 5000 + ".mp4"),
        "[" * 100_000 + "]" * 100_000,
        good.replace('"task_id": "a"', '"task_id": "e"').replace('"timestamp_seconds": 0.5', '"timestamp_seconds": 1' + "0" * 400),
        good.replace('"task_id": "a"', '"task_id": "f"').replace('"frame_index": 8', '"frame_index": 1' + "0" * 5000),
        official_row("a", video),  # a duplicate: parsed, but not a valid task
        official_row("h", video),
    ]
    write_manifest(tmp_path, rows)
    out = cmbench("validate", "data=cmbench", f"data.root={tmp_path}", "data.check_counts=false")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    m = f"{tmp_path}/metadata.jsonl"
    for line, field in [(2, "video"), (3, "video"), (4, "<json>"), (5, "references[0].timestamp_seconds"),
                        (6, "<json>"), (7, "task_id")]:
        assert re.search(rf"^  {re.escape(m)}:{line}: {re.escape(field)}: .+$", out.stderr, re.M), (line, out.stderr)
    assert "cmbench: 2 valid task(s) over 1 video(s) (2 reappear, 0 revisit); 6 row(s) with problems" in out.stderr


def test_ls_lists_groups_and_user_configs(tmp_path):
    (tmp_path / "method").mkdir()
    (tmp_path / "method/my_press.yaml").write_text("description: my own pruning\npaper: arXiv 0000.00000\n")
    out = cmbench("ls", env={"CMBENCH_CONFIG_PATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert "data/" in out.stdout and "miniworld" in out.stdout and "cmbench" in out.stdout
    assert re.search(r"^  my_press +my own pruning  \[arXiv 0000\.00000\]$", out.stdout, re.M)
    only = cmbench("ls", "method", env={"CMBENCH_CONFIG_PATH": str(tmp_path)})
    assert "data/" not in only.stdout and "my own pruning" in only.stdout
    assert cmbench("ls", "nonsense").returncode == 2


def test_prepare_official_offline_fails_fast_with_instructions(tmp_path):
    start = time.monotonic()
    out = cmbench("prepare", "data=cmbench", f"data.root={tmp_path / 'cm'}")
    assert out.returncode == 1
    assert time.monotonic() - start < 60
    assert "cannot download dataset Aoraku/CMBench" in out.stderr
    assert "--repo-type dataset" in out.stderr and str(tmp_path / "cm" / "metadata.jsonl") in out.stderr


def test_unknown_command_suggests_the_closest():
    out = cmbench("valdiate")
    assert out.returncode == 2 and "Did you mean 'validate'?" in out.stderr
