"""The machinery of the hostile pass: probes, their outcome checks and the runner.

A *probe* is one attack on the command line, as a careless user or someone handing over a run folder
would make it: it builds its hostile inputs in its own folder of a :class:`Workspace`, runs
``python -m cmbench ...`` (or the Python API) as a subprocess, and checks what must hold afterwards
with the checks below. A check that does not hold raises :class:`ProbeFailed` with the reason; the
runner reports every probe as ``held`` or ``FAILED: <why>`` (an unexpected exception inside a probe is
a failure too, so a broken probe never passes silently). The probes themselves are in
:mod:`devtools.hostile_probes`; ``scripts/hostile_probes.py`` is the command line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class ProbeFailed(Exception):
    """What the probe's attack broke, in one line."""


@dataclass(frozen=True)
class Outcome:
    """A finished command: its argument list, exit status and output."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    peak_bytes: int | None = None  # the command's peak resident memory, when measured

    @property
    def command(self) -> str:
        """The command as a user would type it (after ``python``), shortened for messages."""
        text = " ".join(self.args[1:])
        return text if len(text) <= 160 else text[:157] + "..."


@dataclass(frozen=True)
class Probe:
    """One attack: ``name`` says what it attacks, ``attack(workspace, folder)`` runs it and its checks."""

    name: str
    attack: Callable[["Workspace", Path], None]


@dataclass(frozen=True)
class Result:
    """A probe's verdict: ``held`` is None when it held, else why it failed."""

    name: str
    failure: str | None
    seconds: float

    @property
    def line(self) -> str:
        return f"{self.name}: {'held' if self.failure is None else 'FAILED: ' + self.failure}"


# ---------------------------------------------------------------- outcome checks


def traceback_in(outcome: Outcome) -> str | None:
    """The exception line of a Python traceback in the command's output, if there is one."""
    for stream in (outcome.stderr, outcome.stdout):
        head, found, rest = stream.partition("Traceback (most recent call last)")
        if found:
            raised = [line for line in rest.splitlines()[1:] if line.strip() and not line[0].isspace()]
            return raised[0].strip() if raised else "Traceback"
    return None


def no_traceback(outcome: Outcome) -> None:
    """The command printed no Python traceback."""
    found = traceback_in(outcome)
    if found is not None:
        raise ProbeFailed(f"`{outcome.command}` printed a traceback ({found[:200]})")


def refused(outcome: Outcome, *names: str) -> str:
    """The command exited non-zero with a one-line error on stderr naming every one of ``names``
    (a file, a key, a reason), and no traceback. Returns that line."""
    no_traceback(outcome)
    if outcome.returncode == 0:
        raise ProbeFailed(f"`{outcome.command}` was accepted (exit status 0)")
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    for line in lines:
        if all(name in line for name in names):
            return line
    last = lines[-1][:200] if lines else "nothing on stderr"
    raise ProbeFailed(f"`{outcome.command}` exited {outcome.returncode} without one line naming "
                      f"{', '.join(map(repr, names))} (last: {last})")


def succeeded(outcome: Outcome) -> None:
    """The command exited 0 without a traceback."""
    no_traceback(outcome)
    if outcome.returncode != 0:
        lines = [line for line in outcome.stderr.splitlines() if line.strip()]
        raise ProbeFailed(f"`{outcome.command}` exited {outcome.returncode}: {lines[-1][:200] if lines else ''}")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links not followed) as ``relative path -> bytes``."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def unchanged(folder: Path, before: dict[str, bytes], what: str) -> None:
    """``folder`` holds exactly the files of ``before``, byte for byte."""
    after = snapshot(folder)
    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    if changed:
        raise ProbeFailed(f"{what} changed: {', '.join(changed[:5])}")


def same_bytes(path: Path, content: bytes, what: str) -> None:
    """``path`` still holds ``content``."""
    if not path.is_file() or path.read_bytes() != content:
        raise ProbeFailed(f"{what} ({path.name}) was {'changed' if path.exists() else 'removed'}")


def absent(path: Path, what: str) -> None:
    """Nothing exists at ``path`` (e.g. a payload's marker file)."""
    if path.exists() or path.is_symlink():
        raise ProbeFailed(f"{what}: {path.name} exists")


def contains(text: str, needle: str, what: str) -> None:
    if needle not in text:
        raise ProbeFailed(f"{what}: no {needle!r}")


def lacks(text: str, needle: str, what: str) -> None:
    if needle in text:
        raise ProbeFailed(f"{what}: {needle!r} found")


# ---------------------------------------------------------------- the workspace


