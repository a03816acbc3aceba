"""Context videos by content: each one's SHA-256, cached across runs, checked before a run uses it.

A run records its context video's hash in every record (``context_hash``) and, before it starts, checks
each video it is about to use against

- the dataset's pin (:data:`cmbench.data.official.PIN_FILE`, written by ``prepare`` when it downloaded
  the set): a video whose bytes differ from the downloaded ones is refused;
- the run folder's earlier records: a context whose records carry another hash would mix two videos in
  one result, so it is refused too.

Hashing a one-minute video costs a read of its bytes; hashes are kept in :data:`HASH_CACHE` (relative to
the working directory, like the scorer's feature cache) keyed by the video's resolved path, size and
modification time, so a rerun over unchanged videos reads none of them again.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from cmbench import bounded_read
from cmbench.data.task import Task
from cmbench.errors import ConfigError
from cmbench.hashing import file_hash

HASH_CACHE = Path(".cache") / "video_hashes.json"
MAX_ENTRIES = 100_000
"""The most videos the cache remembers (the oldest entries go first)."""


class HashCache:
    """SHA-256 of files, remembered by (resolved path, size, modification time).

    An unreadable or malformed cache file is an empty cache (it is only ever a shortcut); a cache that
    cannot be written is left as it was.

    Parameters
    ----------
    path : Path or None
        The cache file; None keeps nothing across processes.
    """

    def __init__(self, path: Path | None = HASH_CACHE):
        self.path = path
        self.entries: dict[str, list] = self._load()
        self.hashed = 0  # files read in this process (not found in the cache)
        self._dirty = False

    def _load(self) -> dict[str, list]:
        if self.path is None:
            return {}
        try:
            text = bounded_read.read_optional_text(self.path, "hash cache")
            value = json.loads(text) if text is not None else {}
        except (OSError, ValueError, RecursionError, bounded_read.ReadLimitError):
            return {}
        if not isinstance(value, dict):
            return {}
        return {k: v for k, v in value.items()
                if isinstance(v, list) and len(v) == 3 and isinstance(v[2], str)}

    def hash(self, path: str | Path) -> str:
        """The SHA-256 of a file's bytes (64 hex digits), read only when its size or mtime changed."""
        key = str(Path(path).resolve())
        stat = os.stat(key)
        entry = self.entries.get(key)
        if entry is not None and entry[0] == stat.st_size and entry[1] == stat.st_mtime_ns:
            return str(entry[2])
        digest = file_hash(key)
        self.entries.pop(key, None)
        self.entries[key] = [stat.st_size, stat.st_mtime_ns, digest]
        self.hashed += 1
        self._dirty = True
        return digest

    def save(self) -> None:
        """Write the cache when it learnt something (the newest :data:`MAX_ENTRIES` entries)."""
        if self.path is None or not self._dirty:
            return
        kept = dict(list(self.entries.items())[-MAX_ENTRIES:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_file(self.path, json.dumps(kept))
        except OSError:
            return
        self._dirty = False


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a new file beside ``path`` and rename it over ``path``: a reader sees the old file
    or the new one, never half of one, and a link at ``path`` is replaced, not written through."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def context_hashes(tasks: Iterable[Task], cache: HashCache | None = None) -> dict[str, str]:
    """``{context_id: SHA-256}`` of the context videos of ``tasks`` (each hashed once).

    Raises
    ------
    ConfigError
        A context video cannot be read (one line naming it).
    """
    cache = cache or HashCache()
    hashes: dict[str, str] = {}
    try:
        for task in tasks:
            if task.context_id not in hashes:
                hashes[task.context_id] = cache.hash(task.video_path)
    except OSError as err:
        raise ConfigError(f"context video {err.filename}: cannot be read ({err.strerror})") from None
    finally:
        cache.save()
    return hashes


def check_against_pin(tasks: Iterable[Task], hashes: Mapping[str, str], pinned: Mapping[str, str], pin_file: Path,
                      commit: str) -> None:
    """Refuse a context video whose bytes differ from the pinned download's.

    A video the pin does not list (a dataset extended by hand) is not checked against it.

    Raises
    ------
    ConfigError
        ``<video>: changed since it was downloaded (commit ...)``: the first such video.
    """
    for task in tasks:
        want = pinned.get(Path(task.video).as_posix())
        have = hashes.get(task.context_id)
        if want is not None and have is not None and want != have:
            raise ConfigError(f"{task.video_path}: changed since it was downloaded (commit {commit}: sha256 "
                              f"{want[:12]}..., now {have[:12]}...); download it again (`prepare` into an empty "
                              f"data.root) or remove {pin_file} to use it as it is")


def check_against_records(hashes: Mapping[str, str], recorded: Mapping[str, str | None], run_dir: Path) -> None:
    """Refuse a context video whose bytes differ from those a run's earlier records were computed from.

    Parameters
    ----------
    hashes : mapping
        ``{context_id: SHA-256}`` now.
    recorded : mapping
        ``{context_id: context_hash}`` of the run's latest records (None: a record from before the field).

    Raises
    ------
    ConfigError
        One line naming the context and the run folder.
    """
    for context, earlier in recorded.items():
        now = hashes.get(context)
        if earlier is not None and now is not None and earlier != now:
            raise ConfigError(f"context video {context}: changed since {run_dir}'s earlier records of it (sha256 "
                              f"{earlier[:12]}..., now {now[:12]}...): its records would mix two videos; restore "
                              f"the video or run into another out_dir")
