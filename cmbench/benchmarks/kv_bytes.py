"""Nominal against measured KV bytes: the ledger's count beside the memory a continuation really takes.

The PR ledger (:mod:`cmbench.cache.ledger`) counts the bytes a cache *stores*; it cannot see what the
attention path builds for a moment (a block of a quantized bank's history decoded for attention,
a history copied beside the chunk, a compaction's gather next to its source). This benchmark runs each
arm (a method, optionally in a storage format) through the run path of ``python -m cmbench run``
(:class:`cmbench.runs.evaluator.ModelEvaluator`: the context read and encoded, prefilled, one
continuation per task) and, for every task, sets two numbers side by side, each as a ratio against
FullKV's on the same task in the same run:

nominal
    The continuation ledger's peak stored bytes (``peak_stored_bytes``).
measured
    The peak of tensor memory held during the continuation, counted from just before the context's
    prefill: the prefilled cache the continuation starts from, everything the continuation allocates,
    and every transient. Weights and what was built before the prefill are not counted.
prefill
    The peak of tensor memory held while the task's context is read, encoded and prefilled (the cache as
    it grows, the model's activations, the method's decisions and the temporal re-index), counted from the
    same point: a step that rebuilds a full-precision history there shows in it.

Meters: on CUDA, ``torch.cuda.max_memory_allocated`` over ``memory_allocated`` before the prefill; on
the CPU, every allocation and free of torch's CPU allocator recorded by the profiler
(``profile_memory=True``) from before the prefill, summed in order (:func:`window_peaks`); a free of a
tensor allocated before the recording started is invisible to it, so the recording starts before the
prefill. On the CPU the host store of a retrieval method is the same memory, so its measured peak holds
the store as well (its peak is a column of its own); on a GPU the store is host memory and is not
counted.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from cmbench.data import Task
from cmbench.hashing import task_seed
from cmbench.runs.evaluator import ModelEvaluator
from cmbench.spec import RunSpec

REFERENCE = "fullkv"
"""The arm every ratio is taken against."""
WINDOW = "cmbench.kv_bytes:"
"""The profiler range names of the measured windows (followed by the window's key)."""
PREFILL = "prefill of "
"""The key of a context's prefill window: this, then the context id (a task's window is its task id)."""


@dataclass(frozen=True)
class Arm:
    """One row of the benchmark: a label and the resolved run it measures."""

    label: str
    spec: RunSpec


@dataclass(frozen=True)
class TaskBytes:
    """One arm on one task.

    Attributes
    ----------
    arm, task_id : str
    pr : float
        The continuation's pruning ratio.
    nominal : int
        The continuation ledger's peak stored bytes.
    measured : int
        Peak tensor bytes held during the continuation, counted from before the prefill.
    start : int
        Of those, the bytes already held when the continuation started (the prefilled context).
    store : int
        The ledger's peak bytes in a host store (0 without one).
    prefill : int
        Peak tensor bytes held while the task's context was read, encoded and prefilled, counted from
        before it (the same for every task of a context).
    """

    arm: str
    task_id: str
    pr: float
    nominal: int
    measured: int
    start: int
    store: int
    prefill: int


def window_peaks(events: Sequence[tuple[int, int]], windows: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """The level at the start and the peak of the memory held inside each window, from allocator events.

    Parameters
    ----------
    events : sequence of ``(time, bytes)``
        Every allocation (``bytes > 0``) and free (``bytes < 0``) since the level was 0, in any order.
    windows : dict ``key -> (start, end)``
        Time ranges, in the events' clock (``end`` included).

    Returns
    -------
    dict ``key -> (start level, peak)``: the sum of the events before ``start``, and the highest running
    sum from ``start`` to ``end`` (at least the start level).
    """
    ordered = sorted(events)
    out = {}
    for key, (start, end) in windows.items():
        before = sum(b for t, b in ordered if t < start)
        level = peak = before
        for t, b in ordered:
            if start <= t <= end:
                level += b
                peak = max(peak, level)
        out[key] = (before, peak)
    return out


class CpuMeter:
    """Peaks of torch's CPU tensor memory in named windows, from the profiler's allocator events."""

    def __init__(self) -> None:
        self.peaks: dict[str, tuple[int, int]] = {}

    @contextmanager
    def session(self) -> Iterator[None]:
        """Record every allocation and free inside the block; the windows' peaks are ready after it."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield
        events, windows = [], {}
        for e in prof.profiler.kineto_results.events():
            name = e.name()
            if name == "[memory]" and e.device_type() == DeviceType.CPU:
                events.append((e.start_ns(), e.nbytes()))
            elif name.startswith(WINDOW):
                windows[name[len(WINDOW):]] = (e.start_ns(), e.end_ns())
        self.peaks.update(window_peaks(events, windows))

    @contextmanager
    def window(self, key: str) -> Iterator[None]:
        """A measured window inside :meth:`session`."""
        with torch.profiler.record_function(WINDOW + key):
            yield


class CudaMeter:
    """Peaks of CUDA tensor memory in named windows, from the caching allocator's counters."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peaks: dict[str, tuple[int, int]] = {}
        self.base = 0

    @contextmanager
    def session(self) -> Iterator[None]:
        """Count from the memory allocated when the block starts."""
        torch.cuda.synchronize(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        yield

    @contextmanager
    def window(self, key: str) -> Iterator[None]:
        """A measured window inside :meth:`session`: the level at its start and the allocator's peak in it."""
        torch.cuda.synchronize(self.device)
        start = torch.cuda.memory_allocated(self.device) - self.base
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        torch.cuda.synchronize(self.device)
        self.peaks[key] = (start, torch.cuda.max_memory_allocated(self.device) - self.base)


def meter_for(device: str) -> CpuMeter | CudaMeter:
    """The meter of a backbone's ``device`` (``cpu``, ``cuda``, ``cuda:1``)."""
    dev = torch.device(device)
    return CudaMeter(dev) if dev.type == "cuda" else CpuMeter()


def measure_arm(arm: Arm, contexts: Sequence[Sequence[Task]]) -> list[TaskBytes]:
    """Run ``arm`` on every task of ``contexts`` (tasks grouped by context, as a run groups them).

    Each context is read, encoded and prefilled inside the meter's session, in a window of its own; each
    task's continuation is one window.
    """
    evaluator = ModelEvaluator.from_spec(arm.spec)
    meter = meter_for(str(arm.spec.backbone.get("device", "cpu")))
    seed = arm.spec.selection.seed
    ledgers = {}
    for tasks in contexts:
        with meter.session():
            with meter.window(PREFILL + tasks[0].context_id):
                prepared = evaluator.prepare(list(tasks))
            for task in tasks:
                with meter.window(task.task_id):
                    _, cont, _ = evaluator.generate(task, prepared, task_seed(seed, task.task_id))
                ledgers[task.task_id] = cont.ledger
                del cont
            del prepared
    out = []
    for tasks in contexts:
        for task in tasks:
            ledger = ledgers[task.task_id]
            start, peak = meter.peaks[task.task_id]
            out.append(TaskBytes(arm.label, task.task_id, ledger.pruning_ratio(), ledger.peak_stored_bytes, peak,
                                 start, ledger.peak_store_bytes, meter.peaks[PREFILL + task.context_id][1]))
    return out


@dataclass
class ArmSummary:
    """One arm over the tasks: means of per-task values and of per-task ratios to FullKV's."""

    arm: str
    tasks: int
    pr: float
    nominal_mb: float
    measured_mb: float
    start_mb: float
    store_mb: float
    nominal_ratio: float
    measured_ratio: float
    transient_mb: float
    prefill_mb: float
    prefill_ratio: float


def summarise(rows: Sequence[TaskBytes], reference: str = REFERENCE) -> list[ArmSummary]:
    """Per arm, in first-seen order: mean PR and bytes (MiB) over its tasks, and the mean over tasks of
    its nominal and measured bytes each divided by the reference's on the same task.

    ``transient_mb`` is the mean of ``measured - nominal``: what the continuation held beyond the bytes
    the ledger counts (activations, attention workspaces, decoded or copied history). ``prefill_ratio``
    is the mean of the prefill peak over the reference's, per task, as the other ratios.

    Raises
    ------
    ValueError
        A task of an arm that the reference did not run, or whose reference bytes are 0.
    """
    ref = {r.task_id: r for r in rows if r.arm == reference}
    by_arm: dict[str, list[TaskBytes]] = {}
    for r in rows:
        by_arm.setdefault(r.arm, []).append(r)
    mib = 2.0**20
    out = []
    for arm, mine in by_arm.items():
        missing = [r.task_id for r in mine if r.task_id not in ref or not ref[r.task_id].nominal
                   or not ref[r.task_id].measured or not ref[r.task_id].prefill]
        if missing:
            raise ValueError(f"{arm}: no {reference} bytes on task {missing[0]} to take its ratio against")
        out.append(ArmSummary(
            arm=arm, tasks=len(mine),
            pr=statistics.fmean(r.pr for r in mine),
            nominal_mb=statistics.fmean(r.nominal for r in mine) / mib,
            measured_mb=statistics.fmean(r.measured for r in mine) / mib,
            start_mb=statistics.fmean(r.start for r in mine) / mib,
            store_mb=statistics.fmean(r.store for r in mine) / mib,
            nominal_ratio=statistics.fmean(r.nominal / ref[r.task_id].nominal for r in mine),
            measured_ratio=statistics.fmean(r.measured / ref[r.task_id].measured for r in mine),
            transient_mb=statistics.fmean(r.measured - r.nominal for r in mine) / mib,
            prefill_mb=statistics.fmean(r.prefill for r in mine) / mib,
            prefill_ratio=statistics.fmean(r.prefill / ref[r.task_id].prefill for r in mine)))
    return out

