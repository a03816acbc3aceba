"""The folders CMBench ships beside its code: ``configs/`` (Hydra groups) and ``data_manifests/`` (dataset
specs and named task subsets).

In a checkout they are top-level folders of the repository, and that is their only copy. A wheel
installs the same folders inside the package (``cmbench/configs``, ``cmbench/data_manifests``: the
``package_dir`` mapping in ``setup.py``), so an installed CMBench finds them without the checkout.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """The shipped folder ``name``: inside the installed package, else at the top of the checkout.

    Raises
    ------
    FileNotFoundError
        when neither place holds it (a broken install).
    """
    installed = PACKAGE_ROOT / name
    if installed.is_dir():
        return installed
    checkout = PACKAGE_ROOT.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / name).is_dir():
        return checkout / name
    raise FileNotFoundError(
        f"CMBench's {name}/ folder is missing: looked in {installed} (an installed wheel) and {checkout / name} "
        "(a checkout); reinstall CMBench"
    )
