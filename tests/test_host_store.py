"""The host store and restores: tokens moved off the device and brought back are indistinguishable from
tokens kept all along, are counted as seen, never leak out of a probe, and never touch the prefill."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from cmbench.cache import Bank, ChunkInfo, HostStore, KVCache
from cmbench.cache.store import Segment
from cmbench.errors import ConfigError
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.generation.accounting import CallRecorder
from cmbench.methods import BeforeChunk, ChunkSignals, build_method
from cmbench.methods.fullkv import FullKV
from cmbench.methods.streaming import Streaming
from cmbench.methods.worldkv import WorldKV, anchor_novelty_keep, pose_distance
from cmbench.methods.worldkv_fixed_window import WorldKVFixedWindow
from fakes import AttentionBackbone, fake_geometry

G = fake_geometry(num_layers=2, num_heads=2, head_dim=12)  # chunks of 2 frames x 4 tokens = 8
BACKBONE = AttentionBackbone(G, seed=1)
CONTEXT = torch.randn(1, 3, 8, 4, 4, generator=torch.Generator().manual_seed(2))  # 4 context chunks
SETTINGS = GenerationSettings(reindex_recent=2, reindex_virtual_length=5.0)  # the re-index moves old keys
TOKEN_BYTES = 2 * G.num_heads * G.head_dim * 4  # K and V of one token in one layer's bank, float32


def write_chunks(cache: KVCache, chunks: range, seed: int = 0) -> None:
    """Commit chunks of random rotated K/V (the same values for the same seed and chunk)."""
    for c in chunks:
        info = cache.begin_chunk(c, c * G.chunk_frames, G.chunk_frames)
        for layer in range(G.num_layers):
            gen = torch.Generator().manual_seed(1000 * seed + 10 * c + layer)
            k, v = (torch.randn(1, info.length, G.num_heads, G.head_dim, generator=gen) for _ in range(2))
            cache.attend(layer, k, k, v)
        cache.commit_chunk()


def in_chunk(chunk: int):
    return lambda bank: bank.field("chunk") == chunk


def test_a_restored_token_is_where_a_kept_token_is_with_the_key_it_carries():
    kept = KVCache.from_geometry(G)
    moved = KVCache.from_geometry(G, store=HostStore())
    for cache in (kept, moved):
        write_chunks(cache, range(4))
    moved.compact(lambda bank: ~in_chunk(1)(bank), to_store=True)
    assert moved.banks[0][0].n == 24 and moved.store is not None and len(moved.store.gids((0, moved.banks[0][0].group))) == 8
    for cache in (kept, moved):
        cache.reindex(8, 2, 5.0)  # chunk 1's frames (2, 3) move: the stored keys must follow on restore
        cache.begin_chunk(4, 8, G.chunk_frames)
    restored = moved.restore(lambda bank: torch.arange(8, 16))
    assert restored == 8 * G.num_heads * G.num_layers
    for a, b in zip(kept.all_banks(), moved.all_banks()):
        assert b.field("gid").tolist() == list(range(32))  # ids ordered, the chunk at its place
        for name in Bank.PROVENANCE:
            assert torch.equal(a.field(name), b.field(name)), name
        torch.testing.assert_close(b.history()[0], a.history()[0], rtol=0, atol=1e-6)
        assert torch.equal(b.history()[1], a.history()[1])
    q = torch.randn(1, 8, G.num_heads, G.head_dim, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(moved.attend(0, q, q, q), kept.attend(0, q, q, q), rtol=0, atol=1e-6)


def test_restore_refuses_inside_a_probe_and_the_probe_leaves_the_banks_as_they_were():
    cache = KVCache.from_geometry(G, store=HostStore())
    write_chunks(cache, range(3))
    cache.compact(lambda bank: ~in_chunk(1)(bank), to_store=True)
    cache.begin_chunk(3, 6, G.chunk_frames)
    before = [b.field("gid").clone() for b in cache.all_banks()]
    with pytest.raises(RuntimeError, match="inside a probe"):
        with cache.probe():
            cache.restore(lambda bank: torch.arange(8, 16))
    assert [b.field("gid").tolist() for b in cache.all_banks()] == [t.tolist() for t in before]
    with pytest.raises(RuntimeError, match="first model call"):  # after a call the slot holds the chunk
        cache.attend(0, *(torch.zeros(1, 8, G.num_heads, G.head_dim),) * 3)
        cache.restore(lambda bank: torch.arange(8, 16))


@dataclass
class RestoreAll(Streaming):
    """Streaming on the device; every evicted row goes to the store and all of it comes back before
    each chunk (what FullKV sees, through the store)."""

    recent_chunks: int = 1

    def host_store(self) -> HostStore | None:
        return HostStore()

    def layout(self, geometry):
        return FullKV().layout(geometry)

    def before_denoise(self, cache: KVCache, sig: BeforeChunk) -> None:
        store = cache.store
        assert store is not None
        cache.restore(lambda bank: store.gids((bank.layer, bank.group)))

    def after_chunk(self, cache: KVCache, sig: ChunkSignals) -> None:
        cache.compact(lambda bank: self.protected(bank, sig.chunk), to_store=True)


def test_restoring_everything_is_fullkv_and_the_ledger_counts_what_was_restored():
    full_recorder = CallRecorder(BACKBONE)
    full = continue_task(full_recorder, prefill(BACKBONE, FullKV(), CONTEXT, None, 0, SETTINGS), None, 4, 3)
    recorder = CallRecorder(BACKBONE)
    pre = prefill(recorder, RestoreAll(), CONTEXT, None, 0, SETTINGS)
    cont = continue_task(recorder, pre, None, 4, 3)
    torch.testing.assert_close(cont.latents, full.latents, rtol=0, atol=1e-5)
    assert cont.ledger.pruning_ratio() == 0.0 and pre.ledger.pruning_ratio() == 0.0
    assert [e.visible_total for e in cont.ledger.entries] == [e.visible_total for e in full.ledger.entries]
    generated_calls = recorder.calls[-10:]  # 2 generated chunks x (4 steps + t = 0 pass)
    assert generated_calls[0] == cont.ledger.entries[0].visible_total  # the ledger logs what the call read
    assert generated_calls == full_recorder.calls  # the attention cost counts the restored keys read
    # by hand: after the context chunks 1-2 are stored; chunk 4 brings back 16 tokens, then sends out
    # chunk 3 (new to the store: 8 tokens moved; the restored ones are still there: nothing moved);
    # chunk 5 brings back 24 tokens and sends out chunk 4
    moved = (16 + 8 + 24 + 8) * TOKEN_BYTES * G.num_layers
    summary = cont.ledger.summary()
    assert summary["moved_bytes"] == moved and summary["moved_bytes_per_chunk"] == moved / 2
    assert summary["peak_store_bytes"] == 32 * TOKEN_BYTES * G.num_layers  # chunks 1-4 at the end
    assert summary["peak_stored_bytes"] == 48 * TOKEN_BYTES * G.num_layers  # everything at the last commit


def snapshot(cache: KVCache) -> list:
    banks = [(b.field("gid").clone(), b.history()[0].clone()) for b in cache.all_banks()]
    assert cache.store is not None
    stored = {key: {c: (s.gid.clone(), s.k.clone()) for c, s in chunks.items()} for key, chunks in cache.store.segments.items()}
    return [banks, stored, cache.store.stored_bytes]


def same(a: list, b: list) -> bool:
    banks = all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a[0], b[0]))
    stored = a[1].keys() == b[1].keys() and all(
        a[1][k].keys() == b[1][k].keys() and all(torch.equal(a[1][k][c][0], b[1][k][c][0]) and
                                                 torch.equal(a[1][k][c][1], b[1][k][c][1]) for c in a[1][k])
        for k in a[1])
    return banks and stored and a[2] == b[2]


@pytest.mark.parametrize("share", [True, False])
def test_tasks_restoring_from_a_prefilled_store_never_change_the_prefill(share):
    pre = prefill(BACKBONE, RestoreAll(), CONTEXT, None, 0, SETTINGS)
    before = snapshot(pre.cache)
    first = continue_task(BACKBONE, pre, None, 6, 3, share_prefill=share)
    assert same(snapshot(pre.cache), before)
    second = continue_task(BACKBONE, pre, None, 6, 3, share_prefill=share)
    assert torch.equal(first.latents, second.latents)
    assert same(snapshot(pre.cache), before)


def test_a_bounded_store_drops_its_oldest_chunks_and_counts_them():
    per_chunk = 8 * TOKEN_BYTES  # one chunk of one layer's bank
    cache = KVCache.from_geometry(G, store=HostStore(max_bytes=3 * per_chunk))
    write_chunks(cache, range(4))
    cache.compact(lambda bank: bank.field("chunk") == 3, to_store=True)  # chunks 0-2: 6 segments
    store = cache.store
    assert store is not None
    assert store.stored_chunks() == [2] and store.stored_bytes == 2 * per_chunk
    # layer 0's three segments fill it; layer 1's push out chunks 0 and 1 of both layers
    assert store.dropped_tokens == 2 * 8 * G.num_heads * G.num_layers and store.peak_bytes == 3 * per_chunk
    assert store.bytes_out == 6 * per_chunk
    with pytest.raises(KeyError, match="token 0 is not in the store"):
        cache.restore(lambda bank: torch.arange(0, 8))


def test_fetch_returns_exactly_the_asked_rows_in_id_order_from_whole_and_partial_chunks():
    """A fetch of some rows of one chunk and all of another, the ids given in any order, returns those
    rows (keys, values, provenance) in increasing id and counts their bytes; an id not stored is named."""
    cache = KVCache.from_geometry(G, store=HostStore())
    write_chunks(cache, range(4))
    cache.compact(lambda bank: ~((bank.field("chunk") == 0) & (bank.field("pos") % 2 == 1)))  # chunk 0: 4 of 8 rows
    cache.compact(lambda bank: bank.field("chunk") == 3, to_store=True)  # chunks 0-2 in the store
    store = cache.store
    assert store is not None
    key = (0, cache.banks[0][0].group)
    every = Segment.merge(*store.chunks(key).values())
    stored = every.gid
    assert len(stored) == 4 + 8 + 8
    # as many ids as chunk 0 holds, inside its id range, but two of them were deleted, not stored
    gap = torch.arange(int(stored[0]), int(stored[0]) + 4)
    with pytest.raises(KeyError, match=f"token {int(gap[1])} is not in the store"):
        store.fetch(key, gap)
    asked = torch.cat([stored[[5, 7, 10]], stored[12:20]])  # 3 rows of chunk 1, all of chunk 2
    got = store.fetch(key, asked[torch.randperm(len(asked), generator=torch.Generator().manual_seed(0))])
    assert got is not None and got.gid.tolist() == sorted(asked.tolist())
    rows = torch.searchsorted(stored, got.gid)
    assert torch.equal(got.k, every.k[:, rows]) and torch.equal(got.v, every.v[:, rows])
    assert all(torch.equal(got.prov[name], every.prov[name][rows]) for name in got.prov)
    assert store.bytes_in == len(asked) * TOKEN_BYTES
    # a whole chunk alone: the stored segment itself, rows and order unchanged
    whole = store.fetch(key, stored[4:12])
    assert whole is not None and torch.equal(whole.k, every.k[:, 4:12]) and whole.gid.tolist() == stored[4:12].tolist()
    missing = int(stored.max()) + 1
    with pytest.raises(KeyError, match=f"token {missing} is not in the store"):
        store.fetch(key, torch.tensor([int(stored[0]), missing]))
    assert store.fetch(key, torch.zeros(0, dtype=torch.long)) is None


def test_worldkv_refuses_data_without_poses_in_one_line():
    with pytest.raises(ConfigError) as err:
        prefill(BACKBONE, WorldKV(), CONTEXT, None, 0)
    assert "\n" not in str(err.value) and "camera poses" in str(err.value)


def test_anchor_novelty_keeps_the_anchor_frame_and_the_least_similar_tokens():
    T, H, D = 4, 1, 2
    keys = torch.zeros(1, 3, T, H, D)
    keys[0, 0, :, 0] = torch.tensor([1.0, 0.0])  # anchor frame: mean key along x
    angles = torch.tensor([[0.0, 0.5, 2.0, 1.0], [3.0, 0.1, 1.5, 0.2]])  # angle of each token to x
    keys[0, 1:, :, 0, 0], keys[0, 1:, :, 0, 1] = angles.cos(), angles.sin()
    keep = anchor_novelty_keep(keys, 0.5)  # 2 per non-anchor frame, 4 pooled over frames 1 and 2
    expect = [0, 1, 2, 3] + [T + i for i in (2, 3)] + [2 * T + i for i in (0, 2)]  # angles 2.0, 1.0, 3.0, 1.5
    assert keep.nonzero().squeeze(1).tolist() == sorted(expect)
    assert bool(anchor_novelty_keep(keys, 1.0).all())


def test_pose_distance_mixes_normalised_position_and_angle():
    def pose(yaw: float, x: float) -> torch.Tensor:
        p = torch.eye(4, dtype=torch.float64)
        p[0, 0] = p[2, 2] = math.cos(yaw)
        p[0, 2], p[2, 0] = math.sin(yaw), -math.sin(yaw)
        p[0, 3] = x
        return p

    d = pose_distance(pose(0.0, 0.0), torch.stack([pose(0.0, 0.0), pose(0.5, 1.0), pose(1.0, 2.0)]))
    torch.testing.assert_close(d, torch.tensor([0.0, 0.5 * 0.25 + 0.5 * 0.5, 1.0], dtype=torch.float64))


def test_worldkv_brings_back_the_stored_chunks_nearest_the_camera_pose():
    method = WorldKVFixedWindow(recent_chunks=1, retrieval_frames=2 * G.chunk_frames)  # two chunks back per chunk
    yaw = torch.tensor([0.0, 0.0, 2.0, 2.0, 1.0, 1.0, 0.1, 0.1, 3.0, 3.0, 0.05, 0.05])  # chunks 0..5
    poses = torch.eye(4, dtype=torch.float64).repeat(len(yaw), 1, 1)
    poses[:, 0, 0], poses[:, 0, 2], poses[:, 2, 0], poses[:, 2, 2] = yaw.cos(), yaw.sin(), -yaw.sin(), yaw.cos()
    cache = KVCache.from_geometry(G, method.layout(G), store=method.host_store())
    write_chunks(cache, range(5))
    cache.compact(lambda bank: (bank.field("chunk") == 0) | (bank.field("chunk") == 4), to_store=True)
    info: ChunkInfo = cache.begin_chunk(5, 10, G.chunk_frames)
    method.before_denoise(cache, BeforeChunk(geometry=G, chunk=info, phase="generation", poses=poses))
    # candidates 1..3 (sink 0 and recent 4 excluded); yaw 0.05 is nearest 0.1 (chunk 3), then 1.0 (chunk 2)
    assert sorted(set(cache.banks[0][0].field("chunk").tolist())) == [0, 2, 3, 4]


@pytest.mark.parametrize("name", ["worldkv", "key_retrieval"])
def test_a_larger_retrieval_budget_prunes_less_on_the_device(name):
    from cmbench.method_check import _Bench

    bench = _Bench(0, 6, 2, GenerationSettings())
    prs = [bench.run(build_method({"name": name, "retrieval_frames": f})).continuation.ledger.pruning_ratio()
           for f in (0, 4, 8)]
    assert prs[0] > prs[1] > prs[2]


def test_the_leaderboard_reports_the_store_and_transfers_of_retrieval_entries_only(tmp_path):
    import json

    import pandas as pd

    from cmbench.report import write_reports

    def run(label: str, extra: dict) -> object:
        path = tmp_path / label
        path.mkdir()
        rows = [{"task_id": t, "context_id": "a", "source": "synthetic", "task_type": "reappear", "seed": 0,
                 "label": label, "status": "ok", "score": 0.5, "pr": 0.8, "peak_kv_bytes": 2e6,
                 "continuation_seconds": 1.0, "continuation_frames": 16, "scorer_hash": "s",
                 **{k: v * (i + 1) for k, v in extra.items()}} for i, t in enumerate(("a1", "a2"))]
        (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    paths = write_reports([run("worldkv", {"peak_store_bytes": 3e6, "moved_bytes_per_chunk": 1e5}),
                           run("streaming", {})], tmp_path / "report")
    board = pd.read_csv(paths["leaderboard.csv"]).set_index("method")
    assert board.loc["worldkv", "peak_store_bytes"] == pytest.approx(4.5e6)  # mean of 3 and 6 MB
    assert board.loc["worldkv", "moved_bytes_per_chunk"] == pytest.approx(1.5e5)
    assert math.isnan(board.loc["streaming", "peak_store_bytes"])
    md = paths["leaderboard.md"].read_text()
    assert "| worldkv | 2.00 | 4.50 | 0.150 |" in md and "| streaming | 2.00 |" not in md


def test_the_memory_plan_replays_a_retrieval_methods_device_banks_and_host_store():
    from cmbench.backbones.memory.kv import retention, simulate_kv

    method = build_method({"name": "key_retrieval", "recent_chunks": 1, "retrieval_frames": 2 * G.chunk_frames})
    ret = retention(method, geometry=G)
    assert ret.stored_per_chunk == 4 + 2 and ret.restore_tokens == 2 * 6  # anchor frame + ceil(0.5 * 4)
    device: list[int] = []
    groups = [[(len(gr.heads), gr.max_tokens) for gr in layer] for layer in method.layout(G)]
    replay = simulate_kv(G.num_layers, groups, G.head_dim, 4, G.tokens_per_chunk, 4, 3, ret)

    def allocated(cache: KVCache, sig: ChunkSignals) -> None:
        device.append(sum(2 * b.k.numel() * 4 for b in cache.all_banks() if b.k is not None))

    pre = prefill(BACKBONE, method, CONTEXT, None, 0, SETTINGS, on_chunk_end=allocated)
    assert device == replay.after_chunk
    cont = continue_task(BACKBONE, pre, None, 6, 3)
    # context chunks 1 and 2 leave the window in the prefill, 3 .. 5 in the continuation: 5 x 6 tokens
    assert cont.ledger.peak_store_bytes == replay.store_peak == 5 * 6 * TOKEN_BYTES * G.num_layers
    assert cont.ledger.peak_stored_bytes <= replay.continuation_peak + replay.prefilled_stored


def test_camera_poses_of_a_miniworld_plan_and_of_a_real_tasks_relative_plan():
    import numpy as np

    from cmbench.backbones.tiny import CameraPlan as MiniWorldPlan, TinyWorldModel
    from cmbench.backbones.wan.camera import CameraPlan, relative_framewise

    model = TinyWorldModel.random(0)
    W = model.config.world_width
    poses = model.camera_poses(MiniWorldPlan(np.array([0, W // 4, W // 2])))
    torch.testing.assert_close(pose_distance(poses[0], poses), torch.tensor([0.0, 0.25, 0.5], dtype=torch.float64))
    gen = torch.Generator().manual_seed(0)
    c2w = torch.eye(4, dtype=torch.float64).repeat(3, 1, 1)
    c2w[:, :3, :3] = torch.linalg.qr(torch.randn(3, 3, 3, generator=gen, dtype=torch.float64))[0]
    c2w[:, :3, 3] = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    chained = CameraPlan(relative_framewise(c2w, normalize=False), torch.tensor([1.0, 1, 0, 0])).absolute()
    assert chained is not None
    torch.testing.assert_close(chained, torch.linalg.inv(c2w[0]) @ c2w)  # the first frame's pose cancels out
    assert CameraPlan.static([1.0, 1, 0, 0]).absolute() is None
