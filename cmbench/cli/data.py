"""``validate`` and ``prepare``: check a dataset, build MiniWorld, fetch the official set."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig

from cmbench.data.manifest import validate_manifest
from cmbench.data.spec import check_counts, counts, load_spec
from cmbench.errors import CMBenchError


def validate(cfg: DictConfig) -> int:
    """Validate ``cfg.data``'s manifest and videos; print every problem. Exit 0 when clean."""
    data = cfg.data
    root = Path(str(data.root))
    tasks, problems = validate_manifest(root, str(data.manifest), check_videos=bool(data.get("check_videos", True)))
    readable = not any(p.field == "<file>" for p in problems)
    if readable and data.get("spec") and data.get("check_counts", True):
        expected = load_spec(str(data.spec)).get("expected")
        if expected:
            problems += check_counts(str(root / str(data.manifest)), tasks, expected)
    got = counts(tasks)
    summary = f"{got['tasks']} valid task(s) over {got['videos']} video(s) ({got['reappear']} reappear, {got['revisit']} revisit)"
    if problems:
        print(f"{data.name}: {len(problems)} problem(s) in {root / str(data.manifest)}", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        print(f"{data.name}: {summary}", file=sys.stderr)
        return 1
    by_source = ", ".join(f"{s}: {c['tasks']} tasks / {c['videos']} videos" for s, c in got["by_source"].items())
    print(f"{data.name}: OK, {summary}; {by_source}")
    return 0


def prepare(cfg: DictConfig) -> int:
    """Make ``cfg.data`` available at ``cfg.data.root``: build MiniWorld, or fetch the official set."""
    name = str(cfg.data.name)
    if name == "miniworld":
        from cmbench.miniworld import build_suite

        root = build_suite(cfg.data)
        print(f"miniworld: suite ready at {root}")
        return validate(cfg)
    if name == "cmbench":
        fetch_official(cfg.data)
        return validate(cfg)
    raise CMBenchError(f"data={name}: nothing to prepare (known: miniworld, cmbench)")


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


def fetch_official(data: DictConfig) -> Path:
    """Download the official CMBench dataset into ``data.root`` with huggingface_hub.

    Offline it fails at once (a 3-second connection check), saying how to download it elsewhere and
    where to put it.
    """
    from huggingface_hub import constants, snapshot_download

    spec = load_spec(str(data.spec))
    repo_id = spec["hub"]["repo_id"]
    root = Path(str(data.root))
    if (root / str(data.manifest)).is_file():
        print(f"cmbench: {root / str(data.manifest)} already present; not downloading again")
        return root
    why = _hub_reachable(constants.ENDPOINT)
    if why:
        raise CMBenchError(
            f"cannot download dataset {repo_id}: {why}.\n"
            f"On a machine with network access run:\n"
            f"  huggingface-cli download {repo_id} --repo-type dataset --local-dir CMBench\n"
            f"then copy the folder here so that {root / str(data.manifest)} exists "
            f"(or point data.root at it) and check it with:\n"
            f"  python -m cmbench validate data=cmbench data.root={root}"
        )
    snapshot_download(repo_id=repo_id, repo_type="dataset", local_dir=str(root))
    return root
