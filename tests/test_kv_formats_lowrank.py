"""The low-rank storage format (``storage=lowrank``, cache/lowrank.py): bytes by hand (bases included), the
projection (exact at full rank, orthogonal below), the basis fitted on keys, eviction, forks and the re-index
in the format, its refusals, and a method composed with it on the tiny model.

Caches here have 2 heads of head dim 32, 16 tokens a frame and chunks of 2 frames (32 tokens); their bases
are layer 0's of the tiny model's committed key basis unless a test fits its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cmbench.cache.kv_cache import KVCache
from cmbench.cache.lowrank import BASIS_SUFFIX, basis_path, fit_basis, load_basis, save_basis
from cmbench.cache.quantized import StorageFormat, bytes_per_token, storage_format
from cmbench.cache.rope import RopeSpec
from cmbench.cache.store import HostStore
from cmbench.errors import ConfigError

D, H, T = 32, 2, 16
L = 2 * T
TINY_WEIGHTS = Path(__file__).resolve().parents[1] / "cmbench" / "backbones" / "weights" / "tiny_miniworld_dynamic.safetensors"
TINY_BASIS = str(basis_path(TINY_WEIGHTS))


def lowrank(rank: int, residual: int = 0, basis: str = TINY_BASIS) -> StorageFormat:
    return StorageFormat("lowrank", rank=rank, residual=residual, basis=basis)


def filled(fmt: StorageFormat, chunks: int = 3, store: bool = False) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
    """A one-layer cache in ``fmt`` holding ``chunks`` chunks of random K/V, and those K, V ``[1, n, H, D]``."""
    cache = KVCache(1, H, D, T, RopeSpec.wan(D), compute_attention=False, store=HostStore() if store else None)
    cache.use_storage(fmt)
    g = torch.Generator().manual_seed(0)
    keys, values = [], []
    for i in range(chunks):
        k, v = torch.randn(1, L, H, D, generator=g), torch.randn(1, L, H, D, generator=g)
        cache.begin_chunk(i, 2 * i, 2)
        cache.attend(0, k, k, v)
        cache.commit_chunk()
        keys.append(k)
        values.append(v)
    return cache, torch.cat(keys, 1), torch.cat(values, 1)


def projected(k: torch.Tensor, rank: int) -> torch.Tensor:
    """``k [1, n, H, D]`` projected onto the first ``rank`` directions of layer 0's bases of heads 0 and 1."""
    basis = load_basis(TINY_BASIS)[0][0, :H, :, :rank].half().float()  # the bank holds its bases in float16
    return torch.einsum("bnhd,hdr,her->bnhe", k, basis, basis)


# ----------------------------------------------------------------------------------------- bytes
def test_lowrank_bytes_by_hand():
    """Per token and head: 8 float16 key coefficients (16 bytes) and 32 float16 values (64); the bank's bases:
    2 heads x 32 x 8 float16 (1024); the 4-token recent window's K and V in float32 (2048)."""
    cache, _, _ = filled(lowrank(8, residual=4))
    assert lowrank(8).row_bytes(D) == 16 + 64
    assert cache.stored_bytes() == (96 - 4) * H * (16 + 64) + H * D * 8 * 2 + 2 * 4 * H * D * 4 == 17792
    # over a long history the bases are a constant: a head-token costs its row, 80 of fp's 256 float32 bytes
    assert bytes_per_token(lowrank(8), D, 4, T, L) == 80
    assert bytes_per_token(lowrank(32), 128, 2, 1560, 6240) == 64 + 256  # 14B LingBot: 320 of bf16's 512


# ----------------------------------------------------------------------------------------- the projection
def test_full_rank_keys_come_back_up_to_float16_rounding():
    cache, k, v = filled(lowrank(D))
    got_k, got_v = cache.banks[0][0].history()
    torch.testing.assert_close(got_k, k, atol=3e-3, rtol=1e-3)
    torch.testing.assert_close(got_v, v.half().float(), atol=0, rtol=0)  # values: their float16 rounding


def test_a_key_is_its_projection_onto_the_first_rank_directions():
    cache, k, _ = filled(lowrank(8))
    got_k, _ = cache.banks[0][0].history()
    torch.testing.assert_close(got_k, projected(k, 8), atol=3e-3, rtol=1e-3)
    assert float((got_k - k).norm() / k.norm()) > 0.5  # random keys are not in the tiny model's key subspace


