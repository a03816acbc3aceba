"""What a calibration shows while it runs: each calibration task of a probe, each probe, and estimates.

A probe is a full generation of the calibration tasks (seconds to minutes each), so a calibration
says where it is inside a probe (``probe 2: task 3/4, 41s, ~14s left in this probe``) and after each
probe its PR, its time and what is left at most (``probe gamma=0.031: PR 0.8473 (55s; at most 12 more
probe(s), ~50s each)``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from cmbench.calibration.target_quantity import PR, TargetQuantity
from cmbench.runs.progress import _duration as duration


class CalibrationProgress:
    """Progress lines of one calibration, written to ``stream`` (default stderr) as it goes.

    Parameters
    ----------
    knob : str
        The knob searched (its name prefixes the probed values).
    max_probes : int
        The most probes the search may take (the bound on what is left).
    stream : text stream, optional
    clock : callable
        Seconds (monotonic); tests pass their own.
    header : str, optional
        A line written before the first probe's first line (not at all when nothing is measured).
    """

    def __init__(self, knob: str, max_probes: int, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, header: str | None = None,
                 quantity: TargetQuantity = PR) -> None:
        self.knob, self.max_probes, self.stream, self.clock, self.header = knob, max_probes, stream, clock, header
        self.quantity = quantity
        self.probes: list[float] = []  # seconds each probe took
        self.started = clock()

    def _line(self, text: str) -> None:
        if self.header is not None:
            text, self.header = f"{self.header}\n{text}", None
        print(text, file=self.stream or sys.stderr, flush=True)

    def task(self, done: int, total: int) -> None:
        """After task ``done`` of ``total`` of the current probe."""
        elapsed = self.clock() - self.started
        left = elapsed / done * (total - done)
        self._line(f"    probe {len(self.probes) + 1}: task {done}/{total}, {duration(elapsed)}"
                   + (f", ~{duration(left)} left in this probe" if done < total else ""))

    def probe(self, value: float, pr: float) -> None:
        """After a probe: its knob value and the mean searched quantity (the PR, or the share of FullKV's
        bytes saved: shown as the bytes ratio)."""
        now = self.clock()
        self.probes.append(now - self.started)
        self.started = now
        left = self.max_probes - len(self.probes)
        self._line(f"  probe {self.knob}={value:.6g}: {self.quantity.text(pr)} ({duration(self.probes[-1])}; at most {left} more "
                   f"probe(s), ~{duration(sum(self.probes) / len(self.probes))} each)")
