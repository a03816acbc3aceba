"""Where configs live: the package's ``configs/`` plus user folders named in ``CMBENCH_CONFIG_PATH``.

A user folder has the same group layout (``method/``, ``backbone/``, ...). Configs placed there are
found by every command and listed by ``ls``, so a method defined outside CMBench plugs in without
editing it (its yaml names the user's class with ``_target_``).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

PACKAGE_ROOT = Path(__file__).resolve().parent
CONFIG_DIR = PACKAGE_ROOT / "configs"
GROUPS = ("data", "method", "backbone", "scorer", "experiment")

# `${package_root:}` in a config is the installed cmbench package, so shipped files (weights, head
# maps, dataset specs) resolve from any working directory, in a checkout and in a wheel alike
OmegaConf.register_new_resolver("package_root", lambda: str(PACKAGE_ROOT), replace=True)


def user_config_dirs() -> list[Path]:
    """Folders from ``CMBENCH_CONFIG_PATH`` (``os.pathsep``-separated), in order."""
    raw = os.environ.get("CMBENCH_CONFIG_PATH", "")
    return [Path(p).expanduser().resolve() for p in raw.split(os.pathsep) if p.strip()]


def config_dirs() -> list[Path]:
    """The package's config folder, then the user folders."""
    return [CONFIG_DIR, *user_config_dirs()]


def knob_overrides(overrides: list[str]) -> list[str]:
    """Hydra overrides with ``method.<knob>=v`` turned into ``++method.<knob>=v``.

    A method yaml lists only what differs from its class (the class holds the defaults), so a knob
    the yaml leaves out must still be settable on the command line; a misspelt knob then reaches
    ``build_method``, which names the method's real knobs.
    """
    return [f"++{o}" if o.startswith("method.") else o for o in overrides]