def test_the_basis_holds_keys_that_lie_in_a_subspace():
    """Keys in a 3-dimensional subspace: the fitted basis's first 3 directions span it (rank 3 is exact to
    float rounding), its singular values decrease, and its columns are orthonormal."""
    g = torch.Generator().manual_seed(1)
    span = torch.linalg.qr(torch.randn(H, D, 3, generator=g))[0]  # [H, D, 3]
    keys = torch.einsum("hdr,nhr->nhd", span, torch.randn(500, H, 3, generator=g) * torch.tensor([5.0, 2.0, 1.0]))
    basis, singular = fit_basis(keys)
    torch.testing.assert_close(basis.transpose(1, 2) @ basis, torch.eye(D).expand(H, D, D), atol=1e-5, rtol=0)
    assert bool((singular[:, :-1] >= singular[:, 1:]).all()) and float(singular[:, 3:].max()) < 1e-5
    back = torch.einsum("nhd,hdr,her->nhe", keys, basis[..., :3], basis[..., :3])
    torch.testing.assert_close(back, keys, atol=1e-4, rtol=0)
    assert float((torch.einsum("nhd,hdr,her->nhe", keys, basis[..., :2], basis[..., :2]) - keys).norm()) > 1.0


def test_the_committed_tiny_basis_was_fitted_on_calibration_contexts_of_these_weights():
    from cmbench.identity.code import path_fingerprint

    basis, meta = load_basis(TINY_BASIS)
    assert basis.shape == (4, 4, D, D) and meta["weights"] == path_fingerprint(TINY_WEIGHTS)
    assert "miniworld_calibration" in meta["calibration"] and TINY_BASIS.endswith(BASIS_SUFFIX)


