"""The memory plan against what the code really allocates: model bytes, the KV cache chunk by chunk, the
offload choice and refusal, the committed table; and the bounded-memory paths (trim, park, blocked
re-index, blocked head-map attention)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cmbench.backbones.dit import DiTConfig, grid_positions
from cmbench.backbones.loading import build_backbone
from cmbench.backbones.memory import workspace
from cmbench.backbones.memory.kv import retention, simulate_kv
from cmbench.backbones.memory.measure import PeakMemory, module_bytes
from cmbench.backbones.memory.plan import GIB, build_plan, choose_plan
from cmbench.backbones.memory.run_plan import geometry_of, plan_for, run_shape
from cmbench.backbones.memory.targets import documented_shapes, fit_table
from cmbench.backbones.memory.weights import dit_bytes, text_encoder_bytes, vae_bytes
from cmbench.backbones.wan.synthetic import random_dit, random_dit_state, save_components, save_lingbot_dit
from cmbench.cache.attention_stats import frame_mass
from cmbench.cache.kv_cache import KVCache
from cmbench.config_paths import CONFIG_DIR, knob_overrides
from cmbench.errors import ConfigError
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.methods.registry import build_method

REPO = Path(__file__).resolve().parents[1]
DIT = DiTConfig(in_channels=36, out_channels=16, dim=24, ffn_dim=32, num_heads=2, num_layers=3, text_dim=16,
                camera_dim=384)


def config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=knob_overrides(list(overrides)))  # as the command line


@pytest.fixture(scope="module")
def tiny_lingbot(tmp_path_factory):
    """A tiny LingBot loaded through the real path (sharded safetensors, diffusers / transformers folders)."""
    root = tmp_path_factory.mktemp("lingbot")
    torch.manual_seed(0)
    save_components(root / "components", text_dim=DIT.text_dim)
    save_lingbot_dit(root / "model" / "dit", random_dit_state(DIT, seed=2), DIT, dtype=torch.float32)
    cfg = OmegaConf.load(CONFIG_DIR / "backbone" / "lingbot_world_v2_1_3b.yaml")
    cfg.merge_with({"dit": DIT.to_dict(), "path": str(root / "model"), "components": str(root / "components"),
                    "context": {"height": 32, "width": 32}, "text_len": 16, "device": "cpu", "chunk_frames": 2,
                    "camera_intrinsics": [16.0, 16.0, 16.0, 16.0]})
    return cfg, build_backbone(cfg)


# ----------------------------------------------------------------------------- weights
def test_weight_predictions_equal_the_loaded_models(tiny_lingbot):
    cfg, backbone = tiny_lingbot
    assert dit_bytes(cfg.dit, cfg.dtype, cfg.fp32_residual) == module_bytes(backbone.dit)
    assert backbone.dit.blocks[0].ffn[0].weight.dtype == torch.bfloat16  # the sum mixes dtypes: islands count
    components = Path(cfg.components)
    assert text_encoder_bytes(components / "text_encoder", cfg.text_dtype)[0] == module_bytes(backbone.text.model)
    assert vae_bytes(components / "vae", cfg.vae_dtype)[0] == module_bytes(backbone.vae.model)


def test_lingbot_14b_dit_has_18_5_b_parameters():
    from cmbench.backbones.wan.components import meta_dit

    fields = OmegaConf.load(CONFIG_DIR / "backbone" / "lingbot_world_v2_14b.yaml").dit
    params = sum(p.numel() for p in meta_dit(fields, "bfloat16", True).parameters())
    assert 18.5e9 < params < 18.6e9  # 40 blocks with camera layers: not the 14 B of the name
    assert 37.4e9 < dit_bytes(fields, "bfloat16", True) < 37.6e9  # bf16 with float32 islands


# ----------------------------------------------------------------------------- the KV cache, chunk by chunk
def kv_bytes(cache: KVCache) -> int:
    return sum(2 * b.k.numel() * b.k.element_size() for b in cache.all_banks() if b.k is not None)


@pytest.mark.parametrize("method_cfg", [
    {"name": "fullkv"},
    {"name": "decoprune", "quota_pr": 0.85},
    {"name": "decoprune", "quota_tokens": 40},
    {"name": "streaming"},
    {"name": "fullkv", "max_history_tokens": 48},
], ids=["fullkv", "decoprune@0.85", "quota_tokens", "streaming", "bounded"])
def test_kv_replay_equals_the_real_caches_bytes(tiny_lingbot, method_cfg):
    """Allocated K/V bytes after every chunk, the prefilled cache, and the fork's growth: equal, not close."""
    _, backbone = tiny_lingbot
    g = backbone.geometry
    method = build_method(method_cfg)
    context_chunks, continuation_chunks = 9, 3
    torch.manual_seed(1)
    context = torch.randn(1, 16, context_chunks * g.chunk_frames, g.latent_height, g.latent_width)
    from cmbench.backbones.wan.backbone import WanCondition

    cond = WanCondition("t", ("a",) * 6, "b", context.shape[2])
    cond.camera = backbone.camera_plan(type("Task", (), {"extra": {}})())
    from cmbench.backbones.wan.i2v import FirstFrameLatents

    cond.first_frame = FirstFrameLatents(backbone.vae, np.full((32, 32, 3), 90, np.uint8))
    seen: list[int] = []
    settings = GenerationSettings()
    pre = prefill(backbone, method, context, cond, seed=0, settings=settings,
                  on_chunk_end=lambda cache, sig: seen.append(kv_bytes(cache)))
    groups = [[(len(gr.heads), gr.max_tokens) for gr in layer] for layer in method.layout(g)]
    dtype_bytes = backbone.dit.blocks[0].ffn[0].weight.element_size()
    replay = simulate_kv(g.num_layers, groups, g.head_dim, dtype_bytes, g.tokens_per_chunk, context_chunks,
                         continuation_chunks, retention(method))
    assert retention(method).exact
    assert seen == replay.after_chunk
    assert kv_bytes(pre.cache) == replay.prefilled_alloc and pre.cache.stored_bytes() == replay.prefilled_stored
    gen: list[int] = []
    cont = continue_task(backbone, pre, cond, continuation_chunks * g.chunk_frames, seed=1,
                         on_chunk_end=lambda cache, sig: gen.append(kv_bytes(cache)))
    assert gen == replay.continuation_after_chunk
    # the fork reads prefilled rows in place: what it stores beyond them is its own allocation
    assert cont.cache.stored_bytes() - cont.cache.shared_bytes() <= replay.continuation_peak
    assert cont.cache.shared_bytes() <= replay.prefilled_stored
    copy = pre.cache.fork(headroom=continuation_chunks * g.tokens_per_chunk, share=False)  # a parked cache's fork
    assert kv_bytes(copy) == replay.parked_fork and replay.parked_continuation_peak >= replay.parked_fork
    pre.cache.trim()  # what run does after each prefill (or park)
    assert kv_bytes(pre.cache) == replay.prefilled_stored


def test_data_dependent_retention_is_an_assumption_named_in_the_plan():
    method = build_method({"name": "decoprune"})
    ret = retention(method)
    assert not ret.exact and ret.keep_fraction == pytest.approx(1 - 0.8543) and "paper" in ret.note
    assert retention(method, assume_pr=0.5).keep_fraction == 0.5
    assert retention(build_method({"name": "fullkv"})).keep_fraction == 1.0


# ----------------------------------------------------------------------------- activations
def test_dit_call_estimate_is_within_a_quarter_of_the_measured_peak():
    cfg = DiTConfig(in_channels=36, out_channels=16, dim=256, ffn_dim=1024, num_heads=2, num_layers=2, text_dim=64,
                    camera_dim=384)
    dit = random_dit(cfg, "cpu", torch.bfloat16)
    from cmbench.backbones.wan.precision import cast_for_inference

    cast_for_inference(dit, torch.bfloat16, fp32_residual=True)
    frames, rows, cols = 4, 8, 13
    cache = KVCache(cfg.num_layers, cfg.num_heads, cfg.head_dim, rows * cols, dit.rope)
    cache.begin_chunk(0, 0, frames)
    x = torch.randn(1, 36, frames, 2 * rows, 2 * cols, dtype=torch.bfloat16)
    with torch.no_grad(), PeakMemory("cpu") as peak:
        dit(x, torch.full((1, frames), 0.9), grid_positions(0, frames, rows, cols), cache,
            text=torch.randn(1, 16, 64, dtype=torch.bfloat16),
            camera=torch.randn(1, 384, frames, 2 * rows, 2 * cols, dtype=torch.bfloat16))
    measured = peak.peak - kv_bytes(cache)
    estimate = workspace.dit_call(frames * rows * cols, cfg.dim, cfg.ffn_dim, 2, 16, 64, camera_values=384 * 4)
    assert 0.75 * measured < estimate < 1.25 * measured


@pytest.mark.slow
def test_vae_workspace_constants_match_a_measurement():
    """The Wan 2.1 VAE architecture (random weights) at 64x112: the per-pixel constants hold within 5%."""
    from diffusers import AutoencoderKLWan

    from cmbench.backbones.wan.vae import WanVAE

    torch.manual_seed(0)
    vae = WanVAE(AutoencoderKLWan())
    h, w = 64, 112
    with PeakMemory("cpu") as encode:  # two chunks of 4 frames after the first: the caches are full
        vae.encode(torch.randint(0, 255, (9, h, w, 3), dtype=torch.uint8))
    with PeakMemory("cpu") as decode:
        vae.decode_continuation(torch.randn(1, 16, 4, h // 8, w // 8), torch.randn(1, 16, 3, h // 8, w // 8))
    assert encode.peak == pytest.approx(workspace.vae_encode(9, h, w), rel=0.05)
    assert decode.peak == pytest.approx(workspace.vae_decode(4, h, w), rel=0.05)


# ----------------------------------------------------------------------------- choosing offloads
def lingbot_plan(device_gib: float, host_gib: float = 1000.0, method: str = "fullkv", *extra: str):
    cfg = config("backbone=lingbot_world_v2_1_3b", f"method={method}", *extra,
                 "backbone.memory.context_seconds=60", f"backbone.memory.device_gib={device_gib}",
                 f"backbone.memory.host_gib={host_gib}", "scorer=light")
    return plan_for(cfg, build_method(OmegaConf.to_container(cfg.method, resolve=True)))


def test_offloads_are_added_cheapest_first_until_the_plan_fits():
    roomy = lingbot_plan(400.0)
    assert roomy.fits and roomy.offloads == ()
    # 1.3B FullKV, one minute: the prefilled cache and a task's fork fit together (the fork reads the
    # prefilled rows in place and adds its own chunks only); the prefill's growth is the peak
    h200 = lingbot_plan(139.0)
    assert h200.fits and h200.offloads == () and h200.peak_phase == "prefill"
    assert h200.phases["continuation"]["prefilled KV"] > 60 * GIB > 10 * GIB > h200.phases["continuation"]["task KV"]
    parked = build_plan(h200.shape, ("park_prefill",))  # a parked cache is copied back whole for each task
    assert parked.phases["continuation"]["prefilled KV"] == 0 and parked.host["prefilled KV"] > 60 * GIB
    assert parked.phases["continuation"]["task KV"] > h200.phases["continuation"]["prefilled KV"]
    text = lingbot_plan(h200.peak / GIB + 2.0)  # the reserve does not fit: the text encoder goes first
    assert text.fits and text.offloads == ("text_cpu",)
    small = lingbot_plan(79.6)  # the prefill alone does not fit an 80 GB card: the whole cache in host memory
    assert small.fits and "offload_kv" in small.offloads and small.peak < 30 * GIB
    assert lingbot_plan(139.0, 1000.0, "decoprune", "method.quota_pr=0.85").offloads == ()
    starved = lingbot_plan(79.6, host_gib=32.0)  # the 80 GB card needs the cache in host memory
    assert not starved.fits


def test_run_refuses_before_loading_anything_with_the_numbers_and_the_fix(tmp_path):
    from cmbench.runs.evaluator import ModelEvaluator
    from cmbench.spec import resolve_run

    cfg = config("backbone=lingbot_world_v2_14b", "method=fullkv", "backbone.memory.context_seconds=60",
                 "backbone.memory.device_gib=80", "backbone.memory.host_gib=64", f"backbone.path={tmp_path}/nowhere")
    with pytest.raises(ConfigError) as err:  # no weights exist: had it loaded anything, the error would say so
        spec = resolve_run(cfg)
        ModelEvaluator(spec.method, spec.generation, spec.data, spec.backbone, spec.scorer, seed=0)
    msg = str(err.value)
    assert "lingbot_world_v2_14b + fullkv does not fit 80.0 GiB" in msg
    assert re.search(r"needs \d+\.\d GiB at \w+", msg) and re.search(r"given \d+\.\d GiB of host memory", msg)
    assert "Fix:" in msg and "python -m cmbench plan" in msg


def test_plan_command_prints_phases_and_reference_machines(capsys):
    from cmbench.cli.plan import execute

    cfg = config("backbone=lingbot_world_v2_1_3b", "method=decoprune", "method.quota_pr=0.85",
                 "backbone.memory.context_seconds=60", "backbone.memory.device_gib=139")
    assert execute(cfg) == 0
    out = capsys.readouterr().out
    for phase in ("load", "encode", "prefill", "continuation", "decode", "score"):
        assert re.search(rf"^  {phase}\s+\d+\.\d\d", out, re.M), phase
    assert "244 context + 16 continuation latent frames" in out
    assert "a 60 s context (backbone.memory.context_seconds)" in out.splitlines()[0]  # which context was planned
    assert "one H200 (139 GiB): yes" in out and "one 80 GB GPU" in out
    tiny = config("backbone=tiny")
    assert execute(tiny) == 0 and "no memory plan" in capsys.readouterr().out


def test_split_plan_is_one_ranks_share_and_a_wrong_split_is_one_line(capsys):
    from cmbench.cli.plan import execute

    base = ("backbone=lingbot_world_v2_14b", "method=fullkv", "backbone.memory.context_seconds=60",
            "backbone.memory.device_gib=139")
    whole = plan_for(config(*base), build_method({"name": "fullkv"}))
    split = plan_for(config(*base, "parallel.sequence=4"), build_method({"name": "fullkv"}))
    assert split.shape.sequence == 4 and split.shape.dit == whole.shape.dit  # weights replicated
    # a quarter of the heads: the prefilled cache is exactly a quarter, the growth peaks within a row's rounding
    assert split.shape.kv.prefilled_stored * 4 == whole.shape.kv.prefilled_stored
    assert split.shape.kv.prefill_peak == pytest.approx(whole.shape.kv.prefill_peak / 4, rel=1e-3)
    assert split.fits and "offload_kv" not in split.offloads and not whole.phases["prefill"]["KV"] < 139 * GIB
    assert execute(config(*base, "parallel.sequence=4")) == 0
    out = capsys.readouterr().out
    assert "split over 4 ranks, memory per rank" in out.splitlines()[0] and "one rank of 4 per GPU" in out
    with pytest.raises(ConfigError, match=r"^parallel.sequence=3 does not divide the model's 40 attention heads"):
        plan_for(config(*base, "parallel.sequence=3"), build_method({"name": "fullkv"}))


def test_committed_table_is_what_the_planner_prints():
    """docs/real_backbones.md carries `python scripts/memory_table.py`'s output."""
    table = fit_table(documented_shapes())
    assert table in (REPO / "docs" / "real_backbones.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert "yes (as configured)" in rows["lingbot_world_v2_1_3b + decoprune @ PR 0.85"]
    assert "no" not in rows["lingbot_world_v2_14b + decoprune @ PR 0.85"].split(" | ")[5]
    split = rows["lingbot_world_v2_14b + fullkv / 4 ranks"].split(" | ")  # the paper's 4xH200 setup
    assert split[6].startswith("yes") and "all KV in host RAM" not in split[6]


# ----------------------------------------------------------------------------- bounded-memory paths
def filled_cache(chunks: int = 3) -> KVCache:
    g = geometry_of({"dit": DIT.to_dict(), "height": 32, "width": 32, "chunk_frames": 2})
    cache = KVCache.from_geometry(g)
    torch.manual_seed(0)
    for c in range(chunks):
        cache.begin_chunk(c, 2 * c, 2)
        for layer in range(g.num_layers):
            q = torch.randn(1, g.tokens_per_chunk, g.num_heads, g.head_dim)
            cache.attend(layer, q, torch.randn_like(q), torch.randn_like(q))
        cache.commit_chunk()
    return cache


def test_trim_and_park_keep_the_history_and_fork_back():
    cache = filled_cache()
    history = [b.history()[0].clone() for b in cache.all_banks()]
    assert kv_bytes(cache) > cache.stored_bytes()  # geometric growth left free rows
    cache.trim()
    assert kv_bytes(cache) == cache.stored_bytes()
    cache.park("cpu")
    assert cache.fork_device is None  # already on the host: nothing to fork back to
    fork = cache.fork(headroom=8)
    for bank, before in zip(fork.all_banks(), history):
        torch.testing.assert_close(bank.history()[0], before, atol=0, rtol=0)
        assert bank.capacity == bank.n + 8


def test_reindex_in_blocks_equals_one_block(monkeypatch):
    import cmbench.cache.kv_cache as kv_cache

    whole, blocked = filled_cache(), filled_cache()
    whole.reindex(6, 1, 3.0)
    monkeypatch.setattr(kv_cache, "REINDEX_BLOCK_BYTES", 3 * 2 * 12 * 4)  # 3 rows per block
    blocked.reindex(6, 1, 3.0)
    for a, b in zip(whole.all_banks(), blocked.all_banks()):
        torch.testing.assert_close(a.history()[0], b.history()[0], atol=0, rtol=0)
        torch.testing.assert_close(a.field("tpos"), b.field("tpos"))


def test_head_map_attention_never_holds_all_heads_logits():
    torch.manual_seed(0)
    q, k = torch.randn(1, 64, 4, 16), torch.randn(1, 3000, 4, 16)
    frames = torch.arange(3000) // 500
    dense = torch.einsum("blhd,bnhd->bhln", q, k).div(4.0).softmax(-1).mean((0, 2))
    expect = torch.zeros(4, 6).index_add_(1, frames, dense)
    budget = 16 * 3000 * 4  # float32 logits of 16 queries of one head over all keys
    with PeakMemory("cpu") as peak:
        got = frame_mass(q, k, frames, 6, block_bytes=budget)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)
    all_logits = 4 * 64 * 3000 * 4
    assert peak.peak < 4 * budget + 3000 * 16 * 4 * 2 < all_logits


def test_shape_of_a_run_comes_from_its_config_alone():
    cfg = config("backbone=lingbot_world_v2_14b", "method=fullkv", "backbone.memory.context_seconds=60")
    shape = run_shape(cfg, build_method({"name": "fullkv"}))
    assert shape.context_frames == 244 and shape.tokens_per_chunk == 4 * 1560
    assert shape.kv.prefilled_stored == 244 * 1560 * 40 * 40 * 128 * 2 * 2  # every context token, K and V, bf16
    plan = build_plan(shape)
    assert plan.peak_phase == "prefill"  # the growth copies; a task's fork reads the prefilled cache in place
    assert choose_plan(shape, int(139 * GIB), int(64 * GIB), 4 * GIB).fits is False
