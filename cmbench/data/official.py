"""The official CMBench dataset: download it where a hub is reachable, or say how to get it."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from typing import Any

from cmbench.data.spec import load_spec
from cmbench.errors import CMBenchError, ConfigError


def _hub_reachable(endpoint: str, timeout: float = 3.0) -> str | None:
    """None when the hub endpoint accepts a TCP connection, else the reason it does not."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        return "HF_HUB_OFFLINE is set"
    url = urlparse(endpoint)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return None
    except OSError as err:
        return f"{url.hostname} is unreachable ({err})"


def fetch_official(data: Any) -> Path:
    """Download the dataset its spec names on the hub (``hub.repo_id``; the official CMBench set)
    into ``data.root`` with huggingface_hub.

    Nothing happens when the manifest is already there. Offline it fails at once (a 3-second
    connection check), saying how to download it elsewhere and where to put it.

    Raises
    ------
    ConfigError
        The dataset's spec names nothing to download.
    CMBenchError
        The hub cannot be reached.
    """
    from huggingface_hub import constants, snapshot_download

    name = str(data.get("name", "dataset"))
    hub = (load_spec(str(data.spec)) if data.get("spec") else {}).get("hub") or {}
    if "repo_id" not in hub:
        raise ConfigError(f"data={name}: nothing to prepare (its dataset spec names nothing to download)")
    repo_id = hub["repo_id"]
    root = Path(str(data.root))
    if (root / str(data.manifest)).is_file():
        print(f"{name}: {root / str(data.manifest)} already present; not downloading again")
        return root
    why = _hub_reachable(constants.ENDPOINT)
    if why:
        raise CMBenchError(
            f"cannot download dataset {repo_id}: {why}.\n"
            f"On a machine with network access run:\n"
            f"  huggingface-cli download {repo_id} --repo-type dataset --local-dir CMBench\n"
            f"then copy the folder here so that {root / str(data.manifest)} exists "
            f"(or point data.root at it) and check it with:\n"
            f"  python -m cmbench validate data={name} data.root={root}"
        )
    snapshot_download(repo_id=repo_id, repo_type="dataset", local_dir=str(root))
    return root
