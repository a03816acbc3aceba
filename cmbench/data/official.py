"""The official CMBench dataset: download it, pinned to a hub commit, where a hub is reachable, or say how to get it.

``prepare data=cmbench`` resolves ``data.revision`` (a branch, tag or commit; ``null``: the hub's default
branch) to a commit, downloads exactly that commit into ``data.root`` and writes the pin beside it
(:data:`PIN_FILE`): the repository, the revision asked for, the commit it resolved to and the SHA-256 of
every context video. ``run`` records the commit in every record (``dataset_commit``) and checks each
context video against the pin before it is used (:mod:`cmbench.data.video_hashes`).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cmbench import bounded_read
from cmbench.data.spec import load_spec
from cmbench.data.video_hashes import replace_file
from cmbench.errors import CMBenchError, ConfigError

PIN_FILE = "cmbench-dataset.json"
"""The pin ``prepare`` writes into ``data.root`` after a download."""
VIDEO_SUFFIXES = (".mp4", ".mkv", ".avi", ".mov", ".webm")


@dataclass(frozen=True)
class DatasetPin:
    """What a downloaded dataset is: the hub commit and each context video's content.

    Attributes
    ----------
    repo_id : str
    revision : str
        The revision ``data.revision`` asked for (``main`` when it named none).
    commit : str
        The commit the revision resolved to (40 hex digits): what was downloaded.
    videos : dict
        ``{path relative to data.root: SHA-256}`` of every video downloaded.
    """

    repo_id: str
    revision: str
    commit: str
    videos: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit, "videos": self.videos}


def read_pin(root: str | Path) -> DatasetPin | None:
    """The pin in ``root`` (None when there is none: a dataset built here, or copied without one).

    Raises
    ------
    ConfigError
        The pin is not a regular file under its limit, not JSON, or a field is missing or of the wrong
        type (one line naming the file and the field).
    """
    path = Path(root) / PIN_FILE
    try:
        text = bounded_read.read_optional_text(path, "dataset pin")
    except (bounded_read.ReadLimitError, OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the dataset pin: {err}") from None
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise ConfigError(f"{path}: not a JSON object (the pin `prepare` writes); remove it and prepare again") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: not a JSON object (the pin `prepare` writes); remove it and prepare again")
    for key in ("repo_id", "revision", "commit"):
        if not isinstance(value.get(key), str) or not value[key]:
            raise ConfigError(f"{path}: {key}: is {value.get(key)!r}, expected a non-empty string")
    videos = value.get("videos")
    if not isinstance(videos, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in videos.items()):
        raise ConfigError(f"{path}: videos: expected a mapping of video path -> SHA-256")
    return DatasetPin(value["repo_id"], value["revision"], value["commit"], dict(videos))


def dataset_commit(root: str | Path, manifest: str = "metadata.jsonl") -> str | None:
    """The hub commit a dataset folder holds: its pin's (:func:`read_pin`), else the one ``hf download
    --local-dir`` noted beside the manifest it downloaded (``.cache/huggingface/download/<manifest>.metadata``,
    first line; read, never written), else None (a dataset built here, or copied without either).

    Raises
    ------
    ConfigError
        A malformed pin (:func:`read_pin`).
    """
    pin = read_pin(root)
    if pin is not None:
        return pin.commit
    noted = Path(root) / ".cache" / "huggingface" / "download" / f"{manifest}.metadata"
    try:
        text = bounded_read.read_optional_text(noted, "dataset pin")
    except (bounded_read.ReadLimitError, OSError, UnicodeDecodeError):
        return None
    commit = (text or "").split("\n", 1)[0].strip()
    return commit if _is_commit(commit) else None


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


def resolve_revision(repo_id: str, revision: str | None) -> str:
    """The commit a revision of a hub dataset names.

    Raises
    ------
    ConfigError
        The dataset or the revision does not exist (one line naming ``data.revision``).
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi().dataset_info(repo_id, revision=revision)
    except RevisionNotFoundError:
        raise ConfigError(f"data.revision={revision}: dataset {repo_id} has no such revision on the hub "
                          f"(a branch, a tag or a commit hash)") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"dataset {repo_id} is not on the hub (or is private: log in with `hf auth login`)") from None
    if not isinstance(info.sha, str) or not info.sha:
        raise CMBenchError(f"dataset {repo_id}: the hub named no commit for revision {revision or 'main'}")
    return info.sha


