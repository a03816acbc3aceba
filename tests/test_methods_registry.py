"""Method registry: configs build every method, errors suggest names, external methods plug in; the
class is the only source of a method's defaults and documentation."""

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cmbench.cli.ls import entries as group_entries
from cmbench.config_paths import CONFIG_DIR, knob_overrides
from cmbench.errors import ConfigError
from cmbench.generation import continue_task, prefill
from cmbench.methods import Method, build_method, describe_methods, method_class, method_names
from cmbench.methods.catalog import MARKERS, markdown_table
from cmbench.methods.knobs import check_knobs, knob_minimums
from cmbench.methods.registry import canonical_method_config, full_method_config
from fakes import AttentionBackbone, fake_geometry

CONFIGS = CONFIG_DIR / "method"
ROOT = Path(__file__).resolve().parent.parent
# the only knobs a shipped yaml may set, and why: the chosen backbone's calibrated head map
DOCUMENTED_DIFFERENCES = {"decoprune_hs": {"head_map"}}


def composed_method(name: str, *overrides: str):
    """``cfg.method`` exactly as ``python -m cmbench run method=<name>`` resolves it (tiny backbone)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=knob_overrides([f"method={name}", *overrides]))
    return cfg, OmegaConf.to_container(cfg.method, resolve=True)


def test_every_registered_method_has_a_config_and_documents_itself_in_its_class():
    names = method_names()
    assert set(names) == {p.stem for p in CONFIGS.glob("*.yaml")}
    listed = group_entries("method")
    for name in names:
        cfg = OmegaConf.load(CONFIGS / f"{name}.yaml")
        assert cfg.name == name
        assert set(cfg) - {"name"} == DOCUMENTED_DIFFERENCES.get(name, set())  # no docs, no copied defaults
        cls = method_class(name)
        assert cls.description and describe_methods()[name]["description"] == cls.description
        assert listed[name] == {"description": cls.description, "paper": cls.paper, "origin": str(CONFIG_DIR)}
        assert build_method(cfg).name == name


@pytest.mark.parametrize("name", method_names())
def test_composed_config_builds_the_class_defaults(name):
    """VALUES, not names: Hydra's ``method=<name>`` builds exactly the dataclass defaults, apart from the
    documented differences (the backbone's head map), and equals ``build_method({"name": name})``."""
    cfg, method_cfg = composed_method(name)
    built = build_method(method_cfg)
    defaults = method_class(name)()
    differences = {f.name for f in dataclasses.fields(defaults) if getattr(built, f.name) != getattr(defaults, f.name)}
    assert differences <= DOCUMENTED_DIFFERENCES.get(name, set())
    if "head_map" in differences:
        assert built.head_map == cfg.backbone.head_map and defaults.head_map is None
        assert built == dataclasses.replace(defaults, head_map=cfg.backbone.head_map)
    else:
        assert built == defaults == build_method({"name": name})
    assert full_method_config(method_cfg) == {"name": name, **built.knobs()}


def test_streaming_one_source_of_truth():
    _, method_cfg = composed_method("streaming")
    assert build_method({"name": "streaming"}).recent_chunks == build_method(method_cfg).recent_chunks == 2
    _, overridden = composed_method("streaming", "method.recent_chunks=0", "method.max_history_tokens=64")
    assert (build_method(overridden).recent_chunks, build_method(overridden).max_history_tokens) == (0, 64)
    _, typo = composed_method("streaming", "method.recent_chunk=0")
    with pytest.raises(ConfigError, match="has no knob.*recent_chunk.*its knobs are"):
        build_method(typo)


def test_canonical_config_keeps_only_what_differs_from_the_class():
    """A run's identity: spelling a default out changes nothing, a changed knob or head map shows."""
    spelled = {"name": "decoprune", **build_method({"name": "decoprune"}).knobs()}
    assert canonical_method_config(spelled) == canonical_method_config({"name": "decoprune"}) == {"name": "decoprune"}
    assert canonical_method_config({"name": "decoprune", "gamma": 0.2, "probe_step": 2}) == {"name": "decoprune",
                                                                                           "gamma": 0.2}
    _, composed = composed_method("decoprune_hs")
    assert canonical_method_config(composed) == {"name": "decoprune_hs", "head_map": composed["head_map"]}


def test_decoprune_defaults_are_the_papers():
    m = build_method(OmegaConf.load(CONFIGS / "decoprune.yaml"))
    assert (m.gamma, m.probe_step, m.sink_chunks, m.recent_chunks, m.score, m.post_prune) == (0.10, 2, 1, 1, "mse", False)


@pytest.mark.parametrize("path", ["README.md", "docs/methods.md"])
def test_method_tables_are_generated_from_the_classes(path):
    text = (ROOT / path).read_text()
    start, end = MARKERS
    assert f"{start}\n{markdown_table()}\n{end}" in text, f"{path} is stale: run scripts/update_method_tables.py"
    for name, doc in describe_methods().items():
        assert f"| `{name}` | {doc['description']} |" in markdown_table()


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
        "_target_: test_methods_registry.KeepEveryOther\nname: keep_every_other\nstride: 2\n"
    )
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(tmp_path))
    assert group_entries("method")["every_other"]["description"] == "test plug-in"  # from the class
    method = build_method(OmegaConf.load(folder / "every_other.yaml"))
    assert isinstance(method, KeepEveryOther)
    backbone = AttentionBackbone(fake_geometry())
    cont = continue_task(backbone, prefill(backbone, method, torch.randn(1, 3, 6, 4, 4), None, 0), None, 2, 0)
    assert cont.cache.banks[0][0].field("gid").tolist() == list(range(8)) + [8, 10, 12, 14, 16, 18, 20, 22] + list(range(24, 32))