@dataclass
class Workspace:
    """A temporary folder with the shared inputs the probes copy (built once, on first use).

    Attributes
    ----------
    root : Path
        Everything the pass writes lives under it; each probe gets ``root / <probe name>``.
    suite_overrides : list of str
        The overrides of the small MiniWorld suite every command runs on.
    setups : dict
        Shared inputs already built (name -> value), guarded by ``lock``.
    """

    root: Path
    suite_overrides: list[str]
    timeout: float = 600.0
    setups: dict[str, object] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def env(self, pythonpath: str = "", **extra: str) -> dict[str, str]:
        """The environment of every command: offline, one thread, this checkout importable (and
        ``pythonpath`` after it), no config folders of the caller's (``CMBENCH_CONFIG_PATH``) unless
        given in ``extra``."""
        path = os.pathsep.join(p for p in (str(REPO), pythonpath, os.environ.get("PYTHONPATH", "")) if p)
        base = {k: v for k, v in os.environ.items() if k != "CMBENCH_CONFIG_PATH"}
        return {**base, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "OMP_NUM_THREADS": "1", "MPLCONFIGDIR": str(self.root / ".matplotlib"), **extra}

    def python(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
               read_only: Path | None = None, measure: bool = False) -> Outcome:
        """Run ``python *args`` to the end; ``read_only``: with that folder read-only for the command
        (a read-only bind mount in a private mount namespace when run as root, whom permissions do
        not stop; a folder without write permission otherwise); ``measure``: record its peak resident
        memory (``Outcome.peak_bytes``)."""
        argv = [sys.executable, *args]
        command = read_only_command(argv, read_only) if read_only is not None else argv
        try:
            with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
                proc = subprocess.Popen(command, cwd=cwd or self.root, env=env or self.env(), stdout=out, stderr=err,
                                        text=True)
                returncode, peak = wait_measured(proc, self.timeout)
                out.seek(0)
                err.seek(0)
                return Outcome(argv, returncode, out.read(), err.read(), peak if measure else None)
        finally:
            if read_only is not None and os.geteuid() != 0:
                read_only.chmod(0o755)

    def cmbench(self, *args: str, **kwargs) -> Outcome:
        """``python -m cmbench *args``."""
        return self.python("-m", "cmbench", *args, **kwargs)

    def start(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``python *args`` in the background (its output discarded)."""
        return subprocess.Popen([sys.executable, *args], cwd=cwd or self.root, env=env or self.env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def shared(self, name: str, build: Callable[[], object]) -> object:
        """A shared input, built by the first probe that needs it (the others wait for it)."""
        with self.lock:
            if name not in self.setups:
                self.setups[name] = build()
            return self.setups[name]


def wait_measured(proc: subprocess.Popen, timeout: float) -> tuple[int, int]:
    """Wait for ``proc`` (killing it after ``timeout`` seconds): its exit status and peak resident bytes.

    The peak is an upper bound: Linux counts the caller's resident size at the fork in the child's peak.
    """
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss * 1024  # kilobytes on Linux
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(0.02)


def read_only_command(argv: list[str], folder: Path) -> list[str]:
    """``argv`` run with ``folder`` read-only (see :meth:`Workspace.python`)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return argv
    if shutil.which("unshare") is None:
        raise ProbeFailed("cannot make a folder read-only for root: no `unshare` on this machine")
    mount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    return ["unshare", "--mount", "sh", "-c", mount, "sh", str(folder), *argv]


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, seconds: float, what: str) -> None:
    """Poll ``condition`` until it holds; the probe fails if ``proc`` ends or ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while not condition():
        if proc.poll() is not None:
            raise ProbeFailed(f"the command ended (status {proc.returncode}) before {what}: nothing was tested")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise ProbeFailed(f"no {what} within {seconds:.0f} s")
        time.sleep(0.005)


# ---------------------------------------------------------------- the runner


def select(probes: Sequence[Probe], only: Iterable[str] = ()) -> list[Probe]:
    """The probes whose name contains one of ``only`` (all when empty)."""
    only = list(only)
    return [p for p in probes if not only or any(s in p.name for s in only)]


def run_probe(probe: Probe, workspace: Workspace) -> Result:
    """Run one probe in its own folder; any exception other than a check's is reported as a failure."""
    start = time.monotonic()
    folder = workspace.root / probe.name
    folder.mkdir(parents=True, exist_ok=True)
    try:
        probe.attack(workspace, folder)
        failure = None
    except ProbeFailed as err:
        failure = one_line(str(err))
    except subprocess.TimeoutExpired as err:
        failure = f"timed out after {err.timeout:.0f} s"
    except Exception as err:  # a probe that breaks is a failure, never a pass
        where = traceback.extract_tb(err.__traceback__)[-1]
        failure = f"the probe itself raised {type(err).__name__}: {err} ({Path(where.filename).name}:{where.lineno})"
    return Result(probe.name, failure, time.monotonic() - start)


def run_probes(probes: Sequence[Probe], workspace: Workspace, jobs: int = 1,
               report: Callable[[Result], None] = lambda r: None) -> list[Result]:
    """Run ``probes`` (``jobs`` at a time), calling ``report`` as each finishes; results in probe order."""
    if jobs <= 1:
        results = []
        for probe in probes:
            results.append(run_probe(probe, workspace))
            report(results[-1])
        return results
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_probe, p, workspace) for p in probes]
        for future in futures:
            report(future.result())
        return [f.result() for f in futures]


def summary_line(results: Sequence[Result]) -> str:
    failed = sum(r.failure is not None for r in results)
    return f"{len(results)} probes: {len(results) - failed} held, {failed} failed"


def one_line(text: str) -> str:
    """``text`` on one line (a failure reason may quote output)."""
    return re.sub(r"\s*\n\s*", " | ", text.strip())


def markdown(results: Sequence[Result], command: str, date: str, commit: str, seconds: float) -> str:
    """The results page of a pass: its command, date, commit, counts and one line per probe."""
    lines = "\n".join(f"{r.line} ({r.seconds:.0f} s)" for r in results)
    return (f"# The hostile pass: last full run\n\n```\n{command}\n```\n\n- date: {date}\n- commit: {commit}\n"
            f"- result: **{summary_line(results)} in {seconds:.0f} s**\n\n"
            f"What each probe attacks and checks: [docs/testing.md](../docs/testing.md#the-hostile-pass). Times are "
            f"wall-clock seconds per probe (the first ones include building the shared suite and run).\n\n"
            f"```\n{lines}\n```\n")
