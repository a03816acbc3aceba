"""Writing output files whole, never through a link: a new hidden file beside the target, renamed over it.

Run folders, score folders, leaderboards and reports are shared between people, so a file that is
already at an output path (a symbolic link to a victim file, a half-written file of a killed process)
is never opened for writing: the content goes into a new file created exclusively in the same folder
(``.<name>.<random>.tmp``), which is flushed and then renamed over the target. The rename replaces a
link itself, not what it points at, and readers see the old file or the new one, never half of one.
A process killed in between leaves only the hidden temporary file, which :func:`remove_stale` clears.
The new file gets the permissions ``open`` gives a new file (``0666`` less the umask), as the records
files do, so teammates read a run's files whenever the umask lets them.

A file that is appended to in place (a records file) is opened by :func:`open_in_place`, which never
writes through a link either: a symbolic link is refused, and a file with more than one hard link (a
received folder's file linked to one outside it) is first replaced by a copy of its own, renamed into
place, so the other names keep their bytes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cmbench.errors import CMBenchError
from cmbench.lock import process_alive, sole_file

TMP_SUFFIX = ".tmp"


class OutputError(CMBenchError):
    """An output file cannot be written (read-only folder, disk full, not a folder)."""


def new_sibling(path: Path, keep_suffix: bool = False) -> Path:
    """Create an empty hidden file beside ``path`` (exclusively: never an existing file or link), with the
    mode ``open`` gives a new file (``0666`` less the umask; ``mkstemp`` would make it 0600); with
    ``keep_suffix``, its name ends with ``path``'s suffix too (a video writer picks its container by it)."""
    while True:
        name = path.parent / f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}{path.suffix if keep_suffix else ''}"
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:  # another writer's name, or a planted link: draw another
            continue
        except OSError as err:
            raise OutputError(f"cannot write {path}: {err.strerror or err}") from err
        return name


def write_with(path: str | Path, write: Callable[[Path], Any], keep_suffix: bool = False) -> Path:
    """Have ``write(tmp)`` write a new file, then rename it to ``path`` (the folder must exist); with
    ``keep_suffix``, ``tmp`` ends with ``path``'s suffix (:func:`new_sibling`).

    Raises
    ------
    OutputError
        The folder cannot be written (one line naming ``path``); nothing is left behind.
    """
    path = Path(path)
    tmp = new_sibling(path, keep_suffix)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        _discard(tmp)
        raise OutputError(f"cannot write {path}: {err.strerror or err}") from err
    except BaseException:
        _discard(tmp)
        raise
    return path


def _discard(tmp: Path) -> None:
    """Remove a temporary file after a failed write; on a read-only file system removing fails too, and
    the write's error is the one to report."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole (:func:`write_with`)."""
    return write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def unshare(path: str | Path) -> None:
    """Make the file at ``path`` one only this path names, before it is written in place.

    Nothing happens when it is missing or already a regular file with one link. A file with more links
    (a hard link to a file elsewhere) is replaced by a copy of itself, renamed into place: the other
    names keep the old file, untouched.

    Raises
    ------
    OutputError
        ``path`` is a symbolic link or not a regular file (one line: remove it), or cannot be copied.
    """
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise OutputError(f"cannot write {path}: it is a link (a file is never written through one: remove it)")
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"cannot write {path}: it is not a regular file (remove it)")
    if info.st_nlink > 1:
        write_with(path, lambda tmp: shutil.copyfile(path, tmp))


def open_in_place(path: str | Path, flags: int) -> int:
    """Open ``path`` to write it in place (``os.open`` ``flags``, e.g. ``O_WRONLY | O_APPEND | O_CREAT``),
    never through a link (:func:`unshare` first); the file descriptor.

    Raises
    ------
    OutputError
        A link or a file that is not regular at ``path``, or another link made to it as it was opened.
    OSError
        The file system refused the open.
    """
    path = Path(path)
    for _ in range(2):
        unshare(path)
        fd = os.open(path, flags | os.O_NOFOLLOW, 0o666)
        if sole_file(os.fstat(fd)):
            return fd
        os.close(fd)  # linked (or replaced) between the check and the open: once more
    raise OutputError(f"cannot write {path}: another link to it appears as it is opened (remove the other link)")


def remove_stale(folder: Path, name: str) -> list[Path]:
    """Remove the temporary files that writers of ``folder / name`` left when killed; the removed paths."""
    gone = []
    for tmp in Path(folder).glob(f".{name}.*{TMP_SUFFIX}*"):
        if tmp.is_file() or tmp.is_symlink():
            tmp.unlink(missing_ok=True)
            gone.append(tmp)
    return gone


def dead_builds(out: Path, prefix: str) -> list[tuple[Path, str]]:
    """Folders beside ``out`` named ``<prefix><pid>[-<rest>]`` (where a process builds what replaces
    ``out``) whose process is gone: killed half-way. Each with its ``<rest>`` (empty when none)."""
    found = []
    for folder in sorted(Path(out).parent.glob(prefix + "*")):
        pid, _, rest = folder.name[len(prefix):].partition("-")
        if pid.isdigit() and not process_alive(int(pid)) and folder.is_dir() and not folder.is_symlink():
            found.append((folder, rest))
    return found
