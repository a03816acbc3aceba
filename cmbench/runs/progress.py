"""What a running run shows: a progress bar (stderr), or (``progress=false``) a line on stdout every N
tasks or S seconds (a log for batch jobs, kept apart from errors).

Both show the tasks finished of the shard's total (cached ones included), how many were cached and
failed, and the running mean score over every successful task of the shard so far, cached ones
included, so the last value shown is the run's mean.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import TextIO

import numpy as np
from tqdm import tqdm

from cmbench.runs.records import TaskRecord


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Progress of one shard of a run.

    Parameters
    ----------
    name : str
        What is running (the run directory's name).
    total : int
        Tasks of the shard.
    cached : iterable of TaskRecord
        The shard's finished records kept from before (their scores count in the mean).
    bar : bool
        A tqdm bar on ``stream``; False: plain lines.
    every_tasks : int
        Without a bar, a line after every ``every_tasks`` tasks run now ...
    every_seconds : float
        ... or when this many seconds passed since the last line, whichever comes first (checked
        when a task finishes), plus a first and a last line.
    stream : text stream
        Where lines (default: stdout) or the bar (default: stderr) go.
    clock : callable
        Seconds (monotonic); tests pass their own.
    """

    def __init__(self, name: str, total: int, cached: Iterable[TaskRecord], *, bar: bool, every_tasks: int = 10,
                 every_seconds: float = 60.0, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        cached = list(cached)
        self.name, self.total, self.cached = name, total, len(cached)
        self.scores = [float(r.score) for r in cached if r.status == "ok" and r.score is not None]
        self.done = self.failed = 0
        self.every_tasks, self.every_seconds = max(1, int(every_tasks)), float(every_seconds)
        self.stream = stream if stream is not None else (sys.stderr if bar else sys.stdout)
        self.clock = clock
        self.start = self.last_line = clock()
        self.printed_at = -1  # tasks done when the last line was printed
        self.bar = tqdm(total=total, initial=self.cached, unit="task", desc=name, dynamic_ncols=True,
                        file=self.stream) if bar else None
        if self.bar is None:
            self._print(f"{self.total - self.cached} to run, {self.cached} cached")
        else:
            self._postfix()

    @property
    def mean(self) -> float | None:
        """Mean score of every successful task so far (cached ones included)."""
        return float(np.mean(self.scores)) if self.scores else None

    def update(self, record: TaskRecord) -> None:
        """One task finished now."""
        self.done += 1
        if record.status != "ok":
            self.failed += 1
        elif record.score is not None:
            self.scores.append(float(record.score))
        if self.bar is not None:
            self.bar.update(1)
            self._postfix()
        elif self.cached + self.done < self.total and (
                self.done % self.every_tasks == 0 or self.clock() - self.last_line >= self.every_seconds):
            self._print()  # the last task's line is printed by close, always ending "; done"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.printed_at != self.done:
            self._print("done")

    def line(self) -> str:
        """The status line: counts, running mean, time per task and what is left."""
        mean = "-" if self.mean is None else f"{self.mean:.4f}"
        elapsed = self.clock() - self.start
        text = (f"{self.name}: {self.cached + self.done}/{self.total} tasks ({self.cached} cached, "
                f"{self.failed} failed), mean score {mean}")
        if self.done:
            per_task = elapsed / self.done
            left = self.total - self.cached - self.done
            text += f", {per_task:.1f} s/task, {_duration(elapsed)} elapsed, ~{_duration(per_task * left)} left"
        return text

    def _postfix(self) -> None:
        assert self.bar is not None
        self.bar.set_postfix(cached=self.cached, failed=self.failed,
                             mean="-" if self.mean is None else f"{self.mean:.4f}")

    def _print(self, note: str = "") -> None:
        print(self.line() + (f"; {note}" if note else ""), file=self.stream, flush=True)
        self.last_line, self.printed_at = self.clock(), self.done
