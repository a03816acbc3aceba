"""Method registry: built-in names, ``_target_`` plug-ins and the ``cmbench.methods`` entry points.

A method defined outside CMBench plugs in without editing it, either

- by a config whose ``_target_`` names its class (``mypkg.mymod.MyMethod``; put the yaml in a folder
  listed in ``CMBENCH_CONFIG_PATH`` and it shows up in ``python -m cmbench ls method``), or
- by an entry point in the ``cmbench.methods`` group (``name = "mypkg.mymod:MyMethod"``), after which
  ``name=<entry point name>`` works like a built-in.

Either way the class must subclass :class:`cmbench.methods.base.Method`.
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


def build_method(cfg: Mapping[str, Any]) -> Method:
    """Build a method from its config (a ``method/<name>.yaml`` plus overrides).

    Parameters
    ----------
    cfg : mapping
        ``name`` (registry) or ``_target_`` (import path), ``description`` / ``paper`` (ignored here),
        and the method's knobs.

    Raises
    ------
    ConfigError
        Unknown name, unknown knob, or a knob value the method rejects.
    """
    cfg = dict(cfg)
    for key in DOC_KEYS:
        cfg.pop(key, None)
    target, name = cfg.pop("_target_", None), cfg.pop("name", None)
    if target:
        cls = _import_target(str(target))
    elif name:
        cls = method_class(str(name))
    else:
        raise ConfigError("a method config needs 'name' (a registered method) or '_target_' (a class path)")
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
    """``name -> {"description", "paper", "class"}`` for every registered method."""
    out = {}
    for name in method_names():
        cls = method_class(name)
        out[name] = {"description": cls.description, "paper": cls.paper, "class": f"{cls.__module__}.{cls.__qualname__}"}
    return out
