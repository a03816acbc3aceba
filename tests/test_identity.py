"""What a record's code identity covers, and the automatic labels (display names, not identity)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import textwrap
from dataclasses import dataclass, field

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cmbench.api import compose_config
from cmbench.config_paths import CONFIG_DIR, PACKAGE_ROOT
from cmbench.errors import ConfigError
from cmbench.methods import Method
from cmbench.methods.decoprune import DeCoPrune
from cmbench.identity import code as identity
from cmbench.spec import resolve_run, run_dir_for
from cmbench.identity.labels import auto_label, run_label


def test_every_module_of_the_package_is_declared_result_or_harness():
    roles = {m: identity.code_role(m) for m in identity.package_modules()}
    assert [m for m, r in roles.items() if r is None] == []
    assert roles["methods/decoprune.py"] == roles["cache/kv_cache.py"] == roles["runs/evaluator.py"] == "result"
    assert roles["report/leaderboard.py"] == roles["cli/run.py"] == roles["runs/records.py"] == "harness"
    for entry in identity.RESULT_CODE:  # no entry is on both sides
        assert identity.code_role(entry) == "result"


def test_what_the_code_does_counts_not_docstrings_comments_or_layout():
    base = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    same = 'def f(x):\n    """Other words."""\n\n    # a comment\n    return (x +\n            1)\n'
    assert identity.normalised_source(base) == identity.normalised_source(same)
    assert identity.normalised_source(base) != identity.normalised_source(base.replace("x + 1", "x + 2"))
    assert identity.normalised_source('"""Only a docstring."""\n') == identity.normalised_source("")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A plug-in package outside CMBench: mymethods/press.py (the class) imports mymethods/util.py."""
    pkg = tmp_path / "mymethods"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "util.py").write_text("def threshold():\n    return 0.5\n")
    (pkg / "press.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass

        from cmbench.methods.decoprune import DeCoPrune
        from mymethods.util import threshold


        @dataclass
        class Press(DeCoPrune):
            """A plug-in."""

            name = "press"
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))

    def load():
        for name in ("mymethods.press", "mymethods.util", "mymethods"):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
        return importlib.import_module("mymethods.press").Press

    yield pkg, load
    for name in ("mymethods.press", "mymethods.util", "mymethods"):
        sys.modules.pop(name, None)


def test_a_plugin_is_hashed_from_its_module_and_the_modules_it_imports_from_its_package(plugin):
    pkg, load = plugin
    assert identity.plugin_code_hash(DeCoPrune) is None  # built-in: CMBench's hash covers it
    first = identity.plugin_code_hash(load())
    assert identity.plugin_sources([sys.modules["mymethods.press"]]) == [pkg / "press.py", pkg / "util.py"]
    (pkg / "press.py").write_text((pkg / "press.py").read_text().replace('"""A plug-in."""', '"""Reworded."""'))
    assert identity.plugin_code_hash(load()) == first  # a docstring is not code
    (pkg / "util.py").write_text("def threshold():\n    return 0.6\n")
    second = identity.plugin_code_hash(load())
    assert second != first  # a helper module of the plug-in's package changed
    (pkg / "press.py").write_text((pkg / "press.py").read_text() + "\n    gamma: float = 0.2\n")
    assert identity.plugin_code_hash(load()) not in (first, second)


def test_a_class_without_a_file_is_hashed_from_its_code():
    namespace: dict = {}
    exec("from dataclasses import dataclass\nfrom cmbench.methods.decoprune import DeCoPrune\n"
         "@dataclass\nclass Notebook(DeCoPrune):\n    name = 'nb'\n    def f(self):\n        return 1\n", namespace)
    cls = namespace["Notebook"]
    cls.__module__ = "notebook_cell"
    sys.modules["notebook_cell"] = type(sys)("notebook_cell")  # no __file__, as in a notebook
    try:
        first = identity.plugin_code_hash(cls)
        assert first is not None and identity.plugin_code_hash(cls) == first
        cls.f.__code__ = (lambda self: 2).__code__
        assert identity.plugin_code_hash(cls) != first
    finally:
        del sys.modules["notebook_cell"]


