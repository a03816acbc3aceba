"""scripts/gpu_check.py at tiny shapes on the CPU: the same code as on the GPU, so the prepared check cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_runs_and_asserts_at_tiny_shapes(tmp_path):
    out = tmp_path / "check.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--tiny", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["failures"] == []
    methods = [r for r in report["rows"] if "method" in r]
    assert [r["method"] for r in methods] == ["fullkv", "decoprune@0.85"]
    for row in methods:
        assert abs(row["ratio"] - 1.0) <= 0.10 and row["peak_mib"] > 0 and row["fps"] > 0
    assert methods[0]["pr"] == 0.0 and 0.5 < methods[1]["pr"] <= 0.86
    (diffs,) = [r["host_memory_max_diff"] for r in report["rows"] if "host_memory_max_diff" in r]
    assert diffs == {"parked prefilled cache": 0.0, "offload_kv": 0.0}
    (precision,) = [r["precision_rel_err"] for r in report["rows"] if "precision_rel_err" in r]
    assert precision["bf16 + islands"] < 0.05 and precision["bf16 + islands"] <= precision["bf16 residual"]
    for part in ("[a]", "[b]", "[c]", "[check] OK"):
        assert part in done.stdout


def test_gpu_check_refuses_without_a_gpu_unless_tiny():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    done = subprocess.run([sys.executable, "scripts/gpu_check.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr
