"""Real-backbone checkpoints: every config loads its release's key layout, mismatches are named,
and the DiT equals diffusers' WanTransformer3DModel on weights converted by our loader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file

from cmbench.backbones.dit import BlockCausalAttention, DiTConfig
from cmbench.backbones.loading import build_backbone
from cmbench.backbones.wan.checkpoint import diffusers_to_wan, merge_lora, read_state_dict
from cmbench.backbones.wan.synthetic import save_components, save_lingbot_dit, wan_config_json
from cmbench.cache.kv_cache import KVCache
from cmbench.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SMALL = {"dim": 24, "ffn_dim": 32, "num_heads": 2, "num_layers": 2, "text_dim": 16}  # scaled-down shapes
FRAME = 32  # pixels: latent 4x4, 2x2 tokens per latent frame


def wan_reference_shapes(dim, ffn_dim, num_layers, in_channels, out_channels, text_dim, camera_dim=None,
                         freq_dim=256, patch=(1, 2, 2)) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of Wan's ``WanModel`` (plus LingBot's camera layers), written out from
    the published module layout, independently of cmbench's DiT."""
    p = math.prod(patch)
    lin = lambda out, inp: {"weight": (out, inp), "bias": (out,)}  # noqa: E731
    shapes: dict[str, tuple[int, ...]] = {"patch_embedding.weight": (dim, in_channels, *patch),
                                          "patch_embedding.bias": (dim,), "head.modulation": (1, 2, dim)}
    modules = {"text_embedding.0": lin(dim, text_dim), "text_embedding.2": lin(dim, dim),
               "time_embedding.0": lin(dim, freq_dim), "time_embedding.2": lin(dim, dim),
               "time_projection.1": lin(6 * dim, dim), "head.head": lin(p * out_channels, dim)}
    if camera_dim is not None:
        modules.update({"patch_embedding_wancamctrl": lin(dim, camera_dim * p),
                        "c2ws_hidden_states_layer1": lin(dim, dim), "c2ws_hidden_states_layer2": lin(dim, dim)})
    for i in range(num_layers):
        b = f"blocks.{i}."
        for attn in ("self_attn", "cross_attn"):
            for proj in "qkvo":
                modules[f"{b}{attn}.{proj}"] = lin(dim, dim)
            shapes[f"{b}{attn}.norm_q.weight"] = (dim,)
            shapes[f"{b}{attn}.norm_k.weight"] = (dim,)
        shapes[f"{b}norm3.weight"] = (dim,)
        shapes[f"{b}norm3.bias"] = (dim,)
        modules[f"{b}ffn.0"] = lin(ffn_dim, dim)
        modules[f"{b}ffn.2"] = lin(dim, ffn_dim)
        shapes[f"{b}modulation"] = (1, 6, dim)
        if camera_dim is not None:
            for name in ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer", "cam_shift_layer"):
                modules[f"{b}{name}"] = lin(dim, dim)
    for module, params in modules.items():
        shapes.update({f"{module}.{k}": v for k, v in params.items()})
    return shapes


