"""Any method in any storage format, as a run composes them: a method's continuation in a quantized
format on the tiny model (MiniWorld context; random tokens) and on a tiny Wan DiT (LingBot's
conditioning; DeCoPrune), against
the same run in full precision; and ``storage=`` composed with a method on the command line's config
(spec, label, hash).

Why beside the unit tests (tests/test_kv_formats.py): only a real backbone shows that every model call
goes through the format (the prefill builds quantized banks, the fork keeps them, the re-index and the
method's compaction run on them) and that its output stays near full precision's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cmbench.backbones.wan.backbone import WanCondition
from cmbench.backbones.wan.camera import CameraPlan as WanCameraPlan
from cmbench.backbones.wan.i2v import FirstFrameLatents
from cmbench.benchmarks.speed import make_context
from cmbench.cache import quantized_bank
from cmbench.cache.quantized import StorageFormat
from cmbench.cache.quantized_bank import QuantizedBank
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.methods.registry import build_method
from test_tiny_backbone import random_model
from test_wan_conditioning import lingbot, text, vae  # noqa: F401  (fixtures)

DECOPRUNE = {"name": "decoprune", "quota_pr": 0.5, "probe_step": 2}
RANDOM = {"name": "random", "quota_pr": 0.5}


def run_both(backbone, context, cond, fmt: StorageFormat, frames: int, method: dict):
    """The method's continuation in full precision and in ``fmt``: ``(prefilled, continuation)`` each."""
    out = []
    for storage in (StorageFormat(), fmt):
        settings = GenerationSettings(storage=storage)
        pre = prefill(backbone, build_method(method), context, cond, seed=3, settings=settings)
        assert all(isinstance(b, QuantizedBank) == storage.quantized for b in pre.cache.all_banks())
        out.append((pre, continue_task(backbone, pre, cond, frames, seed=3)))
    return out


def check_close(fp, quantized, max_rel: float) -> None:
    (pre_fp, cont_fp), (pre_q, cont_q) = fp, quantized
    assert pre_q.cache.stored_bytes() < 0.5 * pre_fp.cache.stored_bytes()
    pr_fp, pr_q = cont_fp.ledger.pruning_ratio(), cont_q.ledger.pruning_ratio()  # the method pruned in both
    assert pr_fp > 0 and pr_q > 0 and abs(pr_q - pr_fp) < 0.1, (pr_fp, pr_q)
    err = float((cont_q.latents - cont_fp.latents).norm() / cont_fp.latents.norm())
    assert 0 < err < max_rel, err


def test_random_tokens_in_kivi_on_the_tiny_model():
    model = random_model(seed=3)
    context, plan = make_context(model, 16, 8, seed=0)
    fmt = StorageFormat("kivi", bits=4, group_size=16, residual=64)
    check_close(*run_both(model, context, plan, fmt, 8, RANDOM), max_rel=0.1)


def test_decoprune_in_qvg_on_a_tiny_wan_dit(vae, text):  # noqa: F811
    cond = WanCondition("t", ("a vase",) * 6, "go back", 8, WanCameraPlan.static((16.0, 16.0, 16.0, 16.0)),
                        FirstFrameLatents(vae, np.full((32, 32, 3), 90, np.uint8)))
    context = torch.randn(1, 16, 8, 4, 4, generator=torch.Generator().manual_seed(1))  # 4 chunks of 2 frames
    fmt = StorageFormat("qvg", bits=4, group_size=6, residual=0, stages=1, clusters=2, iters=3)  # head dim 12, 8-token chunks
    check_close(*run_both(lingbot(vae, text), context, cond, fmt, 4, DECOPRUNE), max_rel=0.1)


def test_storage_composes_with_a_method_in_the_run_spec():
    from cmbench.api import compose_config
    from cmbench.spec import resolve_run

    fp = resolve_run(compose_config("decoprune", ["method.gamma=0.2"]))
    kivi = resolve_run(compose_config("decoprune", ["method.gamma=0.2", "storage=kivi", "storage.bits=2"]))
    kivi4 = resolve_run(compose_config("decoprune", ["method.gamma=0.2", "storage=kivi"]))
    assert fp.generation.settings.storage == StorageFormat()
    assert kivi.generation.settings.storage == StorageFormat("kivi", bits=2, group_size=32, residual=128)
    assert fp.identity.label == "decoprune@gamma=0.2"
    assert kivi.identity.label == "decoprune@gamma=0.2+kivi2-g32-r128"
    assert len({fp.identity.config_hash, kivi.identity.config_hash, kivi4.identity.config_hash}) == 3
    assert "storage" not in fp.identity.result_config  # full precision hashes as before formats existed
    assert kivi.identity.result_config["storage"]["bits"] == 2
    assert kivi.plan_inputs()["storage"]["name"] == "kivi"


def test_a_target_pr_label_names_the_storage_format(monkeypatch):
    from types import SimpleNamespace

    from cmbench.api import compose_config
    from cmbench.calibration import target_pr

    found = SimpleNamespace(value=0.2, cached=True, calibration_pr=0.85, target_pr=0.85, note="")
    monkeypatch.setattr(target_pr, "calibrate_method", lambda *args, **kwargs: found)
    resolved = target_pr.resolve_target_pr(compose_config("decoprune", ["method.target_pr=0.85", "storage=kivi"]),
                                           verbose=False)
    assert resolved.cfg.label == "decoprune@pr85+kivi4-g32-r128"
    plain = target_pr.resolve_target_pr(compose_config("decoprune", ["method.target_pr=0.85"]), verbose=False)
    assert plain.cfg.label == "decoprune@pr85"


@pytest.mark.parametrize("method", [{**DECOPRUNE, "post_prune": True}, {"name": "worldkv", "retrieval_frames": 4}],
                         ids=["decoprune", "worldkv"])
def test_a_continuation_reads_its_quantized_history_in_blocks_as_in_one(monkeypatch, method):
    """Attention reads a quantized history a block of rows at a time: with blocks of 37 rows (the context alone is
    1024 tokens) DeCoPrune (its post-prune probe hides rows; its compaction and the re-index run on the banks) and WorldKV
    (rows restored from the host store) continue as with the whole history in one block, up to float rounding."""
    model = random_model(seed=3)
    context, plan = make_context(model, 16, 8, seed=0)
    fmt = StorageFormat("kivi", bits=4, group_size=16, residual=64)
    runs = []
    for rows in (10**9, 37):
        monkeypatch.setattr(quantized_bank, "DECODE_ROWS", rows)
        pre = prefill(model, build_method(method), context, plan, seed=3, settings=GenerationSettings(storage=fmt))
        assert max(b.n for b in pre.cache.all_banks()) > 10 * 37
        runs.append(continue_task(model, pre, plan, 8, seed=3))
    whole, blocks = runs
    assert whole.ledger.pruning_ratio() > 0
    assert blocks.ledger.pruning_ratio() == whole.ledger.pruning_ratio()
    torch.testing.assert_close(blocks.latents, whole.latents, atol=1e-4, rtol=1e-4)