def test_files_are_fingerprinted_whole_or_sampled_with_their_same_stem_siblings(tmp_path, monkeypatch):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(range(256)) * 64)
    (tmp_path / "model.json").write_text('{"layers": 2}')
    (tmp_path / "model_eval.csv").write_text("not a sibling")
    cfg = {"_target_": "x.y", "path": str(weights), "device": "cpu", "nested": {"dir": str(tmp_path)}}
    files = identity.backbone_files(cfg)
    assert sorted(files) == ["nested.dir", "path"]  # keyed by config key: moving the files is the config's business
    before = files["path"]
    (tmp_path / "model.json").write_text('{"layers": 3}')  # the model's config beside its weights
    after = identity.backbone_files(cfg)["path"]
    assert after != before
    (tmp_path / "model_eval.csv").write_text("other")  # another stem: not part of the model file
    assert identity.backbone_files(cfg)["path"] == after
    assert identity.file_fingerprint(weights).startswith("sha256:")
    monkeypatch.setattr(identity, "FULL_HASH_BYTES", 1024)  # pretend the file is a multi-GB shard
    monkeypatch.setattr(identity, "SAMPLE_BYTES", 100)
    monkeypatch.setattr(identity, "SAMPLES", 4)  # blocks at 0, 5428, 10856, 16284 of 16384 bytes
    sampled = identity.file_fingerprint(weights)
    assert sampled.startswith("sampled:16384:")
    data = bytearray(weights.read_bytes())
    data[5430] ^= 1  # inside a sampled block
    weights.write_bytes(bytes(data))
    assert identity.file_fingerprint(weights) != sampled
    data[3000] ^= 1  # between samples: the documented blind spot
    weights.write_bytes(bytes(data))
    changed = identity.file_fingerprint(weights)
    data[3000] ^= 1
    weights.write_bytes(bytes(data))
    assert identity.file_fingerprint(weights) == changed
    assert identity.path_fingerprint(tmp_path / "absent") == "missing"


def test_the_tiny_backbone_names_its_committed_weights_and_they_are_fingerprinted():
    cfg = compose_config("decoprune")
    assert cfg.backbone.path == str(PACKAGE_ROOT / "backbones" / "weights" / "tiny_miniworld_dynamic.safetensors")
    files = identity.backbone_files(OmegaConf.to_container(cfg.backbone, resolve=True))
    assert set(files) == {"path", "head_map"}
    assert identity.portable(str(cfg.backbone.path)) == "${package_root:}/backbones/weights/tiny_miniworld_dynamic.safetensors"


def test_labels_name_the_knobs_that_differ_from_the_class_defaults():
    assert run_label(compose_config("decoprune")) == "decoprune"
    assert run_label(compose_config("decoprune", ["method.quota_pr=0.8"])) == "decoprune@quota_pr=0.8"
    assert run_label(compose_config("decoprune", ["method.gamma=0.2", "method.post_prune=true"])) == \
        "decoprune@gamma=0.2,post_prune=true"
    assert run_label(compose_config("decoprune", ["method.gamma=0.1"])) == "decoprune"  # the default itself
    assert run_label(compose_config("decoprune_hs")) == "decoprune_hs"  # head map follows the backbone
    assert run_label(compose_config("streaming", ["label=sink_only", "method.recent_chunks=0"])) == "sink_only"
    with pytest.raises(ConfigError, match="label=/: holds '/', which is a path separator; choose a plain name"):
        run_label(compose_config("decoprune", ["label=/"]))
    assert auto_label({"name": "random", "keep_counts": {"4": 10}}) == 'random@keep_counts={"4":10}'


def test_every_shipped_method_config_is_its_class_defaults():
    """A plain ``method=<name>`` is labelled ``<name>``: the yamls set no knob off its class default."""
    for path in sorted((CONFIG_DIR / "method").glob("*.yaml")):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = compose(config_name="config", overrides=[f"method={path.stem}"])
        assert run_label(cfg) == cfg.method.name, path.name


