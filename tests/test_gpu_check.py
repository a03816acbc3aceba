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
    out = tmp_path / "check"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--tiny", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
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
    table = report["table"]
    parts = {r["part"] for r in table}
    assert parts == set("abcefgh")
    # (e): every small case's plan as committed, its weights and full-precision held bytes asserted
    assert sum(r["check"].endswith("plan as committed") and r["result"] == "ok" for r in table) == 6
    assert any(r["part"] == "e" and "held" in r["check"] and r["result"] == "ok" for r in table)
    # (f) the fused kernel against one SDPA call; (h) two tasks equal to the committed CPU records
    assert any(r["part"] == "f" and "vs one SDPA call" in r["check"] and r["result"] == "ok" for r in table)
    assert sum(r["part"] == "h" and r["result"] == "ok" for r in table) == 5
    assert (out / "gpu_check.md").read_text().startswith("| part | check |")
    for part in ("[a]", "[b]", "[c]", "[e] done", "[f]", "[g] done", "[h] done", "[check] OK"):
        assert part in done.stdout


def test_a_check_whose_record_drifted_from_the_committed_one_fails(tmp_path, monkeypatch):
    """(h) against expectations that differ from what the run gives: each task's difference is a failure."""
    from cmbench.benchmarks import gpu_loan
    from cmbench.benchmarks.gpu_check import Report

    expected = gpu_loan.load_expected()
    records = [dict(r) for r in expected["miniworld"]]
    records[0]["score"] += 0.5
    monkeypatch.setattr(gpu_loan, "miniworld_records", lambda device, folder: records)
    report = Report()
    gpu_loan.check_miniworld(report, "cpu", tmp_path, expected)
    assert report.failures == [f"(h) {records[0]['task_id']} score vs CPU record (abs): 0.5, bound <= 0.02"]
    records.pop()
    report = Report()
    gpu_loan.check_miniworld(report, "cpu", tmp_path, expected)
    assert report.failures[0].startswith("(h) tasks run = committed tasks: 1,")


def test_an_unknown_part_is_one_line():
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--tiny", "--parts", "ax"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "gpu_check: --parts 'ax': no part 'x' (the parts are abcefgh)"


def test_gpu_check_refuses_without_a_gpu_unless_tiny():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    done = subprocess.run([sys.executable, "scripts/gpu_check.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr
