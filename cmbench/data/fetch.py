"""Fetch a dataset its spec names on a hub (``hub.repo_id``), failing fast and helpfully offline."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cmbench.data.spec import load_spec
from cmbench.errors import CMBenchError, ConfigError


def hub_unreachable(endpoint: str, timeout: float = 3.0) -> str | None:
    """None when the hub endpoint accepts a TCP connection, else the reason it does not."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        return "HF_HUB_OFFLINE is set"
    url = urlparse(endpoint)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return None
    except OSError as err:
        return f"{url.hostname} is unreachable ({err})"


def fetch_dataset(data: Any) -> Path:
    """Download the dataset named by ``data.spec``'s ``hub`` block into ``data.root``.

    Nothing happens when the manifest is already there. Offline it fails at once (a 3-second
    connection check), saying how to download it elsewhere and where to put it.

    Raises
    ------
    ConfigError
        The spec names no hub dataset.
    CMBenchError
        The hub cannot be reached.
    """
    from huggingface_hub import constants, snapshot_download

    name = str(data.get("name", "dataset"))
    spec = load_spec(str(data["spec"])) if data.get("spec") else {}
    hub = spec.get("hub") or {}
    if "repo_id" not in hub:
        raise ConfigError(f"data={name}: nothing to prepare (its spec names no dataset to download)")
    repo_id = hub["repo_id"]
    root = Path(str(data["root"]))
    manifest = root / str(data.get("manifest", "metadata.jsonl"))
    if manifest.is_file():
        print(f"{name}: {manifest} already present; not downloading again")
        return root
    why = hub_unreachable(constants.ENDPOINT)
    if why:
        raise CMBenchError(
            f"cannot download dataset {repo_id}: {why}.\n"
            f"On a machine with network access run:\n"
            f"  huggingface-cli download {repo_id} --repo-type dataset --local-dir CMBench\n"
            f"then copy the folder here so that {manifest} exists "
            f"(or point data.root at it) and check it with:\n"
            f"  python -m cmbench validate data={name} data.root={root}"
        )
    snapshot_download(repo_id=repo_id, repo_type=str(hub.get("repo_type", "dataset")), local_dir=str(root))
    return root