def test_a_label_is_not_part_of_the_run_identity_and_seeds_share_a_setup():
    plain = compose_config("decoprune")
    assert run_dir_for(compose_config("decoprune", ["label=mine"])) == run_dir_for(plain)
    assert run_dir_for(compose_config("decoprune", ["seed=3"])) != run_dir_for(plain)
    def setup_hash(cfg):
        return resolve_run(cfg).identity.setup_hash

    assert setup_hash(compose_config("decoprune", ["seed=3"])) == setup_hash(plain)
    assert setup_hash(compose_config("decoprune", ["method.gamma=0.2"])) != setup_hash(plain)
    assert run_dir_for(plain).name.startswith("decoprune__tiny__light__")


def test_only_paths_inside_the_package_are_made_portable():
    """A sibling folder whose name starts with the package's (``<root>_weights/``) is not inside it."""
    root = str(PACKAGE_ROOT)
    assert identity.portable(f"{root}/backbones/w.safetensors") == "${package_root:}/backbones/w.safetensors"
    assert identity.portable(root) == "${package_root:}"
    assert identity.portable(f"{root}_weights/w.safetensors") == f"{root}_weights/w.safetensors"
    assert identity.portable({"a": [f"{root}x"], "b": 3}) == {"a": [f"{root}x"], "b": 3}


def test_a_label_lists_the_changed_knobs_in_the_class_field_order_not_alphabetically():
    """DeCoPrune declares ``probe_step``, ``score``, then ``post_prune``: the label keeps that order whatever
    order the overrides come in (alphabetically ``post_prune`` would come first)."""
    fields = [f.name for f in dataclasses.fields(DeCoPrune)]
    assert fields.index("probe_step") < fields.index("score") < fields.index("post_prune")
    cfg = compose_config("decoprune", ["method.post_prune=true", "method.score=chunk_normalised", "method.probe_step=1"])
    assert run_label(cfg) == "decoprune@probe_step=1,score=chunk_normalised,post_prune=true"



@dataclass
class Layered(Method):
    """An external method (built by ``_target_``, not registered) with a derived field before knobs whose
    defaults are a tuple, a list from a factory and a mapping."""

    name = "layered"
    tokens: int = field(init=False, default=0)
    shape: tuple[int, ...] = (2, 3)
    layers: list[int] = field(default_factory=lambda: [0, 1])
    table: dict[str, int] = field(default_factory=lambda: {"b": 1, "a": 2})


def test_an_external_methods_label_compares_knobs_with_its_own_class_defaults():
    """The defaults come from the ``_target_`` class (its name is registered nowhere), past a derived field and
    from default factories; a yaml list equals a tuple default; ``_target_`` itself is no knob."""
    cfg = {"_target_": "test_identity.Layered", "name": "layered"}
    assert auto_label({**cfg, "shape": [2, 3], "layers": [0, 1], "table": {"a": 2, "b": 1}}) == "layered"
    assert auto_label({**cfg, "recent_chunks": 1, "layers": [0, 2], "shape": [2, 4]}) == \
        "layered@shape=[2,4],layers=[0,2]"
    assert auto_label({**cfg, "table": {"b": 1, "a": 3}}) == 'layered@table={"a":3,"b":1}'


def test_a_label_spells_mapping_knobs_the_same_whatever_their_order_or_source():
    """Keys sorted, no spaces: the same counts read from a composed config or given as a dict in another
    order make the same label."""
    composed = run_label(compose_config("random", ["method.keep_counts={8:1,4:10}"]))
    assert composed == auto_label({"name": "random", "keep_counts": {"4": 10, "8": 1}}) == \
        'random@keep_counts={"4":10,"8":1}'


def test_a_knob_the_method_does_not_have_is_labelled_last_and_left_to_the_method_to_refuse():
    assert auto_label({"name": "decoprune", "gama": 0.2, "gamma": 0.3}) == "decoprune@gamma=0.3,gama=0.2"
