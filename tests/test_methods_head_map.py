"""Head maps: ForcingKV's JSON, the s >= 0.8 rule, and calibration from FullKV attention."""

import json

import pytest
import torch

from cmbench.cache import HeadGroup
from cmbench.errors import ConfigError
from cmbench.calibration.head_map import calibrate_head_scores
from cmbench.generation import continue_task, prefill
from cmbench.methods.fullkv import FullKV
from cmbench.methods.head_map import HeadMap, static_masses, static_scores
from fakes import AttentionBackbone, fake_geometry


def test_json_round_trip_in_forcingkv_format(tmp_path):
    hmap = HeadMap(2, 3, ((), (0, 2)), {"threshold": 0.8})
    path = tmp_path / "m.json"
    hmap.save(path)
    data = json.loads(path.read_text())
    assert data["num_layers"] == 2 and data["num_heads"] == 3 and data["threshold"] == 0.8
    assert data["layers"][1] == {"layer_idx": 1, "static_head": [0, 2], "dynamic_head": [1]}
    assert HeadMap.load(path) == hmap and HeadMap.load(path).meta == {"threshold": 0.8}


@pytest.mark.parametrize("bad, message", [
    ({"num_layers": 1, "num_heads": 2}, "layers list"),
    ({"num_layers": 1, "num_heads": 2, "layers": [{"layer_idx": 0, "static_head": [0], "dynamic_head": [0]}]}, "partition"),
    ({"num_layers": 2, "num_heads": 1, "layers": [{"layer_idx": 0, "static_head": [], "dynamic_head": [0]}]}, "2 layers declared"),
    ({"num_layers": 1, "num_heads": 1, "layers": [{"layer_idx": 3, "static_head": [], "dynamic_head": [0]}]}, "out of range"),
    ({"num_layers": 1, "num_heads": 1, "layers": [{"layer_idx": 0, "static": []}]}, "needs layer_idx"),
])
def test_malformed_maps_are_config_errors(bad, message, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=message):
        HeadMap.load(path)
    with pytest.raises(ConfigError, match="does not exist"):
        HeadMap.load(tmp_path / "missing.json")


def test_static_rule_and_layer_zero():
    scores = torch.tensor([[0.9, 0.1], [0.8, 0.79], [float("nan"), 2.0]])
    hmap = HeadMap.from_scores(scores, 0.8, dynamic_layers=(0,))
    assert hmap.static == ((), (0,), (1,))
    assert hmap.dynamic(1) == (1,) and hmap.num_static == 2


def test_static_scores_by_hand():
    mass = torch.zeros(1, 2, 14)  # 12 context frames, 2 frames of the chunk
    mass[0, 0, [0, 5, 9, 11, 12]] = torch.tensor([0.5, 0.1, 0.1, 0.2, 0.1])  # last 4 ctx: 0.3; frames 4..11: 0.4
    mass[0, 1, [0, 1, 12]] = torch.tensor([0.6, 0.3, 0.1])  # nothing after the first 4 context frames
    s = static_scores(mass, 12)
    assert s[0, 0].item() == pytest.approx(0.75)
    assert torch.isnan(s[0, 1])
    with pytest.raises(ConfigError, match="more than 4 context frames"):
        static_scores(mass, 4)


def test_calibration_pools_fullkv_attention_over_contexts():
    """Appendix B: s = (sum over contexts of the recent mass) / (sum over contexts of the older mass),
    not the mean of per-context ratios (contexts of 12 and 20 frames: different denominators)."""
    g = fake_geometry(num_heads=3)
    backbone = AttentionBackbone(g, seed=4)
    contexts = [(torch.randn(1, 3, frames, 4, 4, generator=torch.Generator().manual_seed(i)), None, i)
                for i, frames in enumerate((12, 20))]
    got = calibrate_head_scores(backbone, contexts)
    numerators, denominators = [], []
    for latents, cond, seed in contexts:
        pre = prefill(backbone, FullKV(), latents, cond, seed)
        mass = continue_task(backbone, pre, cond, 2, seed, record_attention_at=(0,)).attention[0].stacked()
        q0 = latents.shape[2]
        numerators.append(mass[..., q0 - 4 : q0].sum(-1))
        denominators.append(mass[..., 4:q0].sum(-1))
    torch.testing.assert_close(got, sum(numerators) / sum(denominators))
    mean_of_ratios = sum(n / d for n, d in zip(numerators, denominators)) / 2
    assert (got - mean_of_ratios).abs().max() > 1e-3  # the two poolings differ here
    assert got.shape == (2, 3) and torch.all((got > 0) & (got <= 1))


