"""An exclusive, crash-safe lock on one records file of a folder (a run shard, a score output).

The lock is an OS advisory lock (``flock``) on a hidden file beside the records file, holding the
holder's PID for the message a second process gets. The kernel drops it when its process ends, however
it ends (SIGKILL included), so a stale lock file never blocks a rerun. A holder that ends normally
removes the file; a new holder checks that the file it locked is still the one at the path (not one
removed meanwhile), so removal never lets two processes in.
"""

from __future__ import annotations

import fcntl
import os
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
        The file this process will append to; the lock file is ``.<name>.lock`` beside it (the
        folder is created when missing).

    Raises
    ------
    RunLockedError
        On entry, at once (never waits), naming the holder's PID.
    RunFolderError
        On entry, when the folder cannot be created or written (read-only, disk full).
    """

    def __init__(self, records_file: Path):
        self.path = Path(records_file).with_name(f".{Path(records_file).name}.lock")
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        while self._fd is None:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise RunLockedError(
                    f"{self.path.parent} is in use: process {holder} is writing {self.path.name[1:-5]} "
                    f"(wait for it to finish, or stop it; a killed process releases the lock at once)"
                ) from None
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

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise RunFolderError(f"cannot write into {self.path.parent}: {err.strerror or err}") from err

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
