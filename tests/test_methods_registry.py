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
from cmbench.methods.registry import canonical_method_config, config_doc, full_method_config, register
from cmbench.registry import Registry
from fakes import AttentionBackbone, fake_geometry
from optional_methods import buildable, method_params

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
        if buildable(name):  # a method needing an optional package is built where it is installed
            assert build_method(cfg).name == name


@pytest.mark.parametrize("name", method_params())
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
    with pytest.raises(ConfigError, match=r"^a method config needs 'name' \(a registered method\) or '_target_' "
                                          r"\(a class path\)$"):
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


@dataclass(kw_only=True)
class NamelessPlugin(Method):
    """An external method without a registry ``name`` whose knob has no default: a config names it by ``_target_``
    and sets ``stride``."""

    stride: int


NAMELESS = "test_methods_registry.NamelessPlugin"
ORACLE = "cmbench.methods.oracle.OracleMask"


def test_describe_methods_gives_each_class_documentation_and_import_path():
    """What ``ls method`` and the README tables show of a registered method, all read from its class."""
    assert describe_methods()["streaming"] == {
        "description": 'sink chunks + recent window only; `recent_chunks=0` is the sink-only "no context" control',
        "paper": "https://arxiv.org/abs/2309.17453",
        "paper_title": "StreamingLLM, arXiv 2309.17453",
        "class": "cmbench.methods.streaming.Streaming",
    }


def test_an_unresolved_target_pr_is_refused_with_what_resolves_it():
    with pytest.raises(ConfigError) as err:
        build_method({"name": "streaming", "target_pr": 0.8})
    assert str(err.value) == ("method 'streaming': method.target_pr=0.8 runs the method's own rule at the knob "
                              "calibrated to that PR, which `run` and cmbench.evaluate resolve before building it; "
                              "a per-chunk quota replacing the rule is method.quota_pr")


def test_unknown_knobs_are_listed_sorted_with_every_knob_of_the_method():
    """A derived field (``init=False``) is no knob."""
    with pytest.raises(ConfigError) as err:
        build_method({"name": "streaming", "window": 2, "recent_chunk": 0})
    assert str(err.value) == ("method 'streaming' has no knob(s) recent_chunk, window; its knobs are: "
                              "max_history_tokens, recent_chunks, sink_chunks")
    with pytest.raises(ConfigError) as err:
        build_method({"_target_": "test_methods_registry.ShapedPlugin", "tokens": 8})
    assert str(err.value) == ("method 'shaped_plugin' has no knob(s) tokens; its knobs are: "
                              "layers, max_history_tokens, recent_chunks, shape, sink_chunks")


def test_errors_name_a_plugin_without_a_name_by_its_class():
    with pytest.raises(ConfigError) as err:
        build_method({"_target_": NAMELESS, "strides": 3})
    assert str(err.value) == ("method 'NamelessPlugin' has no knob(s) strides; its knobs are: "
                              "max_history_tokens, recent_chunks, sink_chunks, stride")
    with pytest.raises(ConfigError, match=r"^method 'NamelessPlugin': method\.target_pr=0\.8 runs "):
        build_method({"_target_": NAMELESS, "stride": 3, "target_pr": 0.8})


def test_a_knob_value_the_method_itself_rejects_is_a_config_error_naming_the_method():
    """``RandomTokens`` raises ``ValueError`` for ``keep_counts`` that are not chunk index -> tokens."""
    with pytest.raises(ConfigError) as err:
        build_method({"name": "random", "keep_counts": {"four": 10}})
    assert str(err.value) == ("method 'random': keep_counts={'four': 10}: expected a mapping of chunk index to tokens "
                              "kept, e.g. {4: 10}")


def test_interpolations_in_a_list_knob_are_resolved_into_a_plain_list():
    """A list knob of a composed config (a ``ListConfig``) reaches the method as a list, its ``${...}`` resolved."""
    cfg = OmegaConf.create({"backbone": {"middle_layer": 2},
                            "method": {"_target_": "test_methods_registry.ShapedPlugin",
                                       "layers": [0, "${backbone.middle_layer}"]}})
    layers = build_method(cfg.method).layers
    assert layers == [0, 2] and type(layers) is list


def test_full_config_of_a_target_method_has_its_class_path_name_and_every_knob():
    cfg = {"_target_": "test_methods_registry.KeepEveryOther", "stride": 3}
    assert full_method_config(cfg) == {"_target_": "test_methods_registry.KeepEveryOther", "name": "keep_every_other",
                                       "sink_chunks": 1, "recent_chunks": 1, "max_history_tokens": None, "stride": 3}


def test_full_config_of_a_plugin_without_a_name_takes_the_configs_name_or_none():
    assert full_method_config({"_target_": NAMELESS, "name": "every_third", "stride": 3}) == {
        "_target_": NAMELESS, "name": "every_third", "sink_chunks": 1, "recent_chunks": 1, "max_history_tokens": None,
        "stride": 3}
    assert full_method_config({"_target_": NAMELESS, "stride": 3})["name"] == ""


def test_canonical_config_compares_knobs_with_their_default_factory():
    """``OracleMask``'s mappings default to ``field(default_factory=dict)``: an empty one is the default; the
    ``_target_`` stays."""
    assert canonical_method_config({"_target_": ORACLE, "survivors": {}, "before": {}}) == {"_target_": ORACLE}
    assert canonical_method_config({"_target_": ORACLE, "before": {4: {}}}) == {"_target_": ORACLE, "before": {4: {}}}


def test_canonical_config_keeps_a_knob_without_a_default():
    assert canonical_method_config({"_target_": NAMELESS, "stride": 3}) == {"_target_": NAMELESS, "stride": 3}


def test_a_method_handed_in_is_described_not_built_again(monkeypatch):
    """A run builds its method once (its knob checks come first); the configs it records describe that instance."""
    cfg = {"name": "streaming", "recent_chunks": 0}
    method = build_method(cfg)
    monkeypatch.setattr("cmbench.methods.registry.build_method", lambda cfg: pytest.fail("the method was built again"))
    assert canonical_method_config(cfg, method) == {"name": "streaming", "recent_chunks": 0}
    assert full_method_config(cfg, method) == {"name": "streaming", "sink_chunks": 1, "recent_chunks": 0,
                                               "max_history_tokens": None}


def test_config_doc_reads_the_class_a_config_names_else_the_yamls_own_text():
    """``ls method``: a ``_target_`` alone names the class (the yaml's stale text is ignored); a yaml that names no
    class shows its own text ("" for none); one whose class cannot be found shows why."""
    assert config_doc({"_target_": "test_methods_registry.KeepEveryOther", "description": "stale"}) == {
        "description": "test plug-in", "paper": ""}
    assert config_doc({"description": "a sketch", "paper": "https://example.org/sketch"}) == {
        "description": "a sketch", "paper": "https://example.org/sketch"}
    assert config_doc({}) == config_doc({"description": None, "paper": None}) == {"description": "", "paper": ""}
    assert config_doc({"_target_": "collections.OrderedDict"}) == {
        "description": "(unavailable: _target_ 'collections.OrderedDict' is not a subclass of cmbench.methods.base.Method)",
        "paper": ""}


def test_register_adds_a_named_class_and_refuses_a_nameless_one(monkeypatch):
    monkeypatch.setattr("cmbench.methods.registry.METHODS", Registry("method", base=Method))
    assert register(KeepEveryOther) is KeepEveryOther
    assert method_names() == ["keep_every_other"] and method_class("keep_every_other") is KeepEveryOther
    with pytest.raises(ValueError, match=r"^NamelessPlugin has no registry name$"):
        register(NamelessPlugin)
