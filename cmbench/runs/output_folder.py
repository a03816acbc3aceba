"""The one rule for writing an output folder: CMBench writes only into a folder that is empty or that it made.

Every command that writes a folder (``run``, ``score``, ``leaderboard`` and its sweep boards, ``curves``,
``report``, ``diagnose``, ``calibrate``) first claims it here. A folder CMBench made holds a marker,
``.cmbench-written.json``, naming the kind of folder (``run``, ``score``, ``leaderboard``, ...) and every
entry (file or sub-folder) CMBench wrote at its top level; CMBench replaces or removes only the entries on
that list. A claim is refused, in one line naming the folder and what is in the way, when the path is a
file or a link, when the folder holds something and has no marker (someone else's folder; CMBench's own lock
and temporary files, left there by another process claiming the same new folder, do not count), when its
marker names another kind (a leaderboard pointed at a run folder), or when a file the command would
write is there but not on the list (a user's own ``comparisons.csv`` added to a board folder).

Folders written by CMBench versions that kept no marker are recognised by their files (a
:class:`Legacy` rule per kind: a run folder by its ``run.json`` and records file, a leaderboard by its
``leaderboard.md`` and ``leaderboard.csv``) and by holding nothing but that kind's own entries: those
are adopted into a new marker on the first write. A folder that also holds anything else is someone's.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cmbench import bounded_read
from cmbench.errors import CMBenchError, some
from cmbench.lock import RunLock
from cmbench.runs import atomic

MARKER = ".cmbench-written.json"
HOLDS = {"run": "the records of a run", "score": "scores", "leaderboard": "a leaderboard", "sweeps": "sweep boards",
         "report": "a report", "diagnose": "a diagnosis", "calibration": "calibrations"}
"""What a folder of each kind holds, for messages."""


class OutputFolderError(CMBenchError):
    """An output folder CMBench may not write into (someone else's, another kind's, a file or a link)."""


@dataclass(frozen=True)
class Legacy:
    """How a folder of ``kind`` written before markers existed is recognised.

    Attributes
    ----------
    required : tuple of tuple of str
        Groups of glob patterns: the folder is of this kind when, for one group, each pattern is matched
        by a regular file at the folder's top level (an empty group: any folder).
    names : tuple of str
        Glob patterns of the kind's own entries: those present are adopted as CMBench's, when the folder
        holds nothing else (CMBench's hidden temporary and lock files aside).
    """

    required: tuple[tuple[str, ...], ...]
    names: tuple[str, ...]
    recognise: Callable[[Path], bool] | None = None
    """A further test of the folder (a report's page says CMBench made it)."""

    def adopt(self, folder: Path, entries: list[str]) -> set[str] | None:
        """The entries of ``folder`` adopted as CMBench's, or None when the folder is not of this kind."""
        regular = [e for e in entries if not (folder / e).is_symlink() and (folder / e).is_file()]
        if not any(all(fnmatch.filter(regular, p) for p in group) for group in self.required):
            return None
        own = {e for e in entries if any(fnmatch.fnmatchcase(e, p) for p in self.names)}
        if any(e not in own and not transient(e) for e in entries):
            return None  # something else beside them: a folder of the user's that holds a copy of them
        return own if self.recognise is None or self.recognise(folder) else None


@dataclass
class OutputFolder:
    """A claimed output folder: what CMBench may replace there.

    Attributes
    ----------
    path : Path
    kind : str
        The kind of folder (``run``, ``score``, ``leaderboard``, ``sweeps``, ``report``, ``diagnose``,
        ``calibration``).
    option : str
        The setting that chose the folder, for messages (``leaderboard.out``).
    files : set of str
        Top-level entries CMBench wrote (from the marker, or adopted by a :class:`Legacy` rule).
    """

    path: Path
    kind: str
    option: str
    files: set[str] = field(default_factory=set)

    @property
    def where(self) -> str:
        """The folder as messages name it: ``leaderboard.out=<path>``, or ``the run directory <path>``."""
        return named(self.option, self.path)

    def owns(self, name: str) -> bool:
        """Whether the entry ``name`` is CMBench's (written here by it, or absent)."""
        target = self.path / name
        return name in self.files or not (target.exists() or target.is_symlink())

    def add(self, *names: str) -> None:
        """Put ``names`` on the marker's list, before they are written (the folder is created when missing).

        Raises
        ------
        OutputFolderError
            One of ``names`` is already there and not CMBench's, or the folder cannot be written.
        """
        for name in names:
            if not self.owns(name):
                raise self._not_ours(name)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OutputFolderError(f"{self.where}: cannot create it: {err.strerror or err}") from err
        with RunLock(self.path / MARKER, on_wait=lambda holder: None):  # shards of one run add at once
            marked = read_marker(self.path, self.option)
            self.files |= set(names) | (marked[1] if marked is not None else set())
            text = json.dumps({"written_by": "cmbench", "kind": self.kind, "files": sorted(self.files)}, indent=1)
            try:
                atomic.write_text(self.path / MARKER, text + "\n")
            except atomic.OutputError as err:
                raise OutputFolderError(f"{self.where}: {err}") from err

    def remove(self, name: str) -> None:
        """Remove the entry ``name`` if CMBench wrote it (a link is removed, never followed)."""
        if name not in self.files:
            return
        target = self.path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)

    def _not_ours(self, name: str) -> OutputFolderError:
        return OutputFolderError(f"{self.where}: {name} is there and CMBench did not write it (not "
                                 f"listed in {MARKER}); choose another {self.option}, or move {name} away")


def named(option: str, path: Path) -> str:
    """``option=path`` for a setting (``out``), ``option path`` for a phrase (``the run directory``)."""
    return f"{option} {path}" if " " in option else f"{option}={path}"


def transient(name: str) -> bool:
    """A hidden file CMBench's writers leave while working: a temporary file or a lock file."""
    return name.startswith(".") and (name.endswith(atomic.TMP_SUFFIX) or name.endswith(".lock")
                                     or f"{atomic.TMP_SUFFIX}." in name)


def claim(folder: str | Path, kind: str, option: str, *, names: Iterable[str] = (), legacy: Legacy | None = None,
          whole: bool = False) -> OutputFolder:
    """Check that CMBench may write ``names`` into ``folder`` (nothing is written yet: :meth:`OutputFolder.add`).

    Parameters
    ----------
    folder : path
    kind : str
        The kind of folder the command writes; a folder marked as another kind is refused.
    option : str
        The setting that chose ``folder`` (named in messages).
    names : iterable of str
        The top-level entries the command may write or replace: each one present must be CMBench's.
    legacy : Legacy, optional
        How a folder of this kind written before markers existed is recognised.
    whole : bool
        The command replaces the folder as a whole (a report): every entry must be CMBench's.

    Returns
    -------
    OutputFolder

    Raises
    ------
    OutputFolderError
        One line naming the folder and what is in the way.
    """
    path = Path(folder)
    hint = f"choose an empty or new folder for {option}, so nothing of yours is replaced"
    if path.is_symlink():
        raise OutputFolderError(f"{named(option, path)}: is a link (an output folder is never written through one); {hint}")
    if path.exists() and not path.is_dir():
        raise OutputFolderError(f"{named(option, path)}: is a file, not a folder; {hint}")
    out = OutputFolder(path, kind, option)
    if not path.exists():
        return out
    try:
        entries = sorted(e for e in os.listdir(path) if e != MARKER)
    except OSError as err:
        raise OutputFolderError(f"{named(option, path)}: cannot be read: {err.strerror or err}") from err
    marked = read_marker(path, option)
    if marked is not None:
        marked_kind, out.files = marked
        if marked_kind != kind:
            held = HOLDS.get(marked_kind, f"a CMBench {marked_kind} folder")
            raise OutputFolderError(f"{named(option, path)}: holds {held}, not {HOLDS.get(kind, kind)}; {hint}")
    elif not all(map(transient, entries)):  # only a writer's lock or temporary file: another process is claiming it
        adopted = legacy.adopt(path, entries) if legacy is not None else None
        if adopted is None:
            raise OutputFolderError(f"{named(option, path)}: not empty and not written by CMBench (it holds "
                                    f"{some(entries)}); {hint}")
        out.files = adopted
    for name in [*names, *(e for e in entries if whole and not transient(e))]:
        if not out.owns(name):
            raise out._not_ours(name)
    return out


def read_marker(folder: Path, option: str) -> tuple[str, set[str]] | None:
    """``(kind, files)`` of ``folder``'s marker, or None when it has none.

    Raises
    ------
    OutputFolderError
        A marker that is a link, not a regular file, too large, or not a list of plain names.
    """
    marker = folder / MARKER
    try:
        info = marker.lstat()
    except FileNotFoundError:
        return None
    where = f"{named(option, folder)}: its {MARKER}"
    limit = bounded_read.LIMITS["marker"]
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        raise OutputFolderError(f"{where} is not a marker CMBench wrote (a link, not a file, or over "
                                f"{limit} bytes); choose another {option}")
    try:
        content = json.loads(bounded_read.read_bytes(marker, "marker"))
        kind, files = content["kind"], content["files"]
    except bounded_read.ReadLimitError as err:
        raise OutputFolderError(f"{where} is not a marker CMBench wrote ({err}); choose another {option}") from err
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise OutputFolderError(f"{where} is unreadable ({type(err).__name__}); choose another {option}") from err
    plain = isinstance(files, list) and all(isinstance(f, str) and f not in ("", ".", "..") and "/" not in f
                                            and "\0" not in f for f in files)
    if not isinstance(kind, str) or not plain:
        raise OutputFolderError(f"{where}: 'kind' must be a string and 'files' a list of plain names; "
                                f"choose another {option}")
    return kind, set(files)


__all__ = ["MARKER", "Legacy", "OutputFolder", "OutputFolderError", "claim", "read_marker", "transient"]
