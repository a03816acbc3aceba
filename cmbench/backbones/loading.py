"""Build a backbone from its config group entry (``configs/backbone/<name>.yaml``).

A backbone config names a callable with ``_target_`` (a class, or a loader such as
``cmbench.backbones.tiny.TinyWorldModel.from_pretrained`` annotated to return a backbone class: what a
target makes is checked before it is called, so a config naming ``os.system`` runs nothing); every other key except the documentation
keys (``name``, ``description``, ``paper``, ``context``, ``head_map``) is passed to it as a keyword
argument. ``context`` describes how the backbone wants context videos prepared (frame rate, size,
temporal stride) and is read by the evaluator; ``sampler`` ({timesteps, stochastic}) is the
backbone's own schedule, the default of ``generation.timesteps`` / ``generation.stochastic``; ``head_map`` is the backbone's calibrated static /
dynamic head map (``scripts/build_head_map.py``), the default of head-specialised methods; ``memory``
configures the memory plan (:mod:`cmbench.backbones.memory`).
"""

from __future__ import annotations

from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from cmbench.backbones.base import Backbone
from cmbench.config_schema import BACKBONE_KEYS, keys_with_role
from cmbench.errors import ConfigError
from cmbench.registry import import_factory

NON_ARGUMENT_KEYS = keys_with_role(BACKBONE_KEYS, "doc", "cmbench", "runtime")
BACKBONE_METHODS = ("encode", "decode", "condition", "denoise")  # the Backbone protocol's calls


def implements_backbone(cls: type) -> bool:
    """Whether instances of ``cls`` implement :class:`~cmbench.backbones.base.Backbone`'s calls."""
    return all(callable(getattr(cls, name, None)) for name in BACKBONE_METHODS)


def backbone_loader(cfg: Mapping[str, Any]) -> Any:
    """The config's ``_target_``, imported and checked (a Backbone class, or a loader annotated to return
    one) without calling it.

    Raises
    ------
    ConfigError
        No ``_target_``, or one that does not make a Backbone (``os.system``).
    """
    target = cfg.get("_target_")
    if not target:
        raise ConfigError(f"backbone {cfg.get('name', '?')!r}: config needs a _target_ (the loader to call)")
    return import_factory(str(target), implements_backbone, "Backbone", f"backbone {cfg.get('name', '?')!r}: _target_")


def build_backbone(cfg: Mapping[str, Any] | DictConfig) -> Backbone:
    """Call the config's ``_target_`` with its remaining keys; check the result is a Backbone."""
    resolved = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    assert isinstance(resolved, dict)
    plain = {str(k): v for k, v in resolved.items()}
    target = plain.get("_target_")
    loader = backbone_loader(plain)
    kwargs = {k: v for k, v in plain.items() if k not in NON_ARGUMENT_KEYS}
    try:
        backbone = loader(**kwargs)
    except TypeError as err:
        raise ConfigError(f"backbone {plain.get('name', '?')!r}: {target}({', '.join(kwargs)}): {err}") from err
    if not isinstance(backbone, Backbone):
        raise ConfigError(f"backbone {plain.get('name', '?')!r}: {target} returned {type(backbone).__name__}, "
                          f"which does not implement cmbench.backbones.base.Backbone")
    return backbone
