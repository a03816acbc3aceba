"""The records/build lock: refused at once by default, waited for when the caller asks to."""

import os
import threading

import pytest

from cmbench.lock import RunLock, RunLockedError


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
    assert events == [f"waited for {os.getpid()}", "first releases it", "second holds it"]
    assert not (tmp_path / ".suite.lock").exists()
