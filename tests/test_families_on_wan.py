"""Every family of KV compression on the Wan backbone path, at tiny shapes: quantized storage (KIVI at 2
and 4 bits, Quant VideoGen), low-rank keys, merging (TempCache), their compositions with eviction and retrieval, and
the kvpress presses, each through `evaluate` with a tiny LingBot-shaped backbone loaded as the real one.

The geometry is LingBot's at tiny size: 2 layers, 2 heads of 12 channels, 16 tokens per latent frame,
chunks of 4 latent frames; the context has 96 frames, and 4 latent frames are generated (16 decoded
frames). Group sizes of 4 divide the head size; ``residual=0`` quantizes every
committed token, so each format's bytes are below full precision's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cmbench.api import evaluate
from official_fixture import official_row, write_context_video, write_manifest
from test_kvpress_adapter import needs_kvpress, presses
from test_wan_run import turning_camera
from tiny_lingbot import write_tiny_lingbot

pytestmark = pytest.mark.slow  # whole runs of a tiny model, in process

TASK = "syn_001_reappear_01"
KIVI = ["storage=kivi", "storage.group_size=4", "storage.residual=0"]
QVG = ["storage=qvg", "storage.group_size=4", "storage.residual=0", "storage.clusters=2"]


@pytest.fixture(scope="module")
def lingbot_folder(tmp_path_factory) -> Path:
    """Config folder, model, components and a one-task dataset with a camera plan (for WorldKV)."""
    root = tmp_path_factory.mktemp("families_on_wan")
    write_tiny_lingbot(root, memory={"offloads": "off", "context_seconds": None})
    write_context_video(root / "data" / "videos" / "synthetic" / "syn_001.mp4", seed=0, n_frames=96)
    camera = {"c2w": turning_camera(128), "intrinsics": [8.0, 8.0, 8.0, 8.0], "image_size": [16, 16]}
    write_manifest(root / "data", [official_row(TASK, "videos/synthetic/syn_001.mp4", camera=camera)])
    write_key_basis(root / "model")
    return root


def write_key_basis(model: Path) -> None:
    """A key basis for the tiny LingBot's weights (2 layers of 2 heads of head dim 12) beside them, fitted on
    random keys: these runs test the low-rank format's path through a Wan backbone, not its basis."""
    from cmbench.cache.lowrank import basis_path, fit_basis, save_basis
    from cmbench.identity.code import path_fingerprint

    fitted = [fit_basis(torch.randn(200, 2, 12, generator=torch.Generator().manual_seed(layer))) for layer in range(2)]
    save_basis(basis_path(model), torch.stack([b for b, _ in fitted]), torch.stack([s for _, s in fitted]),
               {"weights": path_fingerprint(model)})


def run(root: Path, method: str, overrides: list[str], monkeypatch, tmp_path) -> dict:
    """The one record of ``method`` with ``overrides`` on the tiny LingBot backbone."""
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(root / "configs"))
    result = evaluate(method, data="cmbench", backbone="lingbot_tiny", task_ids=[TASK], out_dir=tmp_path / "runs",
                      overrides=[f"data.root={root / 'data'}", "data.check_counts=false",
                                 "generation.continuation_frames=4", *overrides])
    (record,) = result.records.to_dict("records")
    assert record["status"] == "ok", record.get("error")
    assert 0.0 <= record["score"] <= 1.0 and len(record["similarities"]) == 16
    return record


@pytest.mark.parametrize(("method", "overrides", "pruned"), [
    ("fullkv", [*KIVI, "storage.bits=4"], False),
    ("fullkv", [*KIVI, "storage.bits=2"], False),
    ("fullkv", [*QVG, "storage.bits=2"], False),
    ("fullkv", ["storage=lowrank", "storage.rank=6"], False),
    ("decoprune", ["storage=lowrank", "storage.rank=6", "method.quota_pr=0.5", "method.recent_chunks=1"], True),
    ("decoprune", [*KIVI, "storage.bits=4", "method.quota_pr=0.5", "method.recent_chunks=1"], True),
    ("streaming", [*KIVI, "storage.bits=2", "method.recent_chunks=1"], True),
    ("worldkv", [*KIVI, "storage.bits=4", "method.retrieval_frames=4"], True),
    ("tempcache", ["method.threshold=-1.0"], True),
], ids=["kivi4", "kivi2", "qvg2", "lowrank6", "decoprune+lowrank6", "decoprune+kivi4", "streaming+kivi2", "worldkv+kivi4", "tempcache"])
def test_each_family_and_composition_runs_on_the_wan_path_below_full_precision_bytes(
        lingbot_folder, monkeypatch, tmp_path, method, overrides, pruned):
    """Each run finishes and scores; its device KV bytes are below FullKV's in the same ledger, and only
    the setups that drop or merge tokens report a pruning ratio (a storage format alone keeps every
    token). TempCache at threshold -1 merges every mergeable history key."""
    record = run(lingbot_folder, method, overrides, monkeypatch, tmp_path)
    assert 0.0 < record["kv_bytes_ratio"] < 1.0
    assert record["mean_kv_bytes"] < record["fullkv_kv_bytes"]
    assert (record["pr"] > 0.0) == pruned


def test_full_precision_fullkv_on_the_wan_path_stores_fullkvs_bytes(lingbot_folder, monkeypatch, tmp_path):
    """The byte ledger's reference: FullKV in full precision stores exactly what FullKV stores."""
    record = run(lingbot_folder, "fullkv", [], monkeypatch, tmp_path)
    assert record["kv_bytes_ratio"] == 1.0 and record["pr"] == 0.0
    assert record["mean_kv_bytes"] == record["fullkv_kv_bytes"]


@needs_kvpress
@pytest.mark.parametrize("press", presses())
def test_each_listed_kvpress_press_runs_on_the_wan_path(lingbot_folder, monkeypatch, tmp_path, press):
    """Every press ``ls method`` lists runs through the adapter on the tiny LingBot backbone, pruning
    history tokens (compression ratio 0.5, one recent chunk) and storing fewer bytes than FullKV."""
    record = run(lingbot_folder, "kvpress", [f"method.press={press}", "method.compression_ratio=0.5",
                                             "method.recent_chunks=1"], monkeypatch, tmp_path)
    assert record["pr"] > 0.0 and 0.0 < record["kv_bytes_ratio"] < 1.0
