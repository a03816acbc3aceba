"""Ulysses sequence parallelism on the CPU (gloo): a split run equals the one-process run.

2 and 4 processes run the committed tiny MiniWorld model (a Wan-shaped DiT with 4 heads) under FullKV,
DeCoPrune, DeCoPrune-HS, ForcingKV, DummyForcing and TempDiff (2 processes: WorldKV and key retrieval
too), with the cross-rank mask checksum on: continuation latents within fp32 tolerance, and both PR
ledgers (per-chunk visible and full tokens, peak stored bytes, host-store peak and bytes moved), kept
tokens per chunk and the token ids every (layer, head) holds, at the end and while each chunk is
denoised (restored tokens included), identical; each rank stores 1/P of the K/V.
"""

from __future__ import annotations

import json

import pytest
import torch

from cmbench.backbones.memory.kv import retention, simulate_kv
from cmbench.backbones.tiny import TinyWorldModel
from cmbench.errors import ConfigError
from cmbench.methods.registry import build_method
from cmbench.methods.worldkv import anchor_novelty_keep
from cmbench.parallel import SequenceGroup, split_backbone
from cmbench.parallel.cache import local_layout
from cmbench.benchmarks.split_runs import run_methods, spawn_split
from cmbench.shipped import PACKAGE_ROOT

HEAD_MAP = str(PACKAGE_ROOT / "backbones" / "weights" / "tiny_miniworld_dynamic_head_map.json")
METHODS = [{"name": "fullkv"}, {"name": "decoprune"}, {"name": "decoprune_hs", "head_map": HEAD_MAP},
           {"name": "forcingkv", "head_map": HEAD_MAP}, {"name": "dummyforcing"},
           {"name": "tempdiff"}]
SHAPE = {"context_chunks": 2, "continuation_chunks": 2}


@pytest.fixture(scope="module", autouse=True)
def ranks_from_a_warm_fork_server():
    """spawn_split's ranks forked from one fork server that imported torch and CMBench once, instead of each
    rank a fresh interpreter importing them again (~3 s of CPU per rank, 10 ranks in this file). What the tests
    compare, every rank's records against the one-process run, is the same however a rank's process starts;
    ``torchrun`` launches real runs' ranks (tests/test_parallel_run.py)."""
    import multiprocessing

    import torch.multiprocessing as mp

    from cmbench.benchmarks import split_runs

    multiprocessing.get_context("forkserver").set_forkserver_preload(["cmbench.benchmarks.split_runs"])

    def spawn(fn, args=(), nprocs=1, join=True, daemon=False):
        return mp.start_processes(fn, args, nprocs, join, daemon, start_method="forkserver")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(split_runs.mp, "spawn", spawn)
        yield


@pytest.fixture(scope="module")
def reference():
    return run_methods(METHODS, **SHAPE)


def assert_same_records(one: dict, split: dict) -> None:
    for name, a in one.items():
        b = split[name]
        torch.testing.assert_close(b["latents"], a["latents"], rtol=1e-5, atol=1e-5, msg=name)
        for key in ("context", "generation", "kept", "heads", "seen"):
            assert b[key] == a[key], (name, key)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("size", [2, 4])
