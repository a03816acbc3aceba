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
        cls = METHODS.import_target(str(target))
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
