"""Where configs live: CMBench's ``configs/`` (:mod:`cmbench.shipped`) plus user folders named in ``CMBENCH_CONFIG_PATH``.

A user folder has the same group layout (``method/``, ``backbone/``, ...). Configs placed there are
found by every command and listed by ``ls``, so a method defined outside CMBench plugs in without
editing it (its yaml names the user's class with ``_target_``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from cmbench.errors import ConfigError
from cmbench.shipped import PACKAGE_ROOT, shipped_dir

CONFIG_DIR = shipped_dir("configs")
GROUPS = ("data", "method", "backbone", "scorer", "storage", "experiment")
SEARCH_PATH_UNSAFE = ",[]{}'\""  # Hydra's override grammar: a search path holding one is split or misread

# `${package_root:}` in a config is the installed cmbench package, so shipped files (weights, head
# maps, dataset specs) resolve from any working directory, in a checkout and in a wheel alike
OmegaConf.register_new_resolver("package_root", lambda: str(PACKAGE_ROOT), replace=True)


def home_path(path: str) -> str:
    """``path`` under ``CMBENCH_HOME`` when that is set (``${cmbench_home:runs}`` in a config: the default
    ``runs/`` and ``data/`` folders in one place, whatever the working directory), else ``path`` as given,
    relative to the working directory (and a run's config hash as it was)."""
    home = os.environ.get("CMBENCH_HOME", "").strip()
    return str(Path(home).expanduser().resolve() / path) if home else path


OmegaConf.register_new_resolver("cmbench_home", home_path, replace=True)


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
    """Folders from ``CMBENCH_CONFIG_PATH`` (``os.pathsep``-separated), in order.

    Raises
    ------
    ConfigError
        A folder whose path holds a character of Hydra's override grammar (``,`` splits its search path):
        Hydra would look for another folder than the one ``ls`` lists.
    """
    raw = os.environ.get("CMBENCH_CONFIG_PATH", "")
    folders = [Path(p).expanduser().resolve() for p in raw.split(os.pathsep) if p.strip()]
    for folder in folders:
        bad = sorted(set(str(folder)) & set(SEARCH_PATH_UNSAFE))
        if bad:
            raise ConfigError(f"CMBENCH_CONFIG_PATH: the folder {str(folder)!r} contains {' '.join(map(repr, bad))}, "
                              f"which Hydra's search path cannot hold (it splits the path at ','): move or rename it")
    return folders


def search_path_overrides() -> list[str]:
    """The Hydra override that adds the ``CMBENCH_CONFIG_PATH`` folders to the search path (none without any)."""
    extra = user_config_dirs()
    return [f"hydra.searchpath=[{','.join(f'file://{p}' for p in extra)}]"] if extra else []


def config_dirs() -> list[Path]:
    """The package's config folder, then the user folders."""
    return [CONFIG_DIR, *user_config_dirs()]


def group_entries(group: str, describe: Callable[[DictConfig], Mapping[str, Any]] | None = None
                  ) -> dict[str, dict[str, str]]:
    """Configs of one group across all config folders (later folders override earlier ones).

    Parameters
    ----------
    group : str
    describe : callable, optional
        ``config -> {"description", "paper"}`` (methods document themselves in their class); default:
        the yaml's own ``description`` and ``paper``.

    Returns
    -------
    dict name -> {"description": ..., "paper": ..., "origin": folder}; a yaml that does not parse is
    listed with ``"error"``: its path and the parser's reason.
    """
    found: dict[str, dict[str, str]] = {}
    for folder in config_dirs():
        for path in sorted((folder / group).glob("*.yaml")):
            try:
                cfg = OmegaConf.load(path)
            except Exception as err:  # yaml and OmegaConf raise several types; a listing must go on
                reason = " ".join(str(err).split())[:200]
                found[path.stem] = {"description": "(unreadable yaml)", "paper": "", "origin": str(folder),
                                    "error": f"{path}: not a readable config ({type(err).__name__}: {reason})"}
                continue
            if not isinstance(cfg, DictConfig):
                continue
            # experiment configs are global packages: their documentation sits under `experiment:`
            inner = cfg.get(group)
            doc: Any = inner if group == "experiment" and isinstance(inner, DictConfig) else cfg
            if describe is not None:
                doc = describe(cfg)
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
    """Hydra overrides with ``method.<knob>=v`` and ``storage.<knob>=v`` turned into ``++...``.

    A method yaml lists only what differs from its class (the class holds the defaults), so a knob
    the yaml leaves out must still be settable on the command line; a misspelt knob then reaches
    ``build_method``, which names the method's real knobs. A storage format's knob its yaml lacks
    (``storage=kivi storage.stages=2``, ``storage=fp storage.bits=2``) reaches the format's check, which
    refuses it in one line (:func:`cmbench.spec.storage_spec`) instead of Hydra's several.
    """
    return [f"++{o}" if o.startswith(("method.", "storage.")) else o for o in overrides]


_NOT_A_NAME = set("()[]{}$*?:'\"")  # sweep functions, interpolations, globs: left to Hydra


def unknown_choice(overrides: list[str]) -> str | None:
    """One line for the first override choosing a config that no config folder has (``storage=nope``:
    Hydra would answer in 6-13 lines), naming the group's configs; None when every choice exists.

    Only plain choices of a group folder (``group=name`` or a sweep's ``group=a,b``) are checked; adding
    (``+group=``), deleting, Hydra's own groups and sweep functions are left to Hydra.
    """
    for override in overrides:
        group, equals, value = override.partition("=")
        if not equals or not group.isidentifier() or _NOT_A_NAME & set(value) or value in ("", "null"):
            continue
        folders = [folder / group for folder in config_dirs() if (folder / group).is_dir()]
        if not folders:
            continue
        for name in value.split(","):
            if not any((folder / f"{name.strip()}.yaml").is_file() for folder in folders):
                options = sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})
                return (f"{group}={name.strip()}: no {group} config of that name; choose one of {', '.join(options)} "
                        f"(or a config of yours in a CMBENCH_CONFIG_PATH folder)")
    return None