def random_state(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {k: 0.05 * torch.randn(s, generator=gen) for k, s in shapes.items()}


def yaml_config(name: str):
    return OmegaConf.load(REPO / "configs" / "backbone" / f"{name}.yaml")


def small_fields(name: str) -> dict:
    fields = OmegaConf.to_container(yaml_config(name).dit)
    fields.update(SMALL)
    return fields


def build(name: str, tmp: Path, **paths):
    cfg = yaml_config(name)
    cfg.merge_with({"dit": SMALL, "context": {"height": FRAME, "width": FRAME}, "text_len": 16, "dtype": "float32",
                    "text_dtype": "float32", "device": "cpu", "components": str(tmp / "components"), **paths})
    return build_backbone(cfg)


@pytest.fixture(scope="module")
def components(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wan")
    save_components(tmp / "components", text_dim=SMALL["text_dim"])
    return tmp


def assert_holds(model, state):
    own = model.state_dict()
    for key, value in state.items():
        torch.testing.assert_close(own[key].float(), value.float(), atol=0, rtol=0, msg=key)


@pytest.mark.parametrize("name", ["lingbot_world_v2_14b", "lingbot_world_v2_1_3b"])
def test_lingbot_release_layout_loads_every_key(components, name):
    fields = small_fields(name)
    shapes = wan_reference_shapes(fields["dim"], fields["ffn_dim"], fields["num_layers"], fields["in_channels"],
                                  fields["out_channels"], fields["text_dim"], fields["camera_dim"])
    assert shapes["patch_embedding.weight"][1] == 36 and shapes["patch_embedding_wancamctrl.weight"][1] == 384 * 4
    state = random_state(shapes)
    folder = components / name
    save_lingbot_dit(folder / "lingbot_world_fast", state, DiTConfig.from_dict(fields), shards=3, dtype=torch.float32)
    (folder / "Wan2.1_VAE.pth").write_bytes(b"")  # the release's other files sit next to the DiT folder
    backbone = build(name, components, path=str(folder))
    assert set(backbone.dit.state_dict()) == set(shapes)
    assert_holds(backbone.dit, state)
    assert backbone.geometry.tokens_per_frame == 4 and backbone.geometry.chunk_frames == 4


@pytest.mark.parametrize("name, key", [("self_forcing", "generator_ema"), ("causal_forcing", "generator")])
def test_self_forcing_style_pt_loads_the_configured_weights(components, name, key):
    fields = small_fields(name)
    shapes = wan_reference_shapes(fields["dim"], fields["ffn_dim"], fields["num_layers"], 16, 16, fields["text_dim"])
    states = {k: random_state(shapes, seed=i) for i, k in enumerate(("generator", "generator_ema"))}
    ckpt = components / f"{name}.pt"
    torch.save({k: {f"model.{n}": v for n, v in s.items()} for k, s in states.items()}, ckpt)
    backbone = build(name, components, checkpoint=str(ckpt))
    assert set(backbone.dit.state_dict()) == set(shapes)
    assert_holds(backbone.dit, states[key])
    assert backbone.geometry.chunk_frames == 3


def test_longlive_merges_its_peft_lora(components):
    fields = small_fields("longlive")
    shapes = wan_reference_shapes(fields["dim"], fields["ffn_dim"], fields["num_layers"], 16, 16, fields["text_dim"])
    base = random_state(shapes)
    torch.save({"generator": {f"model.{k}": v for k, v in base.items()}}, components / "longlive_base.pt")
    rank, gen = 4, torch.Generator().manual_seed(7)
    targets = sorted(k[: -len(".weight")] for k in shapes if k.startswith("blocks.") and len(shapes[k]) == 2)
    assert len(targets) == 2 * 10  # q, k, v, o of both attentions and the two FFN layers, per block
    lora = {}
    for module in targets:
        out, inp = shapes[f"{module}.weight"]
        lora[f"base_model.model.{module}.lora_A.weight"] = 0.1 * torch.randn(rank, inp, generator=gen)
        lora[f"base_model.model.{module}.lora_B.weight"] = 0.1 * torch.randn(out, rank, generator=gen)
    torch.save({"generator_lora": lora, "critic_lora": {}}, components / "lora.pt")
    backbone = build("longlive", components, checkpoint=str(components / "longlive_base.pt"),
                     lora=str(components / "lora.pt"))
    own = backbone.dit.state_dict()
    scale = 256 / rank  # the config's lora_alpha over the file's rank
    for module in targets:
        a, b = lora[f"base_model.model.{module}.lora_A.weight"], lora[f"base_model.model.{module}.lora_B.weight"]
        torch.testing.assert_close(own[f"{module}.weight"], base[f"{module}.weight"] + scale * b @ a)
    torch.testing.assert_close(own["blocks.0.self_attn.q.bias"], base["blocks.0.self_attn.q.bias"])
    assert (own["blocks.1.ffn.2.weight"] - base["blocks.1.ffn.2.weight"]).abs().max() > 0.1


def test_mismatched_checkpoint_names_every_bad_key(components):
    fields = small_fields("lingbot_world_v2_14b")
    shapes = wan_reference_shapes(fields["dim"], fields["ffn_dim"], fields["num_layers"], 36, 16,
                                  fields["text_dim"], 384)
    state = random_state(shapes)
    del state["blocks.1.cam_shift_layer.bias"]
    state["blocks.0.self_attn.k_img.weight"] = torch.zeros(24, 24)
    state["head.head.weight"] = torch.zeros(16, 24)  # a patch of 1 instead of 1x2x2
    folder = components / "broken"
    save_lingbot_dit(folder, state, DiTConfig.from_dict(fields), shards=1, dtype=torch.float32)
    with pytest.raises(ConfigError) as err:
        build("lingbot_world_v2_14b", components, path=str(folder))
    msg = str(err.value)
    assert "1 missing keys: ['blocks.1.cam_shift_layer.bias']" in msg
    assert "1 unexpected keys: ['blocks.0.self_attn.k_img.weight']" in msg
    assert "head.head.weight: checkpoint (16, 24) vs model (64, 24)" in msg


@pytest.mark.parametrize("name", ["self_forcing", "causal_forcing", "longlive"])
def test_mismatched_pt_checkpoint_names_every_bad_key(components, name):
    fields = small_fields(name)
    shapes = wan_reference_shapes(fields["dim"], fields["ffn_dim"], fields["num_layers"], 16, 16, fields["text_dim"])
    state = {f"model.{k}": v for k, v in random_state(shapes).items()}
    del state["model.blocks.0.cross_attn.norm_k.weight"]
    state["model.img_emb.proj.0.weight"] = torch.zeros(24)  # a Wan2.1 I2V (CLIP) checkpoint's key
    state["model.patch_embedding.weight"] = torch.zeros(24, 36, 1, 2, 2)  # I2V input channels
    key = OmegaConf.to_container(yaml_config(name))["state_key"]
    ckpt = components / f"{name}_broken.pt"
    torch.save({key: state}, ckpt)
    with pytest.raises(ConfigError) as err:
        build(name, components, checkpoint=str(ckpt), lora=None)
    msg = str(err.value)
    assert f"{name} checkpoint {ckpt} does not fit" in msg
    assert "1 missing keys: ['blocks.0.cross_attn.norm_k.weight']" in msg
    assert "1 unexpected keys: ['img_emb.proj.0.weight']" in msg
    assert "patch_embedding.weight: checkpoint (24, 36, 1, 2, 2) vs model (24, 16, 1, 2, 2)" in msg


def test_config_json_mismatch_names_the_fields(components):
    fields = small_fields("lingbot_world_v2_14b")
    folder = components / "other_shape"
    folder.mkdir()
    cfg = wan_config_json(DiTConfig.from_dict({**fields, "num_layers": 3, "ffn_dim": 48}))
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({"x": torch.zeros(1)}, str(folder / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(ConfigError, match=r"ffn_dim: checkpoint 48 vs backbone config 32; num_layers: checkpoint 3"):
        build("lingbot_world_v2_14b", components, path=str(folder))


def test_pt_file_errors_name_what_is_inside(tmp_path):
    ckpt = tmp_path / "two.pt"
    torch.save({"generator": {"a": torch.zeros(1)}, "generator_ema": {"a": torch.ones(1)}}, ckpt)
    with pytest.raises(ConfigError, match=r"several state dicts \['generator', 'generator_ema'\]"):
        read_state_dict(ckpt)
    with pytest.raises(ConfigError, match=r"no state dict under 'ema'; the file holds \['generator', 'gen"):
        read_state_dict(ckpt, "ema")
    assert read_state_dict(ckpt, "generator_ema")["a"].item() == 1.0
    with pytest.raises(ConfigError, match="does not exist"):
        build_backbone({**OmegaConf.to_container(yaml_config("lingbot_world_v2_14b"), resolve=True),
                        "path": str(tmp_path / "nowhere"), "device": "cpu"})


def test_lora_that_does_not_fit_is_named():
    base = {"blocks.0.ffn.0.weight": torch.zeros(8, 4)}
    with pytest.raises(ConfigError, match=r"blocks.0.ffn.9: no base weight"):
        merge_lora(dict(base), {"base_model.model.blocks.0.ffn.9.lora_A.weight": torch.zeros(2, 4),
                                "base_model.model.blocks.0.ffn.9.lora_B.weight": torch.zeros(8, 2)}, 2.0)
    with pytest.raises(ConfigError, match=r"A \(2, 5\) and B \(8, 2\) do not fit W \(8, 4\)"):
        merge_lora(dict(base), {"base_model.model.blocks.0.ffn.0.lora_A.weight": torch.zeros(2, 5),
                                "base_model.model.blocks.0.ffn.0.lora_B.weight": torch.zeros(8, 2)}, 2.0)


def test_one_chunk_equals_diffusers_through_our_loader(components):
    """diffusers' WanTransformer3DModel saved in its own layout, loaded by the T2V loader: same flow, 1e-5."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(4)
    ref = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.08)
    ref.save_pretrained(str(components / "diffusers" / "transformer"))
    folder = components / "diffusers" / "transformer"
    assert "condition_embedder.time_proj.weight" in read_state_dict(folder)
    backbone = build("self_forcing", components, checkpoint=str(folder), state_key=None,
                     context={"height": 32, "width": 48})
    assert set(diffusers_to_wan(ref.state_dict())) == set(backbone.dit.state_dict())

    from cmbench.backbones.wan.backbone import WanCondition

    cond = WanCondition("t", ("a vase",) * 6, "the camera turns back", context_frames=8, context_prompts="clips")
    x = torch.randn(1, 16, 3, 4, 6)
    t = 0.7
    text = backbone.text.encode(cond.prompt_at(0))
    assert (text[0, -1] == 0).all() and text[0, 0].abs().sum() > 0  # zero padding after the prompt
    with torch.no_grad():
        expected = ref(x, torch.tensor([1000.0 * t]), text, return_dict=False)[0]
        got = backbone.velocity(x, t, BlockCausalAttention([(0, True)], 18), 0, cond)
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # the Backbone call through the KV cache returns x0 = x_t - t * v
    cache = KVCache.from_geometry(backbone.geometry)
    cache.begin_chunk(0, 0, 3)
    x0 = backbone.denoise(x, t, cache, 0, cond)
    torch.testing.assert_close(x0, x - t * expected, atol=1e-5, rtol=1e-5)


def test_fsdp_wrapped_module_infix_is_removed_anywhere_in_a_key(components):
    """Checkpoints saved from FSDP-wrapped generators carry `_fsdp_wrapped_module.` inside keys."""
    fields = small_fields("self_forcing")
    shapes = wan_reference_shapes(fields["dim"], fields["ffn_dim"], fields["num_layers"], 16, 16, fields["text_dim"])
    state = random_state(shapes, seed=3)

    def wrapped(key: str) -> str:
        key = key.replace("blocks.", "blocks._fsdp_wrapped_module.", 1)
        return f"model._fsdp_wrapped_module.{key.replace('.self_attn.', '._fsdp_wrapped_module.self_attn.')}"

    assert wrapped("blocks.0.self_attn.q.weight") == \
        "model._fsdp_wrapped_module.blocks._fsdp_wrapped_module.0._fsdp_wrapped_module.self_attn.q.weight"
    ckpt = components / "fsdp.pt"
    torch.save({"generator_ema": {wrapped(k): v for k, v in state.items()}}, ckpt)
    backbone = build("self_forcing", components, checkpoint=str(ckpt))
    assert_holds(backbone.dit, state)


@pytest.mark.parametrize("name, fp32", [("lingbot_world_v2_14b", True), ("lingbot_world_v2_1_3b", True),
                                        ("self_forcing", False), ("causal_forcing", False), ("longlive", False)])
def test_residual_precision_is_a_backbone_property(name, fp32):
    """LingBot's runtime carries the residual stream and head in float32; the Self-Forcing family's in bf16."""
    cfg = yaml_config(name)
    assert cfg.fp32_residual is fp32
    from cmbench.backbones.wan.components import meta_dit

    dit = meta_dit(small_fields(name), cfg.dtype, cfg.fp32_residual)
    assert dit.residual_dtype == (torch.float32 if fp32 else None)
    assert dit.head.head.weight.dtype == (torch.float32 if fp32 else torch.bfloat16)
    assert dit.blocks[0].self_attn.q.weight.dtype == torch.bfloat16


def test_weights_are_cast_tensor_by_tensor_without_a_second_copy(tmp_path):
    """float32 shards -> a bf16 model: the loader never holds the checkpoint and the model at once."""
    from cmbench.backbones.memory.measure import PeakMemory, module_bytes
    from cmbench.backbones.wan.checkpoint import open_state_dict
    from cmbench.backbones.wan.components import build_dit

    fields = {**small_fields("lingbot_world_v2_14b"), "dim": 64, "ffn_dim": 96, "num_layers": 12}
    shapes = wan_reference_shapes(fields["dim"], fields["ffn_dim"], fields["num_layers"], 36, 16, fields["text_dim"],
                                  384)
    state = random_state(shapes)
    save_lingbot_dit(tmp_path / "dit", state, DiTConfig.from_dict(fields), shards=3, dtype=torch.float32)
    checkpoint_bytes = sum(v.numel() * 4 for v in state.values())
    largest = max(v.numel() * 4 for v in state.values())
    with PeakMemory("cpu") as peak:
        dit = build_dit(fields, open_state_dict(tmp_path / "dit"), "test", "bfloat16", "cpu")
    model = module_bytes(dit)
    cast = sum(p.numel() * 2 for p in dit.parameters() if p.dtype == torch.bfloat16)  # made by the casts
    assert model < 0.6 * checkpoint_bytes  # mostly bf16 now
    # (float32 islands may keep the storage the safetensors reader made, which the tracker does not see)
    assert cast <= peak.peak <= model + 2 * largest  # never the checkpoint (or a second model) at once
    assert 2 * largest < checkpoint_bytes / 4  # so the bound above excludes holding the checkpoint
    assert_holds(dit, {k: v.to(torch.bfloat16) if dit.state_dict()[k].dtype == torch.bfloat16 else v
                       for k, v in state.items()})
