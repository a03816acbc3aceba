"""An exclusive, crash-safe lock on one records file of a folder (a run shard, a score output), or
on one folder a process builds (a MiniWorld suite).

The lock is an OS advisory lock (``flock``) on a hidden file beside the records file (never a link
placed there: a symbolic link is refused, not written through; a file with a second hard link, or one
that is not a regular file, is removed and the lock file created fresh, so the other name keeps its
bytes), holding the holder's PID for the message a second process gets. The kernel drops it when its process ends, however
it ends (SIGKILL included), so a stale lock file never blocks a rerun. A holder that ends normally
removes the file; a new holder checks that the file it locked is still the one at the path (not one
removed meanwhile), so removal never lets two processes in. A second process is refused at once with
the holder's PID (two writers of one run), or waits for the holder when it asks to (two builders of one
suite: the second then uses what the first built).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from cmbench.errors import CMBenchError


class RunLockedError(CMBenchError):
    """Another live process holds the lock."""


class RunFolderError(CMBenchError):
    """The folder of the records file cannot be created or written."""


class RunLock:
    """``with RunLock(records_file):`` holds the exclusive lock of ``records_file``'s writer.

    Parameters
    ----------
    records_file : Path
        The file (or folder) this process will write; the lock file is ``.<name>.lock`` beside it
        (the parent folder is created when missing).
    on_wait : callable, optional
        When given, a held lock is waited for instead of refused: ``on_wait(holder_pid)`` is called
        each time the lock is found held, then the lock is taken as soon as its holder releases it
        (or dies).

    Raises
    ------
    RunLockedError
        On entry, at once, naming the holder's PID, when the lock is held and ``on_wait`` is None.
    RunFolderError
        On entry, when the folder cannot be created or written (read-only, disk full).
    """

    def __init__(self, records_file: Path, on_wait: Callable[[str], None] | None = None):
        self.path = Path(records_file).with_name(f".{Path(records_file).name}.lock")
        self.on_wait = on_wait
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        while self._fd is None:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._wait_or_refuse(fd)
            if not self._still_at_path(fd):  # its holder removed it as we locked it: lock the new one
                os.close(fd)
                continue
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            except OSError as err:
                os.close(fd)
                raise RunFolderError(f"cannot write into {self.path.parent}: {err.strerror or err}") from err
            self._fd = fd
        return self

    def _wait_or_refuse(self, fd: int) -> None:
        """The lock on ``fd`` is held by another process: wait for it (``on_wait``) or refuse."""
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        if self.on_wait is None:
            os.close(fd)
            raise RunLockedError(
                f"{self.path.parent} is in use: process {holder} is writing {self.path.name[1:-5]} "
                f"(wait for it to finish, or stop it; a killed process releases the lock at once)"
            ) from None
        self.on_wait(holder)
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until the holder releases it or dies

    def _open(self) -> int:
        """Open the lock file: the one at the path when it is this folder's own (a regular file with one
        link), else a fresh one in place of whatever is there."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
                info = os.fstat(fd)
                if sole_file(info):
                    return fd
                os.close(fd)
                if self._still_same(info):  # never ours: its name goes, whatever it names stays as it was
                    self.path.unlink()
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise RunFolderError(f"cannot lock {self.path}: it is a link (a lock file is never written through "
                                     f"one: remove it)") from err
            raise RunFolderError(f"cannot write into {self.path.parent}: {err.strerror or err}") from err

    def _still_same(self, info: os.stat_result) -> bool:
        try:
            return os.lstat(self.path).st_ino == info.st_ino
        except FileNotFoundError:
            return False

    def _still_at_path(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # while still held, so no one locks the removed file for good
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


def sole_file(info: os.stat_result) -> bool:
    """Whether a file's status is that of a regular file with one link: one that can be written in
    place without writing through to another name (the rule of every writer of received folders)."""
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def active_writer(folder: Path) -> str | None:
    """The process id of a live writer of one of a folder's records files, or None.

    Read from the lock files without locking them (taking a lock, even briefly, would refuse a run
    starting at that moment): a lock file that names a live process means a run is writing; one left
    by a killed process names a dead one. A reused process id can make a finished run look busy.
    """
    for lock in sorted(Path(folder).glob(".records*.jsonl.lock")):
        if lock.is_symlink():
            continue
        try:
            holder = lock.read_text(errors="replace").strip()
        except OSError:
            continue
        if holder.isdigit() and process_alive(int(holder)):
            return holder
    return None
