"""Names that become paths: one mapping from user-given names to path components, one containment check.

Every writer and every reader of run outputs goes through these two functions, so a name can never
lead a file out of its folder (``data.name=..``, ``task_id=/abs/X``) and a writer and a reader
never disagree on where something lives (``data.name='mini world'``).
"""

from __future__ import annotations

import re
from pathlib import Path

from cmbench.errors import ConfigError

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def path_component(name: object, what: str = "name") -> str:
    """``name`` as one path component: runs of characters other than letters, digits, ``.``, ``_``
    and ``-`` become ``-``; leading and trailing ``-`` and ``.`` are dropped.

    Parameters
    ----------
    name : object
        Turned into text with ``str``.
    what : str
        What the name is (e.g. ``"data.name"``), for the error message.

    Raises
    ------
    ConfigError
        When nothing usable is left (``""``, ``".."``, ``"/"``).
    """
    component = _UNSAFE.sub("-", str(name)).strip("-.")
    if not component:
        raise ConfigError(f"{what}={str(name)!r} cannot name a folder: use letters, digits, '.', '_' or '-'")
    return component


def inside(base: str | Path, *parts: str) -> Path:
    """``base / parts...``, refusing any result that leaves ``base`` (``..``, absolute parts, symlinks).

    Raises
    ------
    ConfigError
        Naming the offending path.
    """
    base = Path(base)
    path = base.joinpath(*parts)
    if not path.resolve().is_relative_to(base.resolve()):
        raise ConfigError(f"{'/'.join(parts)!r} would be written outside {base} (at {path.resolve()}); refusing")
    return path


def videos_label(videos: str | Path) -> str:
    """The leaderboard name of a folder of scored videos: its name, or its parent's when the folder
    is called ``videos`` (a run directory's ``videos/``)."""
    videos = Path(videos)
    return videos.parent.name if videos.name == "videos" and videos.parent.name else videos.name