def test_every_method_refuses_a_mistyped_or_negative_knob_by_name():
    """Every numeric or boolean knob of every registered method is checked when the method is built."""
    checked = 0
    for name in method_names():
        cls = method_class(name)
        hints, minimums = typing.get_type_hints(cls), knob_minimums(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] not in (int, float, bool):
                continue
            with pytest.raises(ConfigError, match=f"^method {name}: {f.name} must be .*, got 'abc'$"):
                build_method({"name": name, f.name: "abc"})
            if f.name in minimums:
                with pytest.raises(ConfigError, match=f"^method {name}: {f.name} must be .* >= .*, got -7$"):
                    build_method({"name": name, f.name: -7})
            checked += 1
    assert checked >= 20
    with pytest.raises(ConfigError, match=r"^method decoprune: gamma must be a number >= 0, got -1$"):
        build_method({"name": "decoprune", "gamma": -1})
    with pytest.raises(ConfigError, match=r"^method random: max_history_tokens must be a whole number >= 0 \(or null\)"):
        build_method({"name": "random", "max_history_tokens": 2.5})


def test_booleans_are_not_numbers_for_any_knob():
    """YAML's ``true`` is a Python ``bool``, itself an ``int``: every int or float knob of every method refuses
    it by name, and a bool knob takes it."""
    checked = 0
    for name in method_names():
        cls = method_class(name)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] in (int, float, int | None, float | None):
                with pytest.raises(ConfigError, match=f"^method {name}: {f.name} must be .*, got True$"):
                    build_method({"name": name, f.name: True})
                checked += 1
    assert checked >= 20
    assert build_method({"name": "decoprune", "post_prune": True}).post_prune is True
    assert build_method({"name": "decoprune", "gamma": 1}).gamma == 1  # an integer is a number


@dataclass
class ShapedPlugin(Method):
    """An external method with knobs check_knobs leaves to it (a two-type union, an optional list) and a field it
    derives from its knobs after they are checked."""

    name = "shaped_plugin"
    shape: int | str = "auto"
    layers: list[int] | None = None
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.tokens = 16 * (self.recent_chunks + self.sink_chunks)


def test_knobs_of_other_types_and_derived_fields_are_left_to_the_method():
    """Only scalar knobs (``int``, ``float``, ``bool``, ``str``, each optionally ``| None``) are type-checked; a
    union of two types, a list, and a field the method derives (``init=False``, set after the check) are not."""
    built = ShapedPlugin(shape="auto", layers=[0, 2])
    assert (built.shape, built.layers, built.tokens) == ("auto", [0, 2], 32)
    assert ShapedPlugin(shape=3).shape == 3
    with pytest.raises(ConfigError, match=r"^method shaped_plugin: recent_chunks must be a whole number >= 0, got -1$"):
        ShapedPlugin(recent_chunks=-1)


def test_knob_errors_name_the_class_when_it_has_no_name():
    """check_knobs takes any dataclass: one without a ``name`` (or with an empty one, like an unregistered Method
    subclass) is named by its class."""

    @dataclass
    class Settings:
        steps: int = 1

    with pytest.raises(ConfigError, match=r"^method test_knob_errors_name_the_class_when_it_has_no_name\.<locals>"
                                          r"\.Settings: steps must be a whole number, got 2\.5$"):
        check_knobs(Settings(steps=2.5))

    @dataclass
    class Unnamed(Method):
        stride: int = 2

    with pytest.raises(ConfigError, match=r"\.Unnamed: stride must be a whole number, got 'x'$"):
        Unnamed(stride="x")
