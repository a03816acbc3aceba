"""scripts/gpu_check_scorer.py at tiny shapes on a CPU: the GPU check's code path stays alive and
its assertions fire."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_check_runs_at_tiny_shapes(tmp_path):
    out = tmp_path / "check.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu_check_scorer.py"), "--tiny", "--device", "cpu", "--threads", "1",
         "--frames", "4", "--rounds", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all asserted checks passed" in run.stdout
    report = json.loads(out.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    for name in ("preprocess_detector_max_grey_levels", "preprocess_segmenter_max_grey_levels",
                 "preprocess_segmenter_scattered_max_grey_levels", "preprocess_embedder_max_grey_levels", "embedding_cosine_fp32_vs_bf16", "positive_fp32_finite"):
        assert checks[name]["asserted"] and checks[name]["passed"], name
    for name in ("positive_score", "positive_minus_negative", "mask_iou_fp32_vs_bf16", "positive_score_fp32_vs_bf16"):
        assert not checks[name]["asserted"], name  # random weights: reported only
    quality = ("subject_consistency", "background_consistency", "aesthetic_quality")  # VBench's network metrics
    assert set(report["scores"]) == {"positive_fp32", "negative_fp32", "positive_bf16", "negative_bf16",
                                     "quality_absent", *(f"quality_{q}" for q in quality)}
    for q in quality:  # the scorer's batched path against VBench's one-frame definition, asserted even here
        check = checks[f"quality_{q}_vs_vbench_definition"]
        assert check["asserted"] and check["passed"] and check["value"] <= 1e-4, q
        assert not checks[f"quality_{q}_fp32_vs_bf16"]["asserted"], q  # random weights: reported only
        assert 0.0 <= report["scores"][f"quality_{q}"]["fp32"] <= 1.0 or q == "aesthetic_quality"
    assert {r["stage"] for r in report["timings"]["preprocess_ms_per_frame"]} == {"owl", "sam2", "sam2_scattered", "dinov2", "total"}
    assert set(report["timings"]["positive_fp32_ms_per_frame"]) == {"total", "detect", "segment", "embed"}


@pytest.mark.slow
def test_gpu_check_asserts(monkeypatch, tmp_path):
    """The check the script ends with (``CheckReport.require_passed``) fires on a failed bound."""
    from cmbench.benchmarks import scorer_check
    from cmbench.scoring.tiny_models import tiny_deep_scorer_config, tiny_quality_settings

    monkeypatch.setattr(scorer_check, "PREPROCESS_MAX_GREY_LEVELS", -1.0)  # no preprocessing can pass this
    report = scorer_check.run_check(tiny_deep_scorer_config(tmp_path), "cpu", tiny=True, n_frames=2, rounds=1)
    with pytest.raises(AssertionError, match="preprocess_detector_max_grey_levels"):
        report.require_passed()
    monkeypatch.setattr(scorer_check, "PREPROCESS_MAX_GREY_LEVELS", 2.01)
    monkeypatch.setattr(scorer_check, "QUALITY_FP32_MAX_DIFF", -1.0)  # no quality metric can pass this
    cfg = tiny_deep_scorer_config(tmp_path)  # as the script's --tiny: the tiny quality networks too
    cfg["quality_settings"] = tiny_quality_settings(tmp_path / "quality")
    cfg["quality"] = list(cfg["quality_settings"])
    report = scorer_check.run_check(cfg, "cpu", tiny=True, n_frames=2, rounds=1)
    with pytest.raises(AssertionError, match="quality_subject_consistency_vs_vbench_definition"):
        report.require_passed()