@pytest.mark.parametrize("backbone", ["lingbot_world_v2_14b", "lingbot_world_v2_1_3b"])
def test_run_refuses_decoprune_hs_without_a_head_map_naming_the_command_that_builds_one(backbone, tmp_path):
    """LingBot ships no head map: the run stops before loading anything, in one line naming the command."""
    from cmbench.api import compose_config
    from cmbench.runs.evaluator import ModelEvaluator
    from cmbench.spec import resolve_run

    cfg = compose_config("decoprune_hs", [f"backbone={backbone}", "data=cmbench"])
    with pytest.raises(ConfigError) as err:
        ModelEvaluator.from_spec(resolve_run(cfg))
    message = str(err.value)
    assert "\n" not in message and "decoprune_hs needs head_map=" in message
    assert "python scripts/build_head_map.py --out head_map.json --contexts 15" in message


def test_the_head_map_command_checks_its_static_count_against_the_papers_lingbot_map():
    from cmbench.calibration.head_map import paper_check

    assert paper_check(232, 40, 40).endswith("the paper's LingBot map: 232 (matches)")
    assert paper_check(240, 40, 40).endswith("the paper's LingBot map: 232 (differs by +8)")
    assert "no paper count to compare" in paper_check(3, 4, 4)


def _masses():
    """Attention mass ``[1 layer, 2 heads, 11 frames]``: 9 context frames, then 2 of the chunk.

    Head 0: 0.25 on frame 0 (a first frame), 0.125 on frame 4, 0.25 on frame 6, 0.125 on frame 8 and 0.25
    on frame 9 (the chunk). Head 1: 0.5 on frame 2 and 0.5 on frame 10 (nothing on frames 4..8).
    """
    mass = torch.zeros(1, 2, 11)
    mass[0, 0, [0, 4, 6, 8, 9]] = torch.tensor([0.25, 0.125, 0.25, 0.125, 0.25])
    mass[0, 1, [2, 10]] = torch.tensor([0.5, 0.5])
    return mass


def test_static_masses_default_to_the_first_four_and_last_four_context_frames():
    """q0 = 9, first = last = 4: numerator = frames 5..8, denominator = frames 4..8.

    Head 0: 0.25 + 0.125 = 0.375 over 0.125 + 0.25 + 0.125 = 0.5, s = 0.75 (frame 4 is in the denominator
    only); head 1: 0 over 0, s = nan. With q0 = 5 (the fewest allowed): frames 1..4 over frame 4, head 0
    0.125 over 0.125, head 1 0.5 (frame 2) over 0.
    """
    numerator, denominator = static_masses(_masses(), 9)
    assert numerator.tolist() == [[0.375, 0.0]] and denominator.tolist() == [[0.5, 0.0]]
    s = static_scores(_masses(), 9)
    assert s[0, 0].item() == 0.75 and torch.isnan(s[0, 1])
    assert [t.tolist() for t in static_masses(_masses(), 5)] == [[[0.125, 0.5]], [[0.125, 0.0]]]


def test_static_scores_pass_first_and_last_on():
    """q0 = 9, first = 2, last = 1: numerator = frame 8, denominator = frames 2..8.

    Head 0: 0.125 / (0.125 + 0.25 + 0.125) = 0.25; head 1: 0 / 0.5 (frame 2) = 0.
    """
    assert static_scores(_masses(), 9, first=2, last=1).tolist() == [[0.25, 0.0]]


def test_context_frames_must_exceed_first_and_reach_last():
    """q0 = last = 4 with first = 0 is allowed (frames 0..3 on both sides: head 0 0.25, head 1 0.5);
    q0 = first = 4 and q0 = 3 < last = 4 are refused."""
    numerator, denominator = static_masses(_masses(), 4, first=0, last=4)
    assert numerator.tolist() == denominator.tolist() == [[0.25, 0.5]]
    with pytest.raises(ConfigError) as err:
        static_masses(_masses(), 4)
    assert str(err.value) == "head scores need more than 4 context frames (and at least 4), got 4"
    with pytest.raises(ConfigError) as err:
        static_masses(_masses(), 3, first=0, last=4)
    assert str(err.value) == "head scores need more than 0 context frames (and at least 4), got 3"


