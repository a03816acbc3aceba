"""The speed benchmark: the cost model, the oracle replay and a tiny end-to-end run of scripts/bench_speed.py
(no timing asserts)."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cmbench.benchmarks import speed as bench_speed
from cmbench.generation import continue_task, prefill
from cmbench.methods.oracle import OracleMask
from cmbench.methods.registry import build_method
from fakes import AttentionBackbone, fake_geometry

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_speed.py"


def test_cost_model_interpolates_and_extrapolates_the_measured_points():
    cost = bench_speed.CostModel(((0, 1.0), (10, 2.0), (20, 4.0)))
    assert cost.a == 1.0 and cost.per_key_at_full == pytest.approx(0.15)
    assert cost.seconds(5) == pytest.approx(1.5) and cost.seconds(15) == pytest.approx(3.0)
    assert cost.seconds(30) == pytest.approx(6.0)  # along the last segment
    assert cost.continuation([0, 40, 80], heads=4) == pytest.approx(1.0 + 2.0 + 4.0)


def test_oracle_replays_decoprunes_keep_pattern_exactly():
    g = fake_geometry(num_heads=4)
    backbone = AttentionBackbone(g)
    context = torch.randn(1, 3, 12, 4, 4, generator=torch.Generator().manual_seed(0))
    method = build_method({"name": "decoprune", "quota_pr": 0.6})
    pre = prefill(backbone, method, context, None, 0)
    entry = bench_speed.Entry(pre, 0.0)
    bench_speed.account(backbone, entry, None, 8, 1, record=True)
    assert sorted(entry.survivors) == [6, 7, 8, 9]
    deco = continue_task(backbone, pre, None, 8, 1)
    assert deco.decide_seconds > 0.0  # the loop times the method's decisions
    oracle = OracleMask(survivors=entry.survivors, initial_layout=method.layout(g), before=entry.before)
    replay = continue_task(backbone, dataclasses.replace(pre, method=oracle), None, 8, 1)
    assert torch.equal(replay.latents, deco.latents)
    assert replay.ledger.summary() == deco.ledger.summary()
    for a, b in zip(replay.cache.all_banks(), deco.cache.all_banks()):
        assert torch.equal(a.field("gid"), b.field("gid"))
    heads = g.num_layers * g.num_heads
    assert len(entry.calls) == 4 * 5  # 4 steps + the t = 0 pass per chunk: the probe reuses the trajectory
    assert entry.calls[0] == pre.cache.banks[0][0].n * heads


@pytest.mark.slow
def test_end_to_end_on_a_random_tiny_model(tmp_path):
    csv_path, png = tmp_path / "b.csv", tmp_path / "b.png"
    # 16 context frames (4 chunks): DeCoPrune keeps the sink and two chunks dense, so 8 frames would prune nothing
    argv = ["--frames", "16", "--continuation", "8", "--repeats", "1", "--methods", "fullkv,streaming,decoprune@0.85",
            "--oracle-pairs", "2", "--weights", str(tmp_path / "missing.safetensors"), "--out-csv", str(csv_path),
            "--plot", str(png)]
    out = _script(argv)
    assert "weights: random init" in out and "intra-op threads [1]" in out
    rows = {r["method"]: r for r in bench_speed.read_csv(csv_path)}
    assert set(rows) == {"fullkv", "streaming", "decoprune@0.85", "decoprune@0.85:oracle"}
    assert rows["fullkv"]["realised_pr"] == 0 and rows["fullkv"]["speedup_vs_fullkv"] == 1
    assert rows["decoprune@0.85"]["model_calls"] == rows["fullkv"]["model_calls"] == 2 * 5
    assert rows["decoprune@0.85"]["peak_kv_mb"] < rows["fullkv"]["peak_kv_mb"]
    assert isinstance(rows["decoprune@0.85"]["oracle_overhead_paired"], float)
    assert rows["fullkv"]["oracle_overhead_paired"] == ""
    assert all(r["threads"] == 1 and r["weights"].startswith("random init") for r in rows.values())
    assert png.stat().st_size > 0
    assert "| 16 | 1 | decoprune@0.85 |" in _script(["--from-csv", str(csv_path), "--plot", str(tmp_path / "again.png")])


def _script(argv: list[str]) -> str:
    """Run scripts/bench_speed.py; its stdout (asserting exit status 0)."""
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
