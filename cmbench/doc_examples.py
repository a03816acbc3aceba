"""Runnable pages: the files and shell sessions a markdown page prints, run exactly as printed.

A page marks a file it prints with ``<!-- file: PATH -->`` on the line right before the fenced block
that holds it, and shows shell sessions in fenced ``console`` blocks: ``$ command`` lines, each followed
by the output that command printed. :func:`run_session` writes the files into a folder and runs every
command there, in page order, in one bash session (so ``export`` carries over), capturing each
command's output and exit status. :func:`stable` masks what changes from one run to the next (timings,
measured FPS, config hashes), so a page's printed output can be compared with a fresh run's, and
:func:`with_outputs` writes fresh outputs into the page (``scripts/update_doc_examples.py``).
:func:`task_seconds` reads the seconds per task of the runs a page's commands made, and
:func:`timings_paragraph` is the README's sentence of them, between :data:`TIMINGS_MARKERS`.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

FILE_MARK = re.compile(r"^<!-- file: (\S+) -->$")
FENCE = re.compile(r"^```(\S*)$")
PROMPT = "$ "
MARKER = "@@cmbench-doc-command"

# (pattern, replacement) for what differs between two runs of the same commands
VOLATILE = [
    (re.compile(r"\d+(\.\d+)? s/task"), "<t> s/task"),
    (re.compile(r"(\d+[hm])?\d+[ms] elapsed"), "<t> elapsed"),
    (re.compile(r"~(\d+[hm])?\d+[ms] left"), "~<t> left"),
    (re.compile(r"(task \d+/\d+), (\d+[hm])?\d+[ms]\b"), r"\1, <t>"),  # a calibration probe's tasks
    (re.compile(r"\((\d+[hm])?\d+[ms]; at most"), "(<t>; at most"),  # ... and the probe
    (re.compile(r"~(\d+[hm])?\d+[ms] each\)"), "~<t> each)"),
    (re.compile(r"[\d.]+ MB, [\d.]+ s\)"), "<size> MB, <t> s)"),
    (re.compile(r"__[0-9a-f]{10}\b"), "__<hash>"),
]
VOLATILE_COLUMNS = ("FPS speed-up", "FPS")  # measured speed in markdown tables
# a run's progress line between its first ("N to run") and its last ("; done"): printed every
# ``progress_seconds``, so how many there are depends on the machine's speed
INTERIM_PROGRESS = re.compile(r"^\S+: \d+/\d+ tasks \(\d+ cached, \d+ failed\), mean score \S+, .* left$")
# a run's last progress line when it ran every task (none cached): its run directory's method and seconds per task
RAN_ALL = re.compile(r"^(?P<method>\S+?)__\S+: (?P<n>\d+)/(?P=n) tasks \(0 cached, 0 failed\), mean score \S+, "
                     r"(?P<seconds>[\d.]+) s/task, .*; done$")
TIMINGS_MARKERS = ("<!-- timings -->", "<!-- /timings -->")


@dataclass(frozen=True)
class PrintedFile:
    """A file the page prints: its path relative to the user's folder and its text."""

    path: str
    text: str


@dataclass(frozen=True)
class Command:
    """A ``$ command`` line of a console block and the output printed under it.

    ``lines`` is the half-open range of page lines (0-based) holding that output.
    """

    line: str
    output: str
    lines: tuple[int, int]


@dataclass(frozen=True)
class Page:
    files: list[PrintedFile]
    commands: list[Command]


@dataclass(frozen=True)
class Result:
    """What one command printed (stdout and stderr together) and its exit status."""

    command: str
    output: str
    status: int


def parse(text: str, name: str = "page") -> Page:
    """The printed files and console commands of a markdown page, in page order.

    Raises
    ------
    ValueError
        A fence left open, a file marked twice, or console output before the first command, naming
        ``name`` and the line.
    """
    lines = text.splitlines()
    files: list[PrintedFile] = []
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        if end is None:
            raise ValueError(f"{name}:{i + 1}: code block never closed")
        mark = FILE_MARK.match(lines[i - 1]) if i else None
        if mark:
            if any(f.path == mark.group(1) for f in files):
                raise ValueError(f"{name}:{i}: file {mark.group(1)} is printed twice")
            files.append(PrintedFile(mark.group(1), "\n".join(lines[i + 1:end]) + "\n"))
        elif fence.group(1) == "console":
            commands += _commands(lines, i + 1, end, name)
        i = end + 1
    return Page(files, commands)


def _commands(lines: list[str], start: int, end: int, name: str) -> list[Command]:
    starts = [j for j in range(start, end) if lines[j].startswith(PROMPT)]
    if start < end and (not starts or starts[0] != start):
        raise ValueError(f"{name}:{start + 1}: a console block must start with a '{PROMPT}command' line")
    bounds = [*starts[1:], end]
    return [Command(lines[s][len(PROMPT):], "\n".join(lines[s + 1:e]), (s + 1, e)) for s, e in zip(starts, bounds)]


def write_files(page: Page, folder: Path) -> None:
    """Write the page's printed files into ``folder``, exactly as printed."""
    for printed in page.files:
        path = folder / printed.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(printed.text)


