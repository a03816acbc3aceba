"""An exclusive, crash-safe lock on one records file of a folder (a run shard, a score output), or
on one folder a process builds (a MiniWorld suite), safe between hosts that share the folder.

The lock is a hidden file beside the records file, ``.<name>.lock`` (never a link placed there: a
symbolic link is refused, not written through; a file with a second hard link, or one that is not a
regular file, is removed and the lock file created fresh, so the other name keeps its bytes). It says
who holds it, as one JSON line (:class:`Holder`): the host, the process id and the process's start
time; its modification time is the holder's last heartbeat, renewed every :data:`HEARTBEAT_SECONDS`
while the lock is held.

Two mechanisms, one rule for who is live:

- where the file system has ``flock`` (local disks, NFS with its lock service, Lustre mounted with
  ``flock``), the lock is the kernel's advisory lock on that file: a killed holder releases it at once,
  so a stale lock file never blocks a rerun;
- where ``flock`` is refused (``ENOLCK``, ``EOPNOTSUPP``: NFS without its lock service, Lustre without
  the ``flock`` mount option), the lock file is created with ``O_EXCL`` (atomic on NFS) and held for as
  long as it is there.

A holder on this host is live while its process is (the same id *and* start time, so a reused process id
is not mistaken for it). A holder on another host is live until its heartbeat is :data:`STALE_SECONDS`
old, judged by the shared file system's clock (the lock file's modification time against that of a
file created there at that moment, :func:`fs_now`), not by this host's clock; a heartbeat from the
future beyond that age is no heartbeat. So a writer on another node is seen whichever mechanism
holds, including a ``flock`` that is local to each node. A lock file whose holder is not live is taken
over: under ``flock`` by locking it, otherwise by moving it aside (a rename, checked to have moved the
file judged stale). A lock file that does not say host, process and start (a bare ``1``, bytes of
anything else) names no writer.

A holder that ends normally removes the file. A second process is refused at once, naming the holder
(two writers of one run), or waits for it when it asks to (two builders of one suite: the second then
uses what the first built). Lock files of folders CMBench did not write are read within bounds
(:mod:`cmbench.bounded_read`: a regular file of at most :data:`LOCK_BYTES`, never through a link, a
FIFO or a device).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cmbench import bounded_read
from cmbench.errors import CMBenchError

HEARTBEAT_SECONDS = 30.0  # a holder renews its lock file's modification time this often
STALE_SECONDS = 300.0  # a lock whose heartbeat is this old (by the shared file system's clock) has no live holder
WAIT_SECONDS = 5.0  # a waiting process looks again this often where no flock can block for it
LOCK_BYTES = bounded_read.LIMITS["lock"]
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # flock is not supported here


class RunLockedError(CMBenchError):
    """Another live process holds the lock."""


class RunFolderError(CMBenchError):
    """The folder of the records file cannot be created or written."""


class LockFileError(CMBenchError):
    """A lock file is not one CMBench wrote: not a small regular file, or not a holder's line."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: what its file's line says.

    Attributes
    ----------
    host : str
        ``socket.gethostname()`` of the holder.
    pid : int
    start : int or None
        The process's start time (clock ticks since boot, from ``/proc``), None where the host has no
        ``/proc``: with the host and the id, it names one process however ids are reused.
    """

    host: str
    pid: int
    start: int | None

    @classmethod
    def this_process(cls) -> "Holder":
        return cls(socket.gethostname(), os.getpid(), process_start(os.getpid()))

    @classmethod
    def parse(cls, raw: bytes, where: Path) -> "Holder":
        """The holder a lock file's bytes name.

        Raises
        ------
        LockFileError
            Not one JSON object with ``host`` (text), ``pid`` (a whole number > 0) and ``start``
            (a whole number or null).
        """
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            raise LockFileError(f"{where}: not a lock CMBench wrote (expected a line with host, pid and start)")
        host, pid, start = data.get("host"), data.get("pid"), data.get("start")
        for key, ok in (("host", isinstance(host, str) and 0 < len(host) <= 255),
                        ("pid", type(pid) is int and pid > 0),
                        ("start", start is None or (type(start) is int and start >= 0))):
            if not ok:
                raise LockFileError(f"{where}: field {key}: {data.get(key)!r} is not a lock holder's {key}")
        return cls(str(host), int(str(pid)), None if start is None else int(str(start)))

    def line(self) -> bytes:
        return (json.dumps({"host": self.host, "pid": self.pid, "start": self.start}) + "\n").encode()

    def local(self) -> bool:
        return self.host == socket.gethostname()

    def describe(self) -> str:
        return f"process {self.pid}" if self.local() else f"process {self.pid} on {self.host}"


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (``/proc/<pid>/stat``), None where unknown."""
    try:
        raw = bounded_read.read_bytes(f"/proc/{pid}/stat", "lock")
        return int(raw[raw.rindex(b")") + 2:].split()[19])  # field 22; the name in (...) may hold spaces
    except (OSError, ValueError, IndexError, CMBenchError):
        return None


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fs_now(folder: Path) -> float:
    """The shared file system's clock, in seconds: the modification time of a file created in
    ``folder`` now (removed at once); this host's clock where nothing can be created there."""
    probe = Path(folder) / f".cmbench-clock-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return time.time()
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def holder_live(holder: Holder, beat: float, now: float) -> bool:
    """Whether a lock's holder is live: on this host, its process runs (the same start time where
    both are known); on another, its heartbeat (``beat``, the lock file's modification time) is less
    than :data:`STALE_SECONDS` from ``now`` (the shared file system's clock) either way."""
    if holder.local():
        if not process_alive(holder.pid):
            return False
        started = process_start(holder.pid)
        return holder.start is None or started is None or started == holder.start
    return abs(now - beat) < STALE_SECONDS