def test_split_run_equals_one_process(reference, size):
    ranks = spawn_split(size, METHODS, **SHAPE)
    for rank in ranks:
        assert_same_records(reference, rank)
    for name, one in reference.items():
        peaks = [rank[name]["local_peak"] for rank in ranks]
        assert sum(peaks) == one["local_peak"], name  # every head's K/V is on exactly one rank
        if name == "fullkv":
            assert peaks == [one["local_peak"] // size] * size
    # the planner's per-rank replay equals what each rank's banks allocate, chunk by chunk
    g = TinyWorldModel.from_pretrained().geometry
    method = build_method(METHODS[0])
    for r, rank in enumerate(ranks):
        layout = local_layout(method.layout(g), r * g.num_heads // size, g.num_heads // size)
        groups = [[(len(gr.heads), gr.max_tokens) for gr in layer] for layer in layout]
        replay = simulate_kv(g.num_layers, groups, g.head_dim, 4, g.tokens_per_chunk, SHAPE["context_chunks"],
                             SHAPE["continuation_chunks"], retention(method))
        assert rank["fullkv"]["allocated"] == replay.after_chunk + replay.continuation_after_chunk


def uneven_head_map(path) -> str:
    """A head map of the tiny model whose static heads fall unevenly on 2 ranks (ranks hold heads 0-1 and
    2-3): layer 1 has no dynamic head on rank 0, layer 2 no static head on it."""
    static = [[0], [0, 1], [3], []]
    layers = [{"layer_idx": i, "static_head": s, "dynamic_head": [h for h in range(4) if h not in s]}
              for i, s in enumerate(static)]
    path.write_text(json.dumps({"num_layers": 4, "num_heads": 4, "layers": layers}))
    return str(path)


@pytest.mark.timeout(600)
def test_head_groups_split_unevenly_decide_as_one_process(tmp_path):
    """ForcingKV reads the keys of the first layer with dynamic heads anywhere (not only on this rank),
    and quota mode shares its allowance among the budgeted heads of the whole model (the static heads
    of every rank counted once)."""
    head_map = uneven_head_map(tmp_path / "map.json")
    methods = [{"name": "forcingkv", "head_map": head_map, "quota_pr": 0.3},
               {"name": "decoprune_hs", "head_map": head_map, "quota_pr": 0.3}]
    shape = {"context_chunks": 6, "continuation_chunks": 1, "compute_attention": False}
    one = run_methods(methods, **shape)
    for rank in spawn_split(2, methods, **shape):
        assert_same_records(one, rank)


def test_anchor_compression_on_some_heads_chooses_as_all_heads_once_given_the_other_heads_sums():
    keys = torch.randn(1, 4, 16, 4, 8, generator=torch.Generator().manual_seed(0))  # [B, f, T, H, D]
    whole = anchor_novelty_keep(keys, 0.5)
    halves = [keys[..., :2, :], keys[..., 2:, :]]  # the heads of 2 ranks
    assert not any(torch.equal(anchor_novelty_keep(h, 0.5), whole) for h in halves)  # alone, they differ
    sums: list[torch.Tensor] = []
    for h in halves:
        anchor_novelty_keep(h, 0.5, lambda t: sums.append(t) or t)
    for i, h in enumerate(halves):  # what the group's all-reduce hands each rank
        assert torch.equal(anchor_novelty_keep(h, 0.5, lambda t, i=i: t + sums[1 - i]), whole)


RETRIEVAL = [{"name": "worldkv", "retrieval_frames": 8}, {"name": "key_retrieval", "retrieval_frames": 8}]
STORE_BOUND = 1_600_000  # about half of what worldkv's store holds at its peak on this run (3,276,800 bytes)
BOUNDED = {"name": "worldkv", "retrieval_frames": 8, "store_max_bytes": STORE_BOUND, "label": "worldkv_bounded"}


@pytest.mark.timeout(900)
def test_retrieval_methods_keep_and_restore_over_every_head_as_one_process():
    """WorldKV's store-time compression (cosine to the anchor frame's mean key over heads and channels)
    and key retrieval's score (mean over heads of the query-key logit) are sums over every head of the
    model: each rank keeps and restores the one-process tokens, and the record (the host store's peak
    and the bytes moved included) is the one-process record. A bounded store is bounded as a whole:
    each rank's holds ``1 / P`` of the bytes, so the bound applies to ``P`` times them."""
    shape = {"context_chunks": 6, "continuation_chunks": 2}
    one = run_methods([*RETRIEVAL, BOUNDED], **shape)
    peaks = {name: rec["generation"]["peak_store_bytes"] for name, rec in one.items()}
    assert peaks["worldkv_bounded"] <= STORE_BOUND < peaks["worldkv"]  # the bound drops chunks
    g = TinyWorldModel.from_pretrained().geometry
    for name in (m["name"] for m in RETRIEVAL):
        rec = one[name]
        restored = {c: sorted({gid // g.tokens_per_chunk for gid in held[(0, 0)]} - {0, c - 2, c - 1})
                    for c, held in rec["seen"].items() if c >= 4}
        # 2 of the 3 and 4 candidates of the generated chunks come back: the choice is a decision
        assert [len(restored[c]) for c in (4, 5, 6, 7)] == [1, 2, 2, 2], (name, restored)
        lengths = {sum(gid // g.tokens_per_chunk == c for gid in held[(0, 0)]) for held in rec["seen"].values()
                   for c in range(1, 6)} - {0}
        assert min(lengths) < g.tokens_per_chunk  # restored chunks were compressed
        assert rec["generation"]["peak_store_bytes"] > 0 and rec["generation"]["moved_bytes"] > 0
    for rank in spawn_split(2, [*RETRIEVAL, BOUNDED], **shape):
        assert_same_records(one, rank)


def test_a_group_that_does_not_divide_the_heads_is_a_one_line_error():
    backbone = TinyWorldModel.from_pretrained()
    with pytest.raises(ConfigError, match=r"parallel.sequence=3 does not divide the model's 4 attention heads") as err:
        split_backbone(backbone, SequenceGroup(0, 3))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="parallel.sequence=8"):
        split_backbone(backbone, SequenceGroup(0, 8))
