"""The records/build lock: refused at once by default, waited for when the caller asks to; safe between
hosts (a holder on another host is live until its heartbeat is stale); a file system without flock falls
back to an O_EXCL lock file; lock files of received folders are read within bounds."""

import errno
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from cmbench import lock as locks
from cmbench.lock import STALE_SECONDS, RunLock, RunLockedError, active_writer


def test_a_held_lock_is_refused_at_once_naming_the_holder(tmp_path):
    target = tmp_path / "records.jsonl"
    with RunLock(target):
        with pytest.raises(RunLockedError, match=r"process \d+ is writing records.jsonl"):
            with RunLock(target):
                pass
    assert not (tmp_path / ".records.jsonl.lock").exists()


def test_a_waiting_lock_is_taken_once_the_holder_releases_it(tmp_path):
    target = tmp_path / "suite"
    events: list[str] = []
    waiting = threading.Event()

    def second() -> None:
        def on_wait(holder: str) -> None:
            events.append(f"waited for {holder}")
            waiting.set()

        with RunLock(target, on_wait=on_wait):
            events.append("second holds it")

    with RunLock(target):
        thread = threading.Thread(target=second)
        thread.start()
        assert waiting.wait(timeout=10)
        events.append("first releases it")
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert events == [f"waited for process {os.getpid()}", "first releases it", "second holds it"]
    assert not (tmp_path / ".suite.lock").exists()


def test_a_lock_says_host_process_and_start_and_beats(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "HEARTBEAT_SECONDS", 0.05)
    target = tmp_path / "records.jsonl"
    with RunLock(target) as held:
        line = json.loads(held.path.read_text())
        assert line == {"host": locks.socket.gethostname(), "pid": os.getpid(), "start": locks.process_start(os.getpid())}
        assert line["start"] is not None  # Linux: the process's start in /proc
        os.utime(held.path, (0, 0))
        deadline = time.monotonic() + 10
        while held.path.stat().st_mtime == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert held.path.stat().st_mtime > time.time() - 60  # the heartbeat renewed it


def on_host(monkeypatch, name):
    monkeypatch.setattr(locks.socket, "gethostname", lambda: name)


def foreign_lock(folder, age, host="node-b", pid=4000000, name="records.jsonl"):
    """A lock file as a writer on another host leaves it: its line, and a heartbeat ``age`` seconds ago."""
    path = folder / f".{name}.lock"
    path.write_text(json.dumps({"host": host, "pid": pid, "start": 12345}) + "\n")
    beat = time.time() - age
    os.utime(path, (beat, beat))
    return path


def test_a_live_writer_on_another_host_is_refused_and_a_stale_one_taken_over(tmp_path, monkeypatch):
    target = tmp_path / "records.jsonl"
    foreign_lock(tmp_path, age=20)  # PID 4000000 does not exist here: only its heartbeat says it is live
    with pytest.raises(RunLockedError, match=r"process 4000000 on node-b is writing records.jsonl \(last heartbeat 2\d s ago; wait"):
        with RunLock(target):
            pass
    assert active_writer(tmp_path) == "process 4000000 on node-b, last heartbeat 20 s ago"
    path = foreign_lock(tmp_path, age=STALE_SECONDS + 60)
    assert active_writer(tmp_path) is None
    with RunLock(target):
        assert json.loads(path.read_text())["host"] == locks.socket.gethostname()
    assert not path.exists()


def test_two_hosts_whose_flock_is_local_to_each_see_each_other_by_heartbeat(tmp_path, monkeypatch):
    """Lustre's localflock: each node's flock succeeds whatever the other holds; the lock's line and heartbeat
    still refuse the second writer, and a first writer that stopped beating is taken over."""
    monkeypatch.setattr(locks.fcntl, "flock", lambda fd, op: None)
    target = tmp_path / "records.jsonl"
    on_host(monkeypatch, "node-a")
    first = RunLock(target).__enter__()
    on_host(monkeypatch, "node-b")
    with pytest.raises(RunLockedError, match=rf"process {os.getpid()} on node-a is writing records.jsonl \(last heartbeat \d+ s ago"):
        RunLock(target).__enter__()
    assert active_writer(tmp_path).startswith(f"process {os.getpid()} on node-a")
    stale = time.time() - STALE_SECONDS - 1
    first._stop.set()  # node-a froze: no more heartbeats
    os.utime(first.path, (stale, stale))
    assert active_writer(tmp_path) is None
    with RunLock(target) as second:
        assert json.loads(second.path.read_text())["host"] == "node-b"


def test_a_heartbeat_judged_by_the_file_systems_clock_not_the_readers(tmp_path, monkeypatch):
    foreign_lock(tmp_path, age=20)
    monkeypatch.setattr(locks.time, "time", lambda: 4e9)  # this host's clock runs decades ahead
    assert active_writer(tmp_path).startswith("process 4000000 on node-b")


def test_a_heartbeat_from_the_future_is_no_heartbeat(tmp_path):
    foreign_lock(tmp_path, age=-10 * STALE_SECONDS)  # a forged mtime years ahead cannot hold a folder for good
    assert active_writer(tmp_path) is None


def raise_enolck(fd, op):
    raise OSError(errno.ENOLCK, "No locks available")


