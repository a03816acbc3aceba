"""The generic registry and the declared config schema that the hashed / passed key lists come from."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from cmbench.backbones.loading import NON_ARGUMENT_KEYS
from cmbench.cli.base import COMMANDS
from cmbench.config_paths import CONFIG_DIR
from cmbench.config_schema import BACKBONE_KEYS, ROOT_KEYS, SCORER_KEYS, keys_with_role
from cmbench.errors import ConfigError
from cmbench.registry import Registry, import_object
from cmbench.spec import SELECTION_KEYS
from cmbench.scoring.registry import RESULT_KEYS, RUNTIME_KEYS


class Base:
    name = ""


class Good(Base):
    name = "good"


def test_registry_names_lookups_and_suggestions():
    reg: Registry[type] = Registry("widget", base=Base)
    reg.register()(Good)
    reg.add("lazy", "collections:OrderedDict")
    assert reg.names() == ["good", "lazy"] and "good" in reg and "nope" not in reg
    assert reg.get("good") is Good
    with pytest.raises(ConfigError, match=r"unknown widget 'goo'\. Did you mean 'good'\? Known: good, lazy"):
        reg.get("goo")
    with pytest.raises(ConfigError, match="is not a subclass of .*Base"):
        reg.get("lazy")  # imported lazily, then checked against the base class
    with pytest.raises(ValueError, match="already taken"):
        reg.add("good", object)


def test_registry_entry_points_and_targets(monkeypatch):
    class EntryPoint:
        name = "plugged"

        def load(self):
            return Good

    monkeypatch.setattr("cmbench.registry.entry_points", lambda group: [EntryPoint()] if group == "g" else [])
    reg: Registry[type] = Registry("widget", base=Base, entry_point_group="g")
    assert reg.names() == ["plugged"] and reg.get("plugged") is Good
    assert reg.import_target(f"{__name__}.Good") is Good
    with pytest.raises(ConfigError, match="is not a subclass"):
        reg.import_target("collections.OrderedDict")


def test_import_object_forms():
    from cmbench.backbones.tiny import TinyWorldModel

    assert import_object("cmbench.backbones.tiny.TinyWorldModel.from_pretrained") == TinyWorldModel.from_pretrained
    assert import_object("cmbench.backbones.tiny:TinyWorldModel") is TinyWorldModel
    assert import_object("cmbench.cli.ls").__name__ == "cmbench.cli.ls"
    with pytest.raises(ConfigError, match="cannot import _target_ 'cmbench.backbones.tiny.Nope'"):
        import_object("cmbench.backbones.tiny.Nope")
    with pytest.raises(ConfigError, match="no importable module"):
        import_object("no_such_package_anywhere.X")


def test_every_command_module_has_an_execute_function():
    for name in COMMANDS.names():
        assert callable(COMMANDS.get(name).function()), name


def test_every_shipped_config_key_is_declared():
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        root = compose(config_name="config")
        assert set(root) <= set(ROOT_KEYS), sorted(set(root) - set(ROOT_KEYS))
        for path in sorted((CONFIG_DIR / "scorer").glob("*.yaml")):
            scorer = compose(config_name="config", overrides=[f"scorer={path.stem}"]).scorer
            assert set(scorer) <= set(SCORER_KEYS), (path.stem, sorted(set(scorer) - set(SCORER_KEYS)))


def test_key_lists_are_derived_from_the_schema():
    assert SELECTION_KEYS == ("label", "limit", "sample_seed", "task_ids", "subset", "shard", "progress", "progress_every", "progress_seconds",
                              "logging", "keep_other_code", "out_dir", "leaderboard", "report", "runs", "save_videos",
                              "lossless_max_pixels", "videos", "out", "experiment", "threads", "parallel", "check", "target_pr",
                              "target_bytes", "methods", "target_prs", "calibration")
    assert "seed" not in SELECTION_KEYS and "generation" not in SELECTION_KEYS
    assert "label" in SELECTION_KEYS  # a display name: relabelling reruns nothing
    assert RUNTIME_KEYS == ("name", "description", "paper", "device", "precision", "batch_size", "cache_dir")
    assert RESULT_KEYS == ("min_box_size", "reference_aggregation", "detector", "segmenter", "embedder")
    assert NON_ARGUMENT_KEYS == keys_with_role(BACKBONE_KEYS, "doc", "cmbench", "runtime")
    assert "memory" in NON_ARGUMENT_KEYS
    assert {"path", "device"}.isdisjoint(NON_ARGUMENT_KEYS)  # loader arguments of the tiny backbone


def test_where_a_run_keeps_its_caches_is_not_its_identity():
    from cmbench.api import compose_config
    from cmbench.spec import run_dir_for

    real = ["backbone=lingbot_world_v2_1_3b", "data=cmbench", "scorer=owl_sam_dino"]
    base = compose_config("decoprune", real)
    parked = compose_config("decoprune", [*real, "backbone.memory.park_prefill=true", "scorer.batch_size=3",
                                          "scorer.cache_dir=null", "scorer.device=cpu"])
    assert run_dir_for(parked) == run_dir_for(base)
    assert run_dir_for(compose_config("decoprune", [*real, "method.gamma=0.2"])) != run_dir_for(base)

