"""The tiny model's training options: span-limited temporal positions, starting from saved weights."""

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cmbench.backbones.dit import BlockCausalAttention, DiTConfig
from cmbench.backbones.tiny import TinyConfig, TinyWorldModel, default_config
from cmbench.backbones.tiny_training import (
    MAX_STRIDE,
    MIN_STRIDE,
    DataRecipe,
    clip_frame_positions,
    learning_rate,
    load_initial_dit,
    make_batch,
    random_frame_positions,
)
from cmbench.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def small_config(dim: int = 32) -> TinyConfig:
    dit = DiTConfig(in_channels=12, out_channels=12, dim=dim, ffn_dim=2 * dim, num_heads=2, num_layers=2, camera_dim=3)
    rope = {"t": {"dim": 4, "kind": "log", "theta": 10000.0}, "h": {"dim": 4, "kind": "periodic", "period": 16.0},
            "w": {"dim": 8, "kind": "periodic", "period": 64.0}}
    return TinyConfig(dit=dit, rope=rope)


def strides(pos: np.ndarray) -> np.ndarray:
    return np.diff(pos)


@pytest.mark.parametrize("n_frames,max_span", [(32, 32.0), (32, 20.0), (16, 32.0), (64, 17.0)])
def test_span_limited_positions_never_exceed_the_span(n_frames, max_span):
    rng = np.random.default_rng(0)
    spans, longest_stride = [], 0.0
    for _ in range(2000):
        pos = random_frame_positions(rng, n_frames, 4, max_span=max_span)
        assert pos.shape == (n_frames,) and np.all(strides(pos) > 0)
        spans.append(pos[-1] - pos[0])
        longest_stride = max(longest_stride, strides(pos).max())
    hi = min(MAX_STRIDE, max_span / (n_frames - 1))
    assert max(spans) <= max_span + 1e-9
    assert longest_stride <= hi + 1e-9 and longest_stride > 0.9 * hi  # the range's top is reached
    assert min(spans) < (n_frames - 1) * 2 * MIN_STRIDE  # squeezed sequences (the re-index's stride) occur


def test_unlimited_positions_reach_long_offsets_and_change_stride_at_chunk_boundaries():
    rng = np.random.default_rng(1)
    spans = []
    for _ in range(500):
        pos = random_frame_positions(rng, 32, 4)
        s = strides(pos)
        assert np.all(s >= MIN_STRIDE - 1e-12) and np.all(s <= MAX_STRIDE + 1e-12)
        changes = np.flatnonzero(~np.isclose(s[1:], s[:-1])) + 2  # frame index where a new stride starts
        assert np.all(changes % 4 == 0) and len(changes) <= 2
        spans.append(pos[-1] - pos[0])
    assert max(spans) > 200


def test_a_span_below_the_smallest_stride_is_refused():
    with pytest.raises(ValueError, match="max_span"):
        random_frame_positions(np.random.default_rng(0), 32, 4, max_span=1.0)


def test_initial_weights_reproduce_the_saved_models_outputs(tmp_path):
    cfg = small_config()
    torch.manual_seed(0)
    saved = TinyWorldModel(cfg)
    path = tmp_path / "w.safetensors"
    saved.save_pretrained(path)
    loaded = TinyWorldModel(cfg, load_initial_dit(path, cfg))
    x = torch.randn(1, 12, 8, 16, 16)
    t = torch.tensor([[0.0] * 4 + [0.9] * 4])
    cams, pos = np.arange(8) * 4, np.arange(8, dtype=np.float64)
    attn = BlockCausalAttention([(0, False), (1, True)], saved.geometry.tokens_per_chunk)
    with torch.no_grad():
        a = saved.predict(x, t, cams, pos, attn)
        b = loaded.predict(x, t, cams, pos, attn)
    assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="differs"):
        load_initial_dit(path, small_config(dim=64))
    with pytest.raises(ConfigError, match="need"):
        load_initial_dit(tmp_path / "missing.safetensors", cfg)


