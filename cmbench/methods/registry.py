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
import difflib
import importlib
from importlib.metadata import entry_points
from typing import Any, Mapping

from cmbench.errors import ConfigError
from cmbench.methods.base import Method

ENTRY_POINT_GROUP = "cmbench.methods"
DOC_KEYS = ("description", "paper")

_REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make ``cls`` available as ``name=cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no registry name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"method name {cls.name!r} is taken by {_REGISTRY[cls.name].__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def _entry_point_classes() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def method_names() -> list[str]:
    """Registered names (built-ins and entry points), sorted."""
    return sorted(set(_REGISTRY) | set(_entry_point_classes()))


def method_class(name: str) -> type[Method]:
    """The class registered as ``name``; a :class:`ConfigError` with a suggestion otherwise."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    eps = _entry_point_classes()
    if name in eps:
        return _check_class(eps[name].load(), f"entry point {name!r}")
    close = difflib.get_close_matches(name, method_names(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown method {name!r}.{hint} Known methods: {', '.join(method_names())}")


def _import_target(target: str) -> type[Method]:
    module, _, attr = target.replace(":", ".").rpartition(".")
    if not module:
        raise ConfigError(f"method _target_ {target!r} must be 'package.module.Class'")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"cannot import method _target_ {target!r}: {err}") from err
    return _check_class(cls, f"_target_ {target!r}")


def _check_class(cls: Any, where: str) -> type[Method]:
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ConfigError(f"{where} is not a subclass of cmbench.methods.base.Method")
    return cls


def config_class(cfg: Mapping[str, Any]) -> type[Method]:
    """The class a method config names: its ``_target_`` (import path) or its registered ``name``.

    Raises
    ------
    ConfigError
        Neither key, an unknown name or an import path that is not a :class:`Method` subclass.
    """
    target, name = cfg.get("_target_"), cfg.get("name")
    if target:
        return _import_target(str(target))
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
        Unknown name, unknown knob, or a knob value the method rejects.
    """
    cls = config_class(cfg)
    cfg = {k: v for k, v in cfg.items() if k not in ("_target_", "name", *DOC_KEYS)}
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ConfigError(
            f"method {cls.name or cls.__qualname__!r} has no knob(s) {', '.join(unknown)}; its knobs are: "
            f"{', '.join(sorted(known))}"
        )
    try:
        return cls(**{k: _plain(v) for k, v in cfg.items()})
    except TypeError as err:
        raise ConfigError(f"method {cls.name!r}: {err}") from err


def method_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The complete config of the method ``cfg`` builds: its name (or ``_target_``) and every knob.

    A yaml lists only what differs from the class; this is what a run's identity and records need.
    """
    method = build_method(cfg)
    head = {"_target_": str(cfg["_target_"])} if cfg.get("_target_") else {}
    return {**head, "name": method.name or str(cfg.get("name", "")), **method.knobs()}


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