def video_files(root: Path) -> list[Path]:
    """The videos under ``root`` (hidden folders, e.g. the hub's ``.cache``, left out), sorted."""
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES and p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def write_pin(root: Path, repo_id: str, revision: str, commit: str) -> DatasetPin:
    """Hash every video of a downloaded dataset and write :data:`PIN_FILE` into ``root``."""
    from cmbench.hashing import file_hash

    pin = DatasetPin(repo_id, revision, commit, {p.relative_to(root).as_posix(): file_hash(p) for p in video_files(root)})
    replace_file(root / PIN_FILE, json.dumps(pin.to_json(), indent=1, sort_keys=True) + "\n")
    return pin


def offline_help(repo_id: str, revision: str | None, root: Path, manifest: Path, name: str) -> str:
    """How to download the dataset elsewhere and put it here (the ``hf`` command huggingface_hub installs)."""
    pinned = f" --revision {revision}" if revision else ""
    return (f"On a machine with network access run:\n"
            f"  hf download {repo_id} --repo-type dataset{pinned} --local-dir CMBench\n"
            f"then copy the folder here, its .cache/huggingface/ too (it names the commit each record carries), so\n"
            f"that {manifest} exists (or point data.root at it) and check it with:\n"
            f"  python -m cmbench validate data={name} data.root={root}")


def fetch_official(data: Any) -> Path:
    """Download the dataset its spec names on the hub (``hub.repo_id``; the official CMBench set) at
    ``data.revision`` into ``data.root`` with huggingface_hub, and pin it (:func:`write_pin`).

    Nothing is downloaded when the manifest is already there (a pin naming another commit than a
    ``data.revision`` commit hash is refused). Offline it fails at once (a 3-second connection check),
    saying how to download it elsewhere and where to put it.

    Raises
    ------
    ConfigError
        The dataset's spec names nothing to download, the revision does not exist, or the copy there
        is pinned to another commit.
    CMBenchError
        The hub cannot be reached.
    """
    from huggingface_hub import constants, snapshot_download

    name = str(data.get("name", "dataset"))
    hub = (load_spec(str(data.spec)) if data.get("spec") else {}).get("hub") or {}
    if "repo_id" not in hub:
        raise ConfigError(f"data={name}: nothing to prepare (its dataset spec names nothing to download)")
    repo_id = str(hub["repo_id"])
    revision = None if data.get("revision") is None else str(data.get("revision"))
    root = Path(str(data.root))
    manifest = root / str(data.manifest)
    if manifest.is_file():
        pin = read_pin(root)
        if pin is not None and revision is not None and _is_commit(revision) and pin.commit != revision:
            raise ConfigError(f"data.revision={revision}: {root / PIN_FILE} pins commit {pin.commit}: point data.root "
                              f"at another folder to download that revision")
        commit = dataset_commit(root, str(data.manifest))
        at = f" (commit {commit})" if commit else " (no commit known: downloaded neither by prepare nor by hf download)"
        print(f"{name}: {manifest} already present{at}; not downloading again")
        return root
    why = _hub_reachable(constants.ENDPOINT)
    if why:
        raise CMBenchError(f"cannot download dataset {repo_id}: {why}.\n"
                           + offline_help(repo_id, revision, root, manifest, name))
    commit = resolve_revision(repo_id, revision)
    snapshot_download(repo_id=repo_id, repo_type="dataset", revision=commit, local_dir=str(root))
    pin = write_pin(root, repo_id, revision or "main", commit)
    print(f"{name}: downloaded {repo_id} at commit {commit} ({len(pin.videos)} videos hashed into {root / PIN_FILE})")
    return root


def _is_commit(revision: str) -> bool:
    """Whether a revision is a full commit hash (40 hex digits), not a branch or a tag."""
    return len(revision) == 40 and all(c in "0123456789abcdef" for c in revision.lower())
