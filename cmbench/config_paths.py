"""Where configs live: CMBench's ``configs/`` (:mod:`cmbench.shipped`) plus user folders named in ``CMBENCH_CONFIG_PATH``.

A user folder has the same group layout (``method/``, ``backbone/``, ...). Configs placed there are
found by every command and listed by ``ls``, so a method defined outside CMBench plugs in without
editing it (its yaml names the user's class with ``_target_``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from cmbench.shipped import PACKAGE_ROOT, shipped_dir

CONFIG_DIR = shipped_dir("configs")
GROUPS = ("data", "method", "backbone", "scorer", "experiment")

# `${package_root:}` in a config is the installed cmbench package, so shipped files (weights, head
# maps, dataset specs) resolve from any working directory, in a checkout and in a wheel alike
OmegaConf.register_new_resolver("package_root", lambda: str(PACKAGE_ROOT), replace=True)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A resolved config mapping (DictConfig or dict) as a plain ``dict`` (lists and nested mappings too)."""
    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    if not isinstance(plain, dict):
        raise TypeError(f"expected a config mapping, got {type(plain).__name__}")
    return {str(k): v for k, v in plain.items()}


def editable_copy(cfg: DictConfig) -> DictConfig:
    """A copy of a root config that can be edited (no struct flag) and keeps its interpolations, so a
    changed group (``method``, ``data``) resolves against the copy."""
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    assert isinstance(out, DictConfig)
    return out


def user_config_dirs() -> list[Path]:
    """Folders from ``CMBENCH_CONFIG_PATH`` (``os.pathsep``-separated), in order."""
    raw = os.environ.get("CMBENCH_CONFIG_PATH", "")
    return [Path(p).expanduser().resolve() for p in raw.split(os.pathsep) if p.strip()]


def config_dirs() -> list[Path]:
    """The package's config folder, then the user folders."""
    return [CONFIG_DIR, *user_config_dirs()]


def group_entries(group: str) -> dict[str, dict[str, str]]:
    """Configs of one group across all config folders (later folders override earlier ones).

    Returns
    -------
    dict name -> {"description": ..., "paper": ..., "origin": folder}
    """
    found: dict[str, dict[str, str]] = {}
    for folder in config_dirs():
        for path in sorted((folder / group).glob("*.yaml")):
            cfg = OmegaConf.load(path)
            if not isinstance(cfg, DictConfig):
                continue
            # experiment configs are global packages: their documentation sits under `experiment:`
            inner = cfg.get(group)
            doc: Any = inner if group == "experiment" and isinstance(inner, DictConfig) else cfg
            if group == "method":  # a method documents itself in its class
                from cmbench.methods.registry import config_doc

                doc = config_doc(cfg)
            found[path.stem] = {
                "description": str(doc.get("description", "") or ""),
                "paper": str(doc.get("paper", "") or ""),
                "origin": str(folder),
            }
    return found


def complete_method_name(cfg: DictConfig, choice: str | None) -> None:
    """Give ``cfg.method`` a ``name`` when its yaml has none (a plug-in yaml with only ``_target_``).

    The name is the config's file name (``choice``, Hydra's selected option), as ``ls`` shows it.
    """
    method = cfg.get("method")
    if isinstance(method, DictConfig) and not method.get("name") and choice:
        with open_dict(method):
            method.name = str(choice)


def knob_overrides(overrides: list[str]) -> list[str]:
    """Hydra overrides with ``method.<knob>=v`` turned into ``++method.<knob>=v``.

    A method yaml lists only what differs from its class (the class holds the defaults), so a knob
    the yaml leaves out must still be settable on the command line; a misspelt knob then reaches
    ``build_method``, which names the method's real knobs.
    """
    return [f"++{o}" if o.startswith("method.") else o for o in overrides]
