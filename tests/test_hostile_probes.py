"""The hostile pass (scripts/hostile_probes.py): its outcome checks see a broken expectation, and a cheap
subset of its probes holds against the real command line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devtools.hostile import (Outcome, Probe, ProbeFailed, Workspace, absent, markdown, refused, run_probes,
                                        select, snapshot, succeeded, summary_line, unchanged)
from devtools.hostile_pass import PROBES

REPO = Path(__file__).resolve().parents[1]
TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: \'name\'\n'


def outcome(returncode: int, stderr: str = "", stdout: str = "") -> Outcome:
    return Outcome(["python", "-m", "cmbench", "run", "data.fps=0"], returncode, stdout, stderr)


def test_refused_holds_only_for_a_non_zero_exit_with_one_line_naming_everything():
    line = "cmbench: error: data.fps=0: expected a finite number > 0"
    assert refused(outcome(1, f"warming up\n{line}\n"), "data.fps", "> 0") == line
    with pytest.raises(ProbeFailed, match=r"was accepted \(exit status 0\)"):
        refused(outcome(0, line), "data.fps")
    with pytest.raises(ProbeFailed, match="printed a traceback \\(KeyError: 'name'\\)"):
        refused(outcome(1, TRACEBACK + line), "data.fps")
    with pytest.raises(ProbeFailed, match="printed a traceback"):
        refused(outcome(1, line, stdout=TRACEBACK), "data.fps")
    with pytest.raises(ProbeFailed, match=r"without one line naming 'data.fps', 'metadata.jsonl:3' \(last: "):
        refused(outcome(1, "cmbench: error: data.fps=0\ncmbench: error: metadata.jsonl:3"), "data.fps", "metadata.jsonl:3")


def test_succeeded_needs_exit_status_zero_and_no_traceback():
    succeeded(outcome(0, "warning: lossy\n"))
    with pytest.raises(ProbeFailed, match="exited 3: cmbench: error: boom"):
        succeeded(outcome(3, "cmbench: error: boom\n"))
    with pytest.raises(ProbeFailed, match="traceback"):
        succeeded(outcome(0, TRACEBACK))


def test_unchanged_sees_a_changed_added_or_removed_file(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "precious.jpg").write_bytes(b"photo")
    (tmp_path / "index.html").write_text("<p>")
    before = snapshot(tmp_path)
    unchanged(tmp_path, before, "the folder")
    (tmp_path / "img" / "precious.jpg").write_bytes(b"photo!")
    with pytest.raises(ProbeFailed, match=r"the folder changed: img/precious.jpg"):
        unchanged(tmp_path, before, "the folder")
    (tmp_path / "img" / "precious.jpg").write_bytes(b"photo")
    (tmp_path / "index.html").unlink()
    (tmp_path / "new.png").write_bytes(b"")
    with pytest.raises(ProbeFailed, match=r"changed: index.html, new.png"):
        unchanged(tmp_path, before, "the folder")
    absent(tmp_path / "PAYLOAD_RAN", "the payload")
    (tmp_path / "PAYLOAD_RAN").write_text("")
    with pytest.raises(ProbeFailed, match="the payload: PAYLOAD_RAN exists"):
        absent(tmp_path / "PAYLOAD_RAN", "the payload")


def test_a_violated_expectation_is_reported_failed_and_a_broken_probe_never_passes(tmp_path):
    def holds(ws, folder):
        assert folder == ws.root / "holds" and folder.is_dir()

    def payload_ran(ws, folder):
        (folder / "PAYLOAD_RAN").write_text("")
        absent(folder / "PAYLOAD_RAN", "report imported the run folder's adapter")

    def broken(ws, folder):
        return {}["name"]

    line = broken.__code__.co_firstlineno + 1

    seen = []
    ws = Workspace(tmp_path, [])
    probes = [Probe("holds", holds), Probe("payload-runs", payload_ran), Probe("broken", broken)]
    results = run_probes(probes, ws, report=seen.append)
    assert [r.line for r in results] == [
        "holds: held",
        "payload-runs: FAILED: report imported the run folder's adapter: PAYLOAD_RAN exists",
        f"broken: FAILED: the probe itself raised KeyError: 'name' (test_hostile_probes.py:{line})",
    ]
    assert seen == results and summary_line(results) == "3 probes: 1 held, 2 failed"
    assert [r.line for r in run_probes(probes, ws, jobs=2)] == [r.line for r in results]
    assert [p.name for p in select(probes, ["pay", "hol"])] == ["holds", "payload-runs"]
    page = markdown(results, "python scripts/hostile_probes.py", "2026-12-01 23:00 UTC", "abc1234", 12.0)
    assert "- commit: abc1234\n" in page and "**3 probes: 1 held, 2 failed in 12 s**" in page
    assert "\npayload-runs: FAILED: report imported the run folder's adapter: PAYLOAD_RAN exists (0 s)\n" in page


def test_a_read_only_folder_refuses_writes_for_the_command_only(tmp_path):
    ws = Workspace(tmp_path, [])
    folder = tmp_path / "ro"
    folder.mkdir()
    done = ws.python("-c", "import sys; open(sys.argv[1], 'w')", str(folder / "x"), read_only=folder)
    assert done.returncode == 1 and ("Read-only file system" in done.stderr or "Permission denied" in done.stderr)
    (folder / "y").write_text("writable again")


def test_the_peak_memory_of_a_command_is_measured(tmp_path):
    """Measured from a small caller, as scripts/hostile_probes.py is: a command's peak includes its
    caller's resident size at the fork (see wait_measured), and this test process may hold gigabytes."""
    measure = textwrap.dedent(f"""
        from pathlib import Path
        from devtools.hostile import Workspace
        ws = Workspace(Path({str(tmp_path)!r}), [])
        small = ws.python("-c", "pass", measure=True)
        big = ws.python("-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])", measure=True)
        print(small.peak_bytes, big.peak_bytes, ws.python("-c", "pass").peak_bytes)
    """)
    run = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    assert run.returncode == 0, run.stderr
    small, big, unmeasured = run.stdout.split()
    assert unmeasured == "None"
    assert int(big) > 300 * 2**20 > int(small) - 2**30  # an upper bound: see wait_measured
    assert int(big) > int(small) + 50 * 2**20


def test_probes_are_named_by_what_they_attack():
    names = [p.name for p in PROBES]
    assert len(names) == len(set(names)) and all(n == n.lower() and " " not in n for n in names)
    assert not [n for n in names if any(ch.isdigit() for ch in n.split("-")[0])]


def script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "hostile_probes.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_script_lists_and_refuses_an_unknown_selection():
    listed = script("--list", "--only", "validate-")
    assert listed.returncode == 0 and listed.stdout.splitlines() == [p.name for p in PROBES if "validate-" in p.name]
    none = script("--only", "no-such-probe")
    assert none.returncode == 2 and "no probe name contains 'no-such-probe'" in none.stderr


@pytest.mark.slow
def test_cheap_probes_hold_against_the_command_line():
    """Probes that need no run folder: config folders naming code or malformed, bad knobs (about a minute)."""
    only = ["config-backbone-target-os-system", "malformed-yaml-in-a-config-folder", "knob-zero-data-fps",
            "config-folder-path-with-a-comma"]
    done = script("--jobs", "2", *[arg for name in only for arg in ("--only", name)])
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(line.split(": ")[0] for line in lines[:-1]) == sorted(only)
    assert all(line.split(": ")[1].startswith("held") for line in lines[:-1])
    assert lines[-1].startswith("4 probes: 4 held, 0 failed in ")
