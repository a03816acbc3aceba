"""Method registry: configs build every method, errors suggest names, external methods plug in."""

from dataclasses import dataclass

import pytest
import torch
from omegaconf import OmegaConf

from cmbench.config_paths import CONFIG_DIR, group_entries
from cmbench.errors import ConfigError
from cmbench.generation import continue_task, prefill
from cmbench.methods import Method, build_method, describe_methods, method_names
from fakes import AttentionBackbone, fake_geometry

CONFIGS = CONFIG_DIR / "method"


def test_every_registered_method_has_a_config_with_description_and_paper_field():
    names = method_names()
    assert set(names) == {p.stem for p in CONFIGS.glob("*.yaml")}
    listed = group_entries("method")
    for name in names:
        cfg = OmegaConf.load(CONFIGS / f"{name}.yaml")
        assert cfg.name == name and "paper" in cfg
        assert cfg.description == describe_methods()[name]["description"] == listed[name]["description"]
        method = build_method(cfg)
        assert method.name == name
        assert set(method.knobs()) == set(cfg) - {"name", "description", "paper"}  # every knob is in the yaml


def test_decoprune_defaults_are_the_papers():
    m = build_method(OmegaConf.load(CONFIGS / "decoprune.yaml"))
    assert (m.gamma, m.probe_step, m.sink_chunks, m.recent_chunks, m.score, m.post_prune) == (0.10, 2, 1, 1, "mse", False)


def test_unknown_names_and_knobs():
    with pytest.raises(ConfigError, match="Did you mean 'decoprune'"):
        build_method({"name": "decoprun"})
    with pytest.raises(ConfigError, match="has no knob.*gama.*its knobs are"):
        build_method({"name": "decoprune", "gama": 0.2})
    with pytest.raises(ConfigError, match="needs 'name'"):
        build_method({"gamma": 0.2})
    with pytest.raises(ConfigError, match="cannot import"):
        build_method({"_target_": "no_such_pkg.Thing"})
    with pytest.raises(ConfigError, match="not a subclass"):
        build_method({"_target_": "collections.OrderedDict"})


@dataclass
class KeepEveryOther(Method):
    """An external method: keeps tokens with an even in-frame position when they leave the window."""

    name = "keep_every_other"
    description = "test plug-in"
    stride: int = 2

    def rule(self, bank, newest):
        return self.protected(bank, newest) | (bank.field("pos") % self.stride == 0)


def test_external_method_plugs_in_by_target(tmp_path, monkeypatch):
    folder = tmp_path / "method"
    folder.mkdir()
    (folder / "every_other.yaml").write_text(
        "_target_: test_methods_registry.KeepEveryOther\nname: keep_every_other\n"
        "description: keeps even positions\npaper: https://example.org\nstride: 2\n"
    )
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(tmp_path))
    assert group_entries("method")["every_other"]["description"] == "keeps even positions"
    method = build_method(OmegaConf.load(folder / "every_other.yaml"))
    assert isinstance(method, KeepEveryOther)
    backbone = AttentionBackbone(fake_geometry())
    cont = continue_task(backbone, prefill(backbone, method, torch.randn(1, 3, 6, 4, 4), None, 0), None, 2, 0)
    assert cont.cache.banks[0][0].field("gid").tolist() == list(range(8)) + [8, 10, 12, 14, 16, 18, 20, 22] + list(range(24, 32))
