"""Packaging glue pyproject.toml cannot express: the top-level ``configs/`` and ``data_manifests/`` folders
install inside the package (``cmbench.configs``, ``cmbench.data_manifests``), so a wheel carries them
while the checkout keeps one copy of each at the top (cmbench/shipped.py finds either)."""

from setuptools import find_packages, setup

SHIPPED = {"cmbench.configs": "configs", "cmbench.data_manifests": "data_manifests"}

setup(packages=[*find_packages(include=["cmbench", "cmbench.*"]), *SHIPPED], package_dir=SHIPPED)
