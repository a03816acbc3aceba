"""A run's leaderboard name: ``label=`` when given, else the method's name plus the knobs it changed.

The automatic label lists the method's knobs whose configured value differs from the method class's
dataclass default (the only source of defaults), in the class's field order:
``decoprune@gamma=0.02``, ``random@keep_ratio=0.1,seed_offset=3``. So a sweep
``-m method=decoprune method.gamma=0.02,0.05`` gives its runs distinct names, and a plain
``method=decoprune`` is just ``decoprune``; a quantized KV storage format adds itself
(``decoprune+kivi4-g32-r128``). A knob the method's yaml takes from another setting by
interpolation (``head_map: ${oc.select:backbone.head_map,null}``) is not listed unless overridden.

A label is a display name, never part of a run's identity: relabelling an existing run (``label=new``
on the same config) reruns nothing, and leaderboards show the run's current label. A ``label=`` is one
line of plain text that can name a file (:func:`check_label`): no control character (NUL, newline, CR,
an ANSI escape), no ``|`` (a markdown table's separator), no path separator, no ``..``. A label read
from a received folder is shown through :func:`safe_label` (control characters written as escapes).
Leaderboards treat labels that differ only in case (``Mine``, ``mine``) as one label and tell the
entries apart as they do entries of equal labels (:func:`cmbench.report.reading.distinct_labels`).
"""

from __future__ import annotations

import dataclasses
import json
import unicodedata
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from cmbench.config_paths import to_dict
from cmbench.errors import ConfigError
from cmbench.identity.paths import path_component

if TYPE_CHECKING:
    from cmbench.methods.base import Method


def resolve_method_class(method_cfg: Mapping[str, Any]) -> type[Method]:
    """The class a method config builds: its ``_target_``, else its registered ``name``."""
    from cmbench.methods.registry import METHODS, method_class  # torch: only when a label is made

    target = method_cfg.get("_target_")
    return METHODS.import_target(str(target)) if target else method_class(str(method_cfg.get("name")))


def class_defaults(cls: type) -> dict[str, Any]:
    """The dataclass defaults of a method class's knobs (fields without a default are left out)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _followed(method_cfg: Mapping[str, Any]) -> set[str]:
    """Knobs whose value is an interpolation in the config (they follow another setting, e.g. a head
    map from ``${oc.select:backbone.head_map,null}``): a setting of the setup, not of the method."""
    if not isinstance(method_cfg, DictConfig):
        return set()
    return {str(k) for k in method_cfg if OmegaConf.is_interpolation(method_cfg, str(k))}


def changed_knobs(method_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs of a method config whose value differs from the class default, in field order; knobs
    that follow another setting through an interpolation (a backbone's head map) are left out."""
    followed = _followed(method_cfg)
    cfg = to_dict(method_cfg) if isinstance(method_cfg, DictConfig) else dict(method_cfg)
    from cmbench.methods.registry import DOC_KEYS

    cls = resolve_method_class(cfg)
    defaults = class_defaults(cls)
    knobs = {k: v for k, v in cfg.items() if k not in (*DOC_KEYS, "name", "_target_", *followed)}
    order = [f.name for f in dataclasses.fields(cls)]
    return {k: knobs[k] for k in sorted(knobs, key=lambda k: order.index(k) if k in order else len(order))
            if k not in defaults or _plain(knobs[k]) != _plain(defaults[k])}


def knob_text(value: Any) -> str:
    """A knob value as it reads in a label (``0.8``, ``true``, ``null``, ``[1,2]``)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(_plain(value), separators=(",", ":"), sort_keys=True)
    return str(value)


def auto_label(method_cfg: Mapping[str, Any]) -> str:
    """``name`` or ``name@knob=value,...`` (see the module docstring)."""
    changed = changed_knobs(method_cfg)
    name = str(method_cfg.get("name"))
    return name if not changed else f"{name}@" + ",".join(f"{k}={knob_text(v)}" for k, v in changed.items())


def _control(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp")


def check_label(label: str) -> None:
    """Refuse a ``label=`` that is not one line of plain text naming a file.

    Raises
    ------
    ConfigError
        ``label=...: <what is wrong>``: a control character (NUL, newline, CR, an ANSI escape, ...), a
        ``|``, a path separator or ``..``.
    """
    shown = safe_label(label)
    bad = next((c for c in label if _control(c)), None)
    if bad is not None:
        raise ConfigError(f"label={shown}: holds the control character {bad!r}: a label is one line of plain text")
    for part, why in (("|", "separates a markdown table's cells"), ("/", "is a path separator"),
                      ("\\", "is a path separator"), ("..", "names a parent folder")):
        if part in label:
            raise ConfigError(f"label={shown}: holds {part!r}, which {why}; choose a plain name")


def safe_label(label: str) -> str:
    """A received label made safe to print and show: every control character (NUL, newline, CR, the ESC
    of an ANSI escape, ...) written as its escape (``\\x1b``); the rest as it is."""
    return "".join(c.encode("unicode_escape").decode("ascii") if _control(c) else c for c in str(label))


def run_label(cfg: DictConfig) -> str:
    """The label of a run: ``label`` if set (it must be usable as a file name: reports name files
    after labels), else :func:`auto_label` of ``cfg.method``.

    Raises
    ------
    ConfigError
        A ``label`` that cannot name a file (``label=/``).
    """
    label = cfg.get("label")
    if label:
        check_label(str(label))
        path_component(label, "label")
        return str(label)
    return auto_label(cfg.method) + storage_suffix(cfg.get("storage"))


def storage_suffix(storage: Mapping[str, Any] | None) -> str:
    """``+kivi4-g32-r128`` for a quantized storage format (bits, stages, group size, recent window),
    ``+lowrank8-r0`` for low-rank keys (rank, recent window), ``""`` for full precision: the same method in
    two formats reads as two entries."""
    from cmbench.cache.quantized import storage_format  # torch: only when a label is made

    fmt = storage_format(to_dict(storage) if isinstance(storage, DictConfig) else storage)
    if fmt.name == "lowrank":
        return f"+{fmt.label()}-r{fmt.residual}"
    return f"+{fmt.label()}-g{fmt.group_size}-r{fmt.residual}" if fmt.quantized else ""