# ----------------------------------------------------------------------------------------- cache operations
def test_evict_restore_and_fork_in_lowrank():
    """Evicted rows come back as they were (a projected key is its own projection); a fork reads its
    parent's rows and never writes them."""
    cache, _, _ = filled(lowrank(8, residual=8), chunks=4, store=True)
    before = cache.banks[0][0].history()
    cache.compact(lambda bank: bank.field("gid") % 3 != 0, to_store=True)
    parent = cache.banks[0][0].history()
    fork = cache.fork(headroom=L)
    assert fork.restore(lambda bank: torch.arange(0, 128, 3)) == 43 * H
    now = fork.banks[0][0].history()
    window = torch.arange(128) >= 120  # restored window rows come back projected
    torch.testing.assert_close(now[0][:, ~window], before[0][:, ~window], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(now[1][:, ~window], before[1][:, ~window], atol=0, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(cache.banks[0][0].history(), parent))


def test_a_reindex_rotates_the_keys_and_projects_them_again():
    """The re-index decodes the keys, rotates them as full precision does and stores their projection; the
    recent window (the last 8 tokens) is rotated exactly."""
    cache, _, _ = filled(lowrank(8, residual=8), chunks=4)
    k, v = cache.banks[0][0].history()
    full = KVCache(1, H, D, T, RopeSpec.wan(D), compute_attention=False)
    full.begin_chunk(0, 0, 8)
    full.attend(0, k, k, v)
    full.commit_chunk()
    full.reindex(8, 2, 3.0)
    cache.reindex(8, 2, 3.0)
    want, got = full.banks[0][0].history()[0], cache.banks[0][0].history()[0]
    assert not torch.allclose(want[:, :-8], k[:, :-8], atol=1e-2)  # the keys did move
    torch.testing.assert_close(got[:, -8:], want[:, -8:], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[:, :-8], projected(want, 8)[:, :-8], atol=3e-3, rtol=1e-3)
    assert not torch.allclose(got[:, :-8], want[:, :-8], atol=1e-2)  # a rotation leaves the basis's span


# ----------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("block, head_dim, message", [
    ({"name": "lowrank", "rank": 0}, None, "storage.rank=0: expected a whole number of key coefficients >= 1"),
    ({"name": "lowrank", "rank": 33}, 32, r"storage.rank=33: above the head dim 32 \(at most 32\)"),
    ({"name": "kivi", "rank": 8}, None, "storage.rank=8: only lowrank projects keys"),
])
def test_bad_lowrank_knobs_are_one_line(block, head_dim, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        storage_format(block).check(head_dim)


def test_a_basis_missing_or_fitted_on_other_weights_is_refused_before_any_model_is_built(tmp_path):
    from cmbench.spec import storage_spec

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights")
    backbone = {"name": "mine", "path": str(weights)}
    with pytest.raises(ConfigError, match=r"^storage.basis=.*model_key_basis.safetensors: no key basis there; fit one on "
                                          r"calibration contexts: python scripts/fit_key_basis.py backbone=mine$"):
        storage_spec({"name": "lowrank", "rank": 4}, backbone)
    basis, singular = fit_basis(torch.randn(64, 2, 8))
    save_basis(basis_path(weights), basis[None], singular[None], {"weights": "sha256:other"})
    with pytest.raises(ConfigError, match=r"fitted on other weights than backbone.path=.*model.safetensors \(fit it again\)$"):
        storage_spec({"name": "lowrank", "rank": 4}, backbone)
    from cmbench.identity.code import path_fingerprint

    save_basis(basis_path(weights), basis[None], singular[None], {"weights": path_fingerprint(weights)})
    assert storage_spec({"name": "lowrank", "rank": 4}, backbone).basis == str(basis_path(weights))
    with pytest.raises(ConfigError, match=r"^storage.rank=9: above the head dim 8 of the key basis \(at most 8\)$"):
        storage_spec({"name": "lowrank", "rank": 9}, backbone)


def test_a_lowrank_run_is_labelled_by_rank_and_hashed_by_its_basis():
    from cmbench.api import compose_config
    from cmbench.spec import resolve_run

    spec = resolve_run(compose_config("fullkv", ["storage=lowrank", "storage.rank=4"]))
    assert spec.identity.label == "fullkv+lowrank4-r0"
    from cmbench.identity.code import file_fingerprint

    assert spec.identity.result_config["storage"] == {"name": "lowrank", "rank": 4, "residual": 0,
                                                      "basis": file_fingerprint(TINY_BASIS)}  # content, not place
    assert spec.generation.settings.storage.basis == TINY_BASIS


# ----------------------------------------------------------------------------------------- with a method
def test_decoprune_in_lowrank_on_the_tiny_model():
    """DeCoPrune's pruned continuation in lowrank (rank 24 of 32) on the trained tiny model, against the same
    in full precision: fewer bytes, the same pruning, latents near full precision's (0.04 apart; rank 16:
    0.26, rank 8: 0.51, rank 32: 0.0002)."""
    from cmbench.backbones.tiny import TinyWorldModel
    from cmbench.benchmarks.speed import make_context
    from cmbench.generation import GenerationSettings, continue_task, prefill
    from cmbench.methods.registry import build_method

    model = TinyWorldModel.from_pretrained()
    context, plan = make_context(model, 16, 8, seed=0)
    out = []
    for storage in (StorageFormat(), lowrank(24)):
        method = build_method({"name": "decoprune", "quota_pr": 0.5, "probe_step": 2})
        pre = prefill(model, method, context, plan, seed=3, settings=GenerationSettings(storage=storage))
        out.append((pre, continue_task(model, pre, plan, 8, seed=3)))
    (pre_fp, cont_fp), (pre_lr, cont_lr) = out
    assert pre_lr.cache.stored_bytes() < 0.5 * pre_fp.cache.stored_bytes()  # float32 fp: keys 48 + values 64 of 256 bytes
    assert cont_fp.ledger.pruning_ratio() > 0 and abs(cont_lr.ledger.pruning_ratio() - cont_fp.ledger.pruning_ratio()) < 0.1
    err = float((cont_lr.latents - cont_fp.latents).norm() / cont_fp.latents.norm())
    assert 0 < err < 0.1, err


def test_the_format_check_passes_in_lowrank_with_or_without_a_basis_file():
    from cmbench.cache.format_check import check_format

    for fmt in (lowrank(8, residual=10), StorageFormat("lowrank", rank=4)):
        checks = check_format(fmt)
        assert [c.name for c in checks] == ["round trip", "bytes"] and all(c.passed for c in checks), checks


def test_the_basis_reads_each_head_of_the_cache_in_head_order():
    """Keys gathered from banks regrouped by head (head 1's bank first) come out in head order."""
    from cmbench.cache.layout import HeadGroup
    from cmbench.calibration.key_basis import cached_keys

    cache = KVCache(1, H, D, T, RopeSpec.wan(D), compute_attention=False)
    k = torch.randn(1, L, H, D, generator=torch.Generator().manual_seed(5))
    cache.begin_chunk(0, 0, 2)
    cache.attend(0, k, k, k)
    cache.commit_chunk()
    cache.regroup(0, [HeadGroup((1,), "b"), HeadGroup((0,), "a")])
    assert [b.group.heads for b in cache.banks[0]] == [(1,), (0,)]
    (keys,) = cached_keys(cache)
    assert torch.equal(keys, k[0])


def test_a_basis_is_never_fitted_on_the_test_suite(tmp_path):
    from cmbench.api import compose_config
    from cmbench.calibration.key_basis import fit_key_basis

    cfg = compose_config("fullkv", ["data=miniworld"])
    same = compose_config("fullkv", ["data=miniworld", f"calibration.root={cfg.data.root}"])
    with pytest.raises(ConfigError, match="is the test suite's folder"):
        fit_key_basis(same, 2, tmp_path / "basis.safetensors")
    assert not (tmp_path / "basis.safetensors").exists()


def test_check_command_names_the_rank_of_a_lowrank_format(capsys):
    from cmbench.cli.main import main

    assert main(["check", "method=fullkv", "storage=lowrank", "storage.rank=4", "check.context_chunks=1",
                 "check.continuation_chunks=1"]) == 0
    out = capsys.readouterr().out
    assert "storage lowrank (rank=4, residual=0): format checks on random K/V" in out
    assert "PASS  round trip" in out and "PASS  bytes" in out