def test_script_starts_from_weights_at_a_schedule_step(tmp_path):
    """Zero training steps from --init-weights save exactly the initial weights and log their eval."""
    cfg = default_config()
    torch.manual_seed(1)
    init = tmp_path / "init.safetensors"
    TinyWorldModel(cfg).save_pretrained(init)
    out = tmp_path / "out" / "w.safetensors"
    args = ["--init-weights", str(init), "--start-step", "7", "--stop-step", "7", "--steps", "10",
            "--eval-cases", "1", "--log-dir", str(tmp_path / "log"), "--out", str(out)]
    script = subprocess.run([sys.executable, str(REPO / "scripts" / "train_tiny_backbone.py"), *args],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert script.returncode == 0, script.stderr[-3000:]
    a, b = load_file(str(init)), load_file(str(out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = list(csv.reader((tmp_path / "log" / "eval.csv").open()))
    assert rows[0][0] == "step" and [r[0] for r in rows[1:]] == ["7", "7"] * 2  # at the start and at the end
    record = TinyWorldModel.from_pretrained(out).config.training
    assert record["steps_done"] == 7 and record["start_step"] == 7 and record["init_training"] == {}


def test_learning_rate_schedule_and_rewarm_up_from_a_start_step():
    assert learning_rate(0, 2400, 1e-3, 100) == pytest.approx(1e-5)
    full = learning_rate(1300, 2400, 1e-3, 100)
    assert full == pytest.approx(1e-3 * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * 1200 / 2300))))  # 4.93e-4
    assert learning_rate(2400, 2400, 1e-3, 100) == pytest.approx(5e-5)
    assert learning_rate(1300, 2400, 1e-3, 100, start=1300, rewarmup=50) == pytest.approx(full / 50)
    assert learning_rate(1349, 2400, 1e-3, 100, start=1300, rewarmup=50) == pytest.approx(
        learning_rate(1349, 2400, 1e-3, 100))


def test_temporal_probe_reports_every_layout_and_the_temporal_energy_share():
    from cmbench.backbones.tiny_probe import COLUMNS, layouts, probe

    model = TinyWorldModel.random(0, default_config())
    losses, shares = probe(model, n_batches=1, seed=0, dynamic=True)
    assert list(losses) == list(layouts(np.random.default_rng(0)))
    assert all(len(v) == len(COLUMNS) == 4 and all(np.isfinite(v)) for v in losses.values())
    # a random model still reads its temporal positions: the probe sees the change
    assert losses["permuted"][0] != losses["true (stride 1)"][0]
    assert len(shares) == model.config.dit.num_layers and all(0 < q < 1 and 0 < k < 1 for q, k in shares)


def test_clip_positions_are_true_time_from_a_random_offset():
    rng = np.random.default_rng(4)
    starts = []
    for _ in range(200):
        pos = clip_frame_positions(rng, 32)
        assert np.allclose(np.diff(pos), 1.0, rtol=0, atol=1e-9)
        starts.append(pos[0])
    assert 0 <= min(starts) and max(starts) < 200 and np.std(starts) > 30


def test_a_true_time_dynamic_batch_has_clip_positions_and_moving_frames():
    cfg = default_config()
    recipe = DataRecipe(p_real=0.0, dynamic=True, positions="true")
    batch = make_batch(np.random.default_rng(5), cfg, 2, 4, recipe, torch.Generator().manual_seed(0))
    clean = batch.frame_positions[:, :16]
    assert np.allclose(np.diff(clean, axis=1), 1.0)  # stride 1 over the 16 clean frames
    assert np.array_equal(batch.frame_positions[:, 16:], clean[:, 4:])  # noisy copies sit at their chunks' times


def test_weights_start_under_new_rotary_frequencies_only_when_asked(tmp_path):
    cfg = small_config()
    torch.manual_seed(0)
    path = tmp_path / "w.safetensors"
    TinyWorldModel(cfg).save_pretrained(path)
    faster = TinyConfig(dit=cfg.dit, rope={**cfg.rope, "t": {"dim": 4, "kind": "log", "theta": 100.0}})
    with pytest.raises(ConfigError, match="rope"):
        load_initial_dit(path, faster)
    loaded = load_initial_dit(path, faster, new_rope=True)
    saved = load_file(str(path))
    assert all(torch.equal(value, saved[key]) for key, value in loaded.state_dict().items())
    screen = TinyConfig(dit=cfg.dit, rope={**cfg.rope, "w": {"dim": 8, "kind": "periodic", "period": 16.0}}, keys="screen")
    with pytest.raises(ConfigError, match="keys"):  # world and screen keys are different networks
        load_initial_dit(path, screen, new_rope=True)
