"""Method registry: built-in names, ``_target_`` plug-ins and the ``cmbench.methods`` entry points.

A method defined outside CMBench plugs in without editing it, either

- by a config whose ``_target_`` names its class (``mypkg.mymod.MyMethod``; put the yaml in a folder
  listed in ``CMBENCH_CONFIG_PATH`` and it shows up in ``python -m cmbench ls method``), or
- by an entry point in the ``cmbench.methods`` group (``name = "mypkg.mymod:MyMethod"``), after which
  ``name=<entry point name>`` works like a built-in.

Either way the class must subclass :class:`cmbench.methods.base.Method`.

The class is the only source of a method's defaults and of its documentation (``description``,
``paper``, ``paper_title``): a method yaml holds its ``name`` (or ``_target_``) and only the knobs
whose value differs from the class, so ``build_method({"name": n})`` equals ``method=n`` on the
command line.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from cmbench.errors import ConfigError
from cmbench.methods.base import Method
from cmbench.registry import Registry

ENTRY_POINT_GROUP = "cmbench.methods"
DOC_KEYS = ("description", "paper")

METHODS: Registry[type[Method]] = Registry("method", base=Method, entry_point_group=ENTRY_POINT_GROUP)


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make ``cls`` available as ``name=cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no registry name")
    return METHODS.register()(cls)


def method_names() -> list[str]:
    """Registered names (built-ins and entry points), sorted."""
    return METHODS.names()


def method_class(name: str) -> type[Method]:
    """The class registered as ``name``; a :class:`ConfigError` with a suggestion otherwise."""
    return METHODS.get(name)


def config_class(cfg: Mapping[str, Any]) -> type[Method]:
    """The class a method config names: its ``_target_`` (import path) or its registered ``name``.

    Raises
    ------
    ConfigError
        Neither key, an unknown name or an import path that is not a :class:`Method` subclass.
    """
    target, name = cfg.get("_target_"), cfg.get("name")
    if target:
        return METHODS.import_target(str(target))
    if name:
        return method_class(str(name))
    raise ConfigError("a method config needs 'name' (a registered method) or '_target_' (a class path)")


def build_method(cfg: Mapping[str, Any]) -> Method:
    """Build a method from its config (a ``method/<name>.yaml`` plus overrides).

    Parameters
    ----------
    cfg : mapping
        ``name`` (registry) or ``_target_`` (import path) and the knobs that differ from the class's
        defaults (``description`` / ``paper`` keys are ignored: the class documents itself).

    Raises
    ------
    ConfigError
        Unknown name, unknown knob, a knob value the method rejects, or an unresolved ``target_pr``
        (:func:`cmbench.calibration.target_pr.resolve_target_pr` turns it into the calibrated knob).
    """
    cls = config_class(cfg)
    cfg = {k: v for k, v in cfg.items() if k not in ("_target_", "name", *DOC_KEYS)}
    if "target_pr" in cfg:
        raise ConfigError(f"method {cls.name or cls.__qualname__!r}: method.target_pr={cfg['target_pr']} runs the method's "
                          f"own rule at the knob calibrated to that PR, which `run` and cmbench.evaluate resolve before "
                          f"building it; a per-chunk quota replacing the rule is method.quota_pr")
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ConfigError(
            f"method {cls.name or cls.__qualname__!r} has no knob(s) {', '.join(unknown)}; its knobs are: "
            f"{', '.join(sorted(known))}"
        )
    try:
        return cls(**{k: _plain(v) for k, v in cfg.items()})
    except (TypeError, ValueError) as err:  # a knob of the wrong shape (``keep_counts=abc``)
        raise ConfigError(f"method {cls.name!r}: {err}") from err


def full_method_config(cfg: Mapping[str, Any], method: Method | None = None) -> dict[str, Any]:
    """The complete config of the method ``cfg`` builds (``method``, when already built from it): its
    name (or ``_target_``) and every knob.

    A yaml lists only what differs from the class; this is what a run's identity and records need.
    """
    method = method if method is not None else build_method(cfg)
    head = {"_target_": str(cfg["_target_"])} if cfg.get("_target_") else {}
    return {**head, "name": method.name or str(cfg.get("name", "")), **method.knobs()}


def canonical_method_config(cfg: Mapping[str, Any], method: Method | None = None) -> dict[str, Any]:
    """One config per method setting, however it was spelled (a yaml, overrides, a built instance):
    the ``name`` (and ``_target_``) plus only the knobs whose value differs from the class default.

    What a run's identity hashes: spelling a default out does not make another run, and a changed
    class default is caught by the code identity instead (the method's source). ``method``: the
    method already built from ``cfg``.
    """
    method = method if method is not None else build_method(cfg)
    defaults = {}
    for f in dataclasses.fields(method):
        if f.init and f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.init and f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    head = {k: cfg[k] for k in ("_target_", "name") if cfg.get(k)}
    return {**head, **{k: v for k, v in method.knobs().items() if k not in defaults or v != defaults[k]}}


def config_doc(cfg: Mapping[str, Any]) -> dict[str, str]:
    """``{"description", "paper"}`` of the class a method yaml names; the yaml's own text when it names
    none (no ``name`` / ``_target_``); the reason when its class cannot be found."""
    if not (cfg.get("name") or cfg.get("_target_")):
        return {"description": str(cfg.get("description", "") or ""), "paper": str(cfg.get("paper", "") or "")}
    try:
        cls = config_class(cfg)
    except ConfigError as err:
        return {"description": f"(unavailable: {err})", "paper": ""}
    return {"description": cls.description, "paper": cls.paper}


def _plain(value: Any) -> Any:
    """OmegaConf containers -> Python lists/dicts; other values unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def describe_methods() -> dict[str, dict[str, str]]:
    """``name -> {"description", "paper", "paper_title", "class"}`` for every registered method."""
    out = {}
    for name in method_names():
        cls = method_class(name)
        out[name] = {"description": cls.description, "paper": cls.paper, "paper_title": cls.paper_title,
                     "class": f"{cls.__module__}.{cls.__qualname__}"}
    return out