def run_session(page: Page, folder: Path, python: str, pythonpath: str = "", timeout: float = 1800) -> list[Result]:
    """Write the page's files into ``folder`` and run its commands there in one bash session.

    Parameters
    ----------
    page : the parsed page
    folder : the user's folder (created if missing)
    python : the interpreter that ``python`` on the page runs (e.g. ``sys.executable``)
    pythonpath : appended to whatever ``PYTHONPATH`` the page exports (where ``cmbench`` is imported
        from when it is not installed in ``python``'s environment)
    timeout : seconds for the whole session

    Returns
    -------
    One Result per command, in page order (fewer when the session stopped early).
    """
    folder.mkdir(parents=True, exist_ok=True)
    write_files(page, folder)
    with tempfile.TemporaryDirectory(prefix="cmbench-doc-bin-") as bin_dir:
        wrapper = Path(bin_dir) / "python"
        extra = f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{pythonpath}" ' if pythonpath else ""
        wrapper.write_text(f'#!/bin/sh\n{extra}exec "{python}" "$@"\n')
        wrapper.chmod(0o755)
        script = ["exec 2>&1", "set -o pipefail"]
        for n, command in enumerate(page.commands):
            script += [f"printf '\\n{MARKER} {n}\\n'", command.line, f"printf '\\n{MARKER} status %s\\n' $?"]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CMBENCH_CONFIG_PATH")}
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=folder, env=env, stdout=subprocess.PIPE,
                              text=True, timeout=timeout, check=False)
    return _split(done.stdout, page.commands)


def _split(stdout: str, commands: list[Command]) -> list[Result]:
    results = []
    parts = re.split(rf"\n?{MARKER} (\d+)\n", stdout)[1:]
    for number, body in zip(parts[::2], parts[1::2]):
        output, _, status = body.rpartition(f"\n{MARKER} status ")
        results.append(Result(commands[int(number)].line, output.rstrip("\n"), int(status.strip() or -1)))
    return results


def stable(output: str) -> list[str]:
    """``output``'s lines with what varies between runs masked (timings, measured FPS, config hashes), and
    a run's interim progress lines (:data:`INTERIM_PROGRESS`) left out.

    In markdown tables, the cells under :data:`VOLATILE_COLUMNS` headers become ``<measured>``.
    """
    out: list[str] = []
    header: list[str] = []
    for line in output.rstrip("\n").splitlines():
        line = line.rstrip()
        if INTERIM_PROGRESS.match(line):
            continue
        for pattern, replacement in VOLATILE:
            line = pattern.sub(replacement, line)
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not out or not out[-1].startswith("|"):
                header = cells
            elif not set(line) <= set("|-: "):
                cells = ["<measured>" if i < len(header) and header[i] in VOLATILE_COLUMNS else c
                         for i, c in enumerate(cells)]
            line = "| " + " | ".join(cells) + " |"
        out.append(line)
    return out


def with_outputs(text: str, page: Page, results: list[Result]) -> str:
    """``text`` with each command's printed output replaced by what ``results`` say it printed."""
    lines = text.splitlines()
    for command, result in sorted(zip(page.commands, results), key=lambda cr: -cr[0].lines[0]):
        start, end = command.lines
        lines[start:end] = result.output.splitlines()
    return "\n".join(lines) + "\n"


def task_seconds(outputs: list[str]) -> dict[str, float]:
    """Seconds per task of each method's first run that computed every task of its selection, from the
    progress lines (``progress=false``) of ``outputs``, keyed by the method its run directory names."""
    seconds: dict[str, float] = {}
    for output in outputs:
        for line in output.splitlines():
            ran = RAN_ALL.match(line.rstrip())
            if ran:
                seconds.setdefault(ran.group("method"), float(ran.group("seconds")))
    return seconds


def timings_paragraph(seconds: dict[str, float], load: float, cores: int, tasks: int = 116, width: int = 104) -> str:
    """The README's time per task: DeCoPrune's and FullKV's seconds per task (:func:`task_seconds` of
    docs/writing_a_method.md) with the machine's 15-minute load average and cores when measured, and
    what DeCoPrune's ``tasks`` take at that pace, wrapped at ``width`` columns.

    Raises
    ------
    KeyError
        No DeCoPrune or FullKV run among ``seconds``.
    """
    deco, full = seconds["decoprune"], seconds["fullkv"]
    return textwrap.fill(
        f"On one CPU thread (`threads=1`, the default) a task takes about {deco:.1f} s with DeCoPrune and "
        f"{full:.1f} s with FullKV (the runs of docs/writing_a_method.md, DeCoPrune at PR 80%, measured by "
        f"`scripts/update_doc_examples.py` on {cores} cores at a 15-minute load average of {load:.1f}; a "
        f"loaded machine is slower), so DeCoPrune's {tasks} tasks take roughly {tasks * deco / 60:.0f} "
        f"minutes; a rerun skips finished tasks, and `limit=8` is a one-minute look.",
        width, break_long_words=False, break_on_hyphens=False)


def with_timings(text: str, paragraph: str) -> str:
    """``text`` (the README) with the paragraph between :data:`TIMINGS_MARKERS` replaced.

    Raises
    ------
    ValueError
        ``text`` has no such section.
    """
    start, end = TIMINGS_MARKERS
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} section")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{paragraph}\n{end}{rest.split(end, 1)[1]}"
