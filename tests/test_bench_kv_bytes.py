"""The KV-bytes benchmark's arithmetic: peaks of allocator events in windows, ratios to FullKV per task,
the CPU meter on real tensors, and an arm metered end to end on the tiny model."""

from __future__ import annotations

import pytest
import torch

from cmbench.api import compose_config
from cmbench.benchmarks.kv_bytes import Arm, CpuMeter, TaskBytes, measure_arm, summarise, window_peaks
from cmbench.data import load_manifest
from cmbench.data.adapter import build_adapter
from cmbench.spec import resolve_run
from test_run_command import SMALL_SUITE
from test_tiny_backbone import random_model

MIB = 2**20


def test_window_peaks_count_from_zero_and_keep_the_highest_level_inside_each_window():
    # +10 at t=1, +5 at t=3 (inside a), -8 at t=4 (inside a), +20 at t=6, -20 at t=7 (inside b); given unordered
    events = [(4, -8), (1, 10), (7, -20), (3, 5), (6, 20)]
    peaks = window_peaks(events, {"a": (2, 5), "b": (6, 9), "quiet": (8, 9)})
    assert peaks["a"] == (10, 15)
    assert peaks["b"] == (7, 27)  # the allocation at the window's first instant counts
    assert peaks["quiet"] == (7, 7)  # no event inside: the level held is the peak


def test_window_peaks_count_the_event_at_the_window_end():
    assert window_peaks([(1, 4), (5, 6)], {"w": (2, 5)}) == {"w": (4, 10)}


def _row(arm, task, nominal, measured, pr=0.0, start=0, store=0, prefill=1):
    return TaskBytes(arm, task, pr, nominal, measured, start, store, prefill)


def test_summarise_takes_each_tasks_ratio_to_fullkvs_before_the_mean():
    rows = [_row("fullkv", "t1", 100 * MIB, 200 * MIB, prefill=50 * MIB),
            _row("fullkv", "t2", 300 * MIB, 400 * MIB, prefill=500 * MIB),
            _row("kivi", "t1", 20 * MIB, 180 * MIB, pr=0.1, start=4 * MIB, store=MIB, prefill=40 * MIB),
            _row("kivi", "t2", 30 * MIB, 100 * MIB, pr=0.3, start=8 * MIB, store=3 * MIB, prefill=100 * MIB)]
    ref, kivi = summarise(rows)
    assert (ref.arm, ref.nominal_ratio, ref.measured_ratio) == ("fullkv", 1.0, 1.0)
    assert kivi.tasks == 2
    assert kivi.nominal_ratio == pytest.approx((0.2 + 0.1) / 2)  # not (20 + 30) / (100 + 300)
    assert kivi.measured_ratio == pytest.approx((0.9 + 0.25) / 2)
    assert (kivi.pr, kivi.nominal_mb, kivi.measured_mb) == pytest.approx((0.2, 25.0, 140.0))
    assert (kivi.start_mb, kivi.store_mb, kivi.transient_mb) == pytest.approx((6.0, 2.0, 115.0))
    assert (ref.prefill_ratio, kivi.prefill_mb) == pytest.approx((1.0, 70.0))
    assert kivi.prefill_ratio == pytest.approx((0.8 + 0.2) / 2)  # not (40 + 100) / (50 + 500)


def test_summarise_refuses_a_task_fullkv_did_not_run():
    rows = [_row("fullkv", "t1", 100, 200), _row("streaming", "t2", 10, 50)]
    with pytest.raises(ValueError, match="streaming: no fullkv bytes on task t2"):
        summarise(rows)


def test_summarise_refuses_a_fullkv_prefill_peak_of_zero():
    rows = [_row("fullkv", "t1", 100, 200, prefill=0), _row("kivi", "t1", 10, 50)]
    with pytest.raises(ValueError, match="^fullkv: no fullkv bytes on task t1 to take its ratio against$"):
        summarise(rows)


def test_cpu_meter_sees_a_transient_buffer_and_the_memory_held_from_before_the_window():
    meter = CpuMeter()
    with meter.session():
        held = torch.ones(1024, 256)  # 1 MiB, allocated in the session before the window
        with meter.window("w"):
            scratch = torch.ones(4 * 1024, 256)  # 4 MiB built and dropped inside the window
            del scratch
            kept = torch.ones(1024, 256)
        del held, kept
    start, peak = meter.peaks["w"]
    assert start == MIB
    assert peak == 5 * MIB


def test_an_arm_is_metered_in_its_prefill_and_in_each_continuation(tmp_path):
    """measure_arm on the tiny model (one task of a small MiniWorld suite): every row has a prefill peak,
    which holds at least the prefilled cache the continuation then starts from; FullKV in KIVI-4 stores,
    holds and prefills less than FullKV on the same task."""
    weights = tmp_path / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)

    def arm(*extra: str) -> Arm:
        spec = resolve_run(compose_config("fullkv", [f"data.root={tmp_path / 'suite'}", *SMALL_SUITE,
                                                     f"backbone.path={weights}", "save_videos=false",
                                                     "progress=false", *extra]))
        return Arm(spec.identity.label, spec)

    full = arm()
    build_adapter(full.spec.data.config).ensure()
    tasks = load_manifest(str(full.spec.data.root), full.spec.data.manifest)[:1]
    rows = [*measure_arm(full, [tasks]), *measure_arm(arm("storage=kivi", "storage.bits=4"), [tasks])]
    assert [r.arm for r in rows] == ["fullkv", "fullkv+kivi4-g32-r128"]
    for r in rows:
        assert r.task_id == tasks[0].task_id
        assert r.prefill >= r.start > 0 and r.measured >= r.start
    ref, kivi = summarise(rows)
    assert kivi.nominal_ratio < 0.3 and kivi.measured_ratio < 1 and kivi.prefill_ratio < 1