def test_without_flock_the_lock_file_itself_is_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(locks.fcntl, "flock", raise_enolck)
    target = tmp_path / "records.jsonl"
    with RunLock(target) as held:
        assert not held.flock
        with pytest.raises(RunLockedError, match=rf"process {os.getpid()} is writing records.jsonl"):
            with RunLock(target):
                pass
        assert active_writer(tmp_path) == f"process {os.getpid()}"
    assert not held.path.exists()
    # a holder killed on this host: its process is gone, so its file is taken over at once
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    foreign_lock(tmp_path, age=0, host=locks.socket.gethostname(), pid=int(gone.stdout))
    with RunLock(target) as held:
        assert json.loads(held.path.read_text())["pid"] == os.getpid()
    # another host's: refused while it beats, taken over once it is stale
    foreign_lock(tmp_path, age=5)
    with pytest.raises(RunLockedError, match="process 4000000 on node-b"):
        with RunLock(target):
            pass
    foreign_lock(tmp_path, age=STALE_SECONDS + 1)
    with RunLock(target) as held:
        assert json.loads(held.path.read_text())["pid"] == os.getpid()
    assert not list(tmp_path.glob(".records.jsonl.lock*"))  # nothing left aside


def test_without_flock_a_waiter_takes_the_lock_when_the_holder_goes(tmp_path, monkeypatch):
    monkeypatch.setattr(locks.fcntl, "flock", raise_enolck)
    monkeypatch.setattr(locks, "WAIT_SECONDS", 0.05)
    target, waited = tmp_path / "suite", []
    with RunLock(target):
        thread = threading.Thread(target=lambda: RunLock(target, on_wait=waited.append).__enter__().__exit__(
            None, None, None))
        thread.start()
        time.sleep(0.3)
    thread.join(timeout=10)
    assert not thread.is_alive() and waited == [f"process {os.getpid()}"]


def test_another_flock_error_is_one_line_naming_the_lock(tmp_path, monkeypatch):
    def broken(fd, op):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(locks.fcntl, "flock", broken)
    with pytest.raises(locks.RunFolderError, match=r"cannot lock .*\.records\.jsonl\.lock: Input/output error"):
        with RunLock(tmp_path / "records.jsonl"):
            pass


@pytest.mark.timeout(30)
def test_lock_files_that_are_not_locks_are_one_line_each_never_a_hang(tmp_path):
    os.mkfifo(tmp_path / ".records.jsonl.lock")  # a FIFO: opening it for reading would block
    with open(tmp_path / ".records.shard-0-of-4.jsonl.lock", "wb") as sparse:
        sparse.truncate(8 * 2**30)  # 8 GiB, no blocks
    (tmp_path / ".records.shard-1-of-4.jsonl.lock").write_text("1\n")  # PID 1 is no run's writer
    (tmp_path / ".records.shard-2-of-4.jsonl.lock").symlink_to("/dev/null")  # a character device, through a link
    (tmp_path / ".records.shard-3-of-4.jsonl.lock").write_text(json.dumps({"host": "x", "pid": "1", "start": 0}))
    warned: list[str] = []
    assert active_writer(tmp_path, warn=warned.append) is None
    assert len(warned) == 5 and all("\n" not in line and line.endswith("names no writer") for line in warned)
    text = "\n".join(warned)
    assert "is a FIFO (named pipe), not a regular file" in text
    assert "8.0 GiB, over the 4.0 KiB limit of a lock" in text
    assert "shard-1-of-4.jsonl.lock: not a lock CMBench wrote" in text
    assert "shard-2-of-4.jsonl.lock: is a link" in text
    assert "shard-3-of-4.jsonl.lock: field pid: '1' is not a lock holder's pid" in text


def test_a_character_device_lock_is_refused_unread(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    # the bounded reader refuses a device whatever path names it: checked on the opened descriptor
    with pytest.raises(locks.bounded_read.ReadLimitError, match="is a character device, not a regular file"):
        locks.bounded_read.read_bytes("/dev/zero", "lock", follow_links=False)


def test_a_lock_of_a_reused_process_id_is_not_its_writer(tmp_path):
    me = locks.Holder.this_process()
    (tmp_path / ".records.jsonl.lock").write_text(json.dumps({"host": me.host, "pid": me.pid, "start": me.start}))
    assert active_writer(tmp_path) is not None
    (tmp_path / ".records.jsonl.lock").write_text(json.dumps({"host": me.host, "pid": me.pid, "start": me.start + 1}))
    assert active_writer(tmp_path) is None  # this process id, but another process: it started at another time


def test_taking_over_a_stale_lock_never_moves_a_lock_made_meanwhile(tmp_path, monkeypatch):
    """Without flock, two processes may judge one stale file at once: the second to move it aside finds
    the first one's fresh lock there instead, and puts it back."""
    monkeypatch.setattr(locks.fcntl, "flock", raise_enolck)
    stale = foreign_lock(tmp_path, age=STALE_SECONDS + 1)
    late = RunLock(tmp_path / "records.jsonl")
    fd, created = late._open()
    assert not created
    with RunLock(tmp_path / "records.jsonl") as first:  # took over the stale file first
        line = stale.read_text()
        late._set_aside(fd)  # judged the old file stale; the file there now is the first one's
        assert stale.read_text() == line and json.loads(line)["pid"] == os.getpid()
        assert first._still_at_path(first._fd)
    assert not list(tmp_path.glob(".records.jsonl.lock*"))