def test_from_scores_defaults_threshold_and_layer_zero_and_keeps_metadata():
    """Scores ``[3 layers, 3 heads]`` in float64, so 0.8 is the threshold itself: static iff s >= 0.8 and
    finite, layer 0 all dynamic; the threshold and the keyword arguments become the metadata."""
    scores = torch.tensor([[0.9, 1.0, 0.5], [0.8, 0.7999, 0.0], [float("nan"), float("inf"), 1.0]],
                          dtype=torch.float64)
    hmap = HeadMap.from_scores(scores, backbone="tiny")
    assert hmap == HeadMap(3, 3, ((), (0,), (2,)))
    assert (hmap.num_layers, hmap.num_heads) == (3, 3)
    assert hmap.meta == {"threshold": 0.8, "backbone": "tiny"}


def test_saved_file_text_and_round_trip_with_metadata(tmp_path):
    """One-space indentation, as the committed maps; metadata after the layers."""
    hmap = HeadMap(1, 2, ((1,),), {"threshold": 0.8, "first": 4})
    path = tmp_path / "m.json"
    hmap.save(path)
    assert path.read_text() == (
        '{\n "num_layers": 1,\n "num_heads": 2,\n "layers": [\n  {\n   "layer_idx": 0,\n'
        '   "static_head": [\n    1\n   ],\n   "dynamic_head": [\n    0\n   ]\n  }\n ],\n'
        ' "threshold": 0.8,\n "first": 4\n}\n'
    )
    loaded = HeadMap.load(path)
    assert loaded == hmap and loaded.meta == {"threshold": 0.8, "first": 4}


@pytest.mark.parametrize("layers, message", [
    ([{"layer_idx": 1, "static_head": [], "dynamic_head": [0, 1]}], "layer_idx 1 is out of range or repeated"),
    ([{"layer_idx": 0, "static_head": [0], "dynamic_head": [0]}],
     "layer 0: static_head + dynamic_head must partition 0..1"),
])
def test_map_errors_name_the_source(layers, message, tmp_path):
    """A dict is "head map", a file its path; a layer index equal to num_layers (1) is out of range."""
    data = {"num_layers": 1, "num_heads": 2, "layers": layers}
    with pytest.raises(ConfigError) as err:
        HeadMap.from_json(data)
    assert str(err.value) == f"head map: {message}"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        HeadMap.load(path)
    assert str(err.value) == f"{path}: {message}"


def test_invalid_json_is_a_config_error_naming_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("not json")
    with pytest.raises(ConfigError) as err:
        HeadMap.load(path)
    assert str(err.value) == f"head map {path} is not valid JSON: Expecting value: line 1 column 1 (char 0)"


def test_load_for_checks_layers_and_heads_against_the_geometry(tmp_path):
    hmap = HeadMap(2, 3, ((), (0, 2)))
    path = tmp_path / "m.json"
    hmap.save(path)
    assert HeadMap.load_for(str(path), fake_geometry(num_heads=3), "decoprune_hs") == hmap
    with pytest.raises(ConfigError) as err:
        HeadMap.load_for(str(path), fake_geometry(num_heads=4), "decoprune_hs")
    assert str(err.value) == f"head map {path} is for 2x3 layer-heads, the backbone has 2x4"


def test_layout_banks_per_layer():
    """Map ``[3 layers, 3 heads]``: layer 0 static (0,) but listed dynamic, layer 1 static (0, 2), layer 2
    all static. Layer 0: one dynamic bank of every head; layer 1: dynamic (1,) then static (0, 2); layer
    2: only a static bank. Dynamic banks get 20 tokens, static ones 6; without dynamic layers layer 0
    keeps its static head."""
    hmap = HeadMap(3, 3, ((0,), (0, 2), (0, 1, 2)))
    assert hmap.layout(20, 6, dynamic_layers=(0,)) == [
        [HeadGroup((0, 1, 2), "dynamic", 20)],
        [HeadGroup((1,), "dynamic", 20), HeadGroup((0, 2), "static", 6)],
        [HeadGroup((0, 1, 2), "static", 6)],
    ]
    assert hmap.layout(20, 6)[0] == [HeadGroup((1, 2), "dynamic", 20), HeadGroup((0,), "static", 6)]


def test_with_static_layer_makes_only_that_layer_all_static():
    hmap = HeadMap(3, 3, ((), (1,), (0, 2)), {"threshold": 0.8})
    patched = hmap.with_static_layer(1)
    assert patched == HeadMap(3, 3, ((), (0, 1, 2), (0, 2))) and patched.meta == {"threshold": 0.8}
    assert hmap.static == ((), (1,), (0, 2))


def test_all_dynamic_map():
    hmap = HeadMap.all_dynamic(3, 2)
    assert (hmap.num_layers, hmap.num_heads, hmap.static, hmap.meta) == (3, 2, ((), (), ()), {})
    assert [hmap.dynamic(i) for i in range(3)] == [(0, 1)] * 3 and hmap.num_static == 0