def age_text(beat: float, now: float) -> str:
    return f"last heartbeat {max(0, round(now - beat))} s ago"


class RunLock:
    """``with RunLock(records_file):`` holds the exclusive lock of ``records_file``'s writer.

    Parameters
    ----------
    records_file : Path
        The file (or folder) this process will write; the lock file is ``.<name>.lock`` beside it
        (the parent folder is created when missing).
    on_wait : callable, optional
        When given, a held lock is waited for instead of refused: ``on_wait(holder)`` (the holder's
        description, e.g. ``process 4000 on node7``) is called when the lock is found held, then the
        lock is taken as soon as its holder releases it, dies, or (on another host) stops beating.

    Raises
    ------
    RunLockedError
        On entry, at once, naming the holder, when the lock is held and ``on_wait`` is None.
    RunFolderError
        On entry, when the folder cannot be created or written (read-only, disk full).
    """

    def __init__(self, records_file: Path, on_wait: Callable[[str], None] | None = None):
        self.path = Path(records_file).with_name(f".{Path(records_file).name}.lock")
        self.on_wait = on_wait
        self.flock = True  # False once the file system refused flock: the O_EXCL lock file instead
        self._fd: int | None = None
        self._waited_for: str | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> "RunLock":
        me = Holder.this_process()
        while self._fd is None:
            fd, created = self._open()
            if self._take(fd, created):
                try:
                    os.ftruncate(fd, 0)
                    os.write(fd, me.line())
                except OSError as err:
                    os.close(fd)
                    raise RunFolderError(f"cannot write into {self.path.parent}: {err.strerror or err}") from err
                self._fd = fd
        self._beat = threading.Thread(target=self._heartbeat, name=f"heartbeat {self.path}", daemon=True)
        self._beat.start()
        return self

    def _take(self, fd: int, created: bool) -> bool:
        """Whether this process now holds the lock file open at ``fd`` (else ``fd`` is closed, having
        waited for or moved aside its holder's, or the call refuses)."""
        if self.flock:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._held(fd, self._holder_text(fd), block=True)
                return False
            except OSError as err:
                if err.errno not in NO_FLOCK:
                    os.close(fd)
                    raise RunFolderError(f"cannot lock {self.path}: {err.strerror or err}") from err
                self.flock = False
            if self.flock and not self._still_at_path(fd):  # its holder removed it as we locked it
                os.close(fd)
                return False
        if created and not self.flock:  # O_EXCL made it: ours
            return True
        holder, beat = self._read_holder(fd)
        if self.flock and (holder is None or holder.local()):  # the kernel's lock, and no other host's line
            return True
        now = fs_now(self.path.parent)
        if holder is not None and holder_live(holder, beat, now):
            # a live holder on another host whose flock this host cannot see, or, without flock, any live holder
            self._held(fd, holder.describe(), "" if holder.local() else f"{age_text(beat, now)}; ")
            return False
        if self.flock:  # another host's holder, stale
            return True
        if holder is None and abs(now - beat) < STALE_SECONDS:  # being written by its creator: wait for its line
            self._held(fd, "a process that is creating it", f"{age_text(beat, now)}; ")
            return False
        self._set_aside(fd)
        return False

    def _held(self, fd: int, holder: str, note: str = "", block: bool = False) -> None:
        """The lock is held by ``holder``: refuse (saying ``note`` too), or wait for it (``fd`` is closed
        either way): until its flock is released (``block``: the kernel knows the holder), else
        :data:`WAIT_SECONDS`."""
        if self.on_wait is None:
            os.close(fd)
            raise RunLockedError(
                f"{self.path.parent} is in use: {holder} is writing {self.path.name[1:-5]} "
                f"({note}wait for it to finish, or stop it; a killed process releases the lock)") from None
        if holder != self._waited_for:
            self.on_wait(holder)
            self._waited_for = holder
        try:
            if block:
                fcntl.flock(fd, fcntl.LOCK_EX)  # until the holder releases it or dies; the file is opened again
            else:
                time.sleep(WAIT_SECONDS)
        finally:
            os.close(fd)

    def _holder_text(self, fd: int) -> str:
        holder, _ = self._read_holder(fd)
        return "an unknown process" if holder is None else holder.describe()

    def _read_holder(self, fd: int) -> tuple[Holder | None, float]:
        """The holder the open lock file names (None: none, or not a holder's line) and its heartbeat."""
        raw = os.pread(fd, LOCK_BYTES + 1, 0)
        beat = os.fstat(fd).st_mtime
        try:
            return Holder.parse(raw, self.path) if len(raw) <= LOCK_BYTES else None, beat
        except LockFileError:
            return None, beat

    def _set_aside(self, fd: int) -> None:
        """Move the stale lock file open at ``fd`` out of the way (without flock); put back a file another
        process created there meanwhile, which is that process's lock."""
        aside = self.path.with_name(f"{self.path.name}.stale-{socket.gethostname()}-{os.getpid()}")
        try:
            os.rename(self.path, aside)
            if os.lstat(aside).st_ino == os.fstat(fd).st_ino:
                aside.unlink()
            else:
                os.link(aside, self.path)  # fails (kept aside) if yet another lock appeared there
                aside.unlink()
        except FileExistsError:
            aside.unlink(missing_ok=True)
        except FileNotFoundError:
            pass  # removed meanwhile: its holder finished
        except OSError as err:
            raise RunFolderError(f"cannot replace the stale lock {self.path}: {err.strerror or err}") from err
        finally:
            os.close(fd)

    def _open(self) -> tuple[int, bool]:
        """Open the lock file: the one at the path when it is this folder's own (a regular file with one
        link), else a fresh one in place of whatever is there; and whether this call created it."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                try:
                    return os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
                except FileExistsError:
                    pass
                try:
                    fd = os.open(self.path, flags)
                except FileNotFoundError:  # removed since: create it
                    continue
                info = os.fstat(fd)
                if sole_file(info):
                    return fd, False
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

    def _heartbeat(self) -> None:
        """Renew the lock file's modification time every :data:`HEARTBEAT_SECONDS` (the file system sets
        it by its own clock) until the lock is released."""
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                if self._fd is not None:
                    os.utime(self._fd)
            except OSError:
                pass  # a missed beat; the next one may succeed

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._fd is not None:
            if self.flock or self._still_at_path(self._fd):  # without flock, only a file that is still ours goes
                self.path.unlink(missing_ok=True)  # while still held, so no one locks the removed file for good
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


def sole_file(info: os.stat_result) -> bool:
    """Whether a file's status is that of a regular file with one link: one that can be written in
    place without writing through to another name (the rule of every writer of received folders)."""
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


def active_writer(folder: Path, warn: Callable[[str], None] | None = None) -> str | None:
    """Who is writing one of a folder's records files (``process 4000`` on this host, ``process 4000 on
    node7, last heartbeat 12 s ago`` on another), or None.

    Read from the lock files without locking them (taking a lock, even briefly, would refuse a run
    starting at that moment), each within bounds (a regular file of at most :data:`LOCK_BYTES`, never
    through a link); a lock file names a live writer by :func:`holder_live`. A lock file that is not one
    CMBench wrote (a FIFO, a device, an 8 GiB file, a bare ``1``) names none: ``warn`` gets one line
    naming it. An empty one (its writer is writing its line) names none either.
    """
    now: float | None = None
    for lock in sorted(Path(folder).glob(".records*.jsonl.lock")):
        try:
            raw, beat = bounded_read.read_bytes(lock, "lock", follow_links=False), os.lstat(lock).st_mtime
            if not raw.strip():
                continue
            holder = Holder.parse(raw, lock)
        except FileNotFoundError:
            continue
        except OSError as err:
            if warn is not None:
                warn(f"{lock}: {'is a link' if err.errno == errno.ELOOP else err.strerror or err}: names no writer")
            continue
        except CMBenchError as err:
            if warn is not None:
                warn(f"{err}: names no writer")
            continue
        now = fs_now(Path(folder)) if now is None else now
        if holder_live(holder, beat, now):
            return holder.describe() if holder.local() else f"{holder.describe()}, {age_text(beat, now)}"
    return None
