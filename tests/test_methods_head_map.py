"""Head maps: ForcingKV's JSON, the s >= 0.8 rule, and calibration from FullKV attention."""

import json

import pytest
import torch

from cmbench.errors import ConfigError
from cmbench.calibration.head_map import calibrate_head_scores
from cmbench.generation import continue_task, prefill
from cmbench.methods.fullkv import FullKV
from cmbench.methods.head_map import HeadMap, static_scores
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
