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


def test_a_retrieval_row_counts_its_bytes_moved_per_chunk_and_models_their_transfer():
    g = fake_geometry()  # 2 layers, 2 heads of 12 channels, 4 tokens per frame, chunks of 2 frames
    backbone = AttentionBackbone(g)
    context = torch.randn(1, 3, 12, 4, 4, generator=torch.Generator().manual_seed(0))
    entries = {}
    for label, cfg in (("fullkv", {"name": "fullkv"}),
                       ("key_retrieval", {"name": "key_retrieval", "retrieval_frames": 2})):
        entries[label] = bench_speed.Entry(prefill(backbone, build_method(cfg), context, None, 0), 0.0)
        bench_speed.account(backbone, entries[label], None, 8, 1, record=False)
        entries[label].runs[1] = bench_speed.Runs([2.0], [0.0], [0.0], [0.0])
    # each generated chunk: the chunk leaving the recent window goes out compressed (its anchor frame and
    # ceil(0.5 * 4) of its other frame's tokens: 6), and one stored chunk of 6 tokens comes in
    per_way = 6 * g.num_layers * g.num_heads * g.head_dim * 2 * 4  # K and V, fp32
    assert entries["key_retrieval"].moved_bytes_per_chunk == 2 * per_way
    cost = bench_speed.CostModel(((0, 1.0), (100, 2.0)))
    rows = {r["method"]: r for r in bench_speed.summarise(12, 1, entries, cost, g, {})}
    row = rows["key_retrieval"]
    assert row["moved_mb_per_chunk"] == round(2 * per_way / 2**20, 4) and row["generated_chunks"] == 4
    assert row["transfer_ms_per_chunk_model"] == round(1e3 * 2 * per_way / 25e9, 4)
    assert row["peak_store_mb"] > 0
    assert rows["fullkv"]["moved_mb_per_chunk"] == rows["fullkv"]["transfer_ms_per_chunk_model"] == ""
    (line,) = bench_speed.transfer_lines(list(rows.values()))
    assert line.startswith("key_retrieval at 12 frames") and "of its measured 0.500 s per chunk" in line


@pytest.mark.slow
def test_end_to_end_on_a_random_tiny_model(tmp_path):
    csv_path, png = tmp_path / "b.csv", tmp_path / "b.png"
    # 16 context frames (4 chunks): DeCoPrune keeps the sink and two chunks dense, so 8 frames would prune nothing
    argv = ["--frames", "16", "--continuation", "8", "--repeats", "1", "--methods", "fullkv,streaming,decoprune@0.85,worldkv,key_retrieval",
            "--oracle-pairs", "2", "--weights", str(tmp_path / "missing.safetensors"), "--out-csv", str(csv_path),
            "--plot", str(png)]
    out = _script(argv)
    assert "weights: random init" in out and "intra-op threads [1]" in out
    rows = {r["method"]: r for r in bench_speed.read_csv(csv_path)}
    assert set(rows) == {"fullkv", "streaming", "decoprune@0.85", "decoprune@0.85:oracle", "worldkv", "key_retrieval"}
    assert rows["fullkv"]["realised_pr"] == 0 and rows["fullkv"]["speedup_vs_fullkv"] == 1
    assert rows["decoprune@0.85"]["model_calls"] == rows["fullkv"]["model_calls"] == 2 * 5
    assert rows["decoprune@0.85"]["peak_kv_mb"] < rows["fullkv"]["peak_kv_mb"]
    assert isinstance(rows["decoprune@0.85"]["oracle_overhead_paired"], float)
    assert rows["worldkv"]["model_calls"] == 2 * 5 and rows["key_retrieval"]["model_calls"] == 2 * 6  # + its probe
    for label in ("worldkv", "key_retrieval"):  # chunk 1 is stored by chunk 4 and comes back
        assert rows[label]["moved_mb_per_chunk"] > 0 and f"\n{label} at 16 frames, 1 thread(s): moved" in out
    assert rows["decoprune@0.85"]["moved_mb_per_chunk"] == "" and "\ndecoprune@0.85 at 16" not in out
    assert rows["fullkv"]["oracle_overhead_paired"] == ""
    assert all(r["threads"] == 1 and r["weights"].startswith("random init") for r in rows.values())
    assert png.stat().st_size > 0
    assert "| 16 | 1 | decoprune@0.85 |" in _script(["--from-csv", str(csv_path), "--plot", str(tmp_path / "again.png")])


def _script(argv: list[str]) -> str:
    """Run scripts/bench_speed.py; its stdout (asserting exit status 0)."""
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
