"""The real-width benchmark (cmbench/benchmarks/real_width.py): its phases cut from allocator events, and its
measurement of the Wan path at small widths against `plan` (the same code that meters the 1536-wide DiT)."""

from __future__ import annotations

import pytest

from cmbench.backbones.memory import workspace
from cmbench.benchmarks import real_width
from cmbench.errors import ConfigError

TINY = (("dim", 64), ("ffn_dim", 128), ("num_heads", 2), ("text_dim", 32))
MIB = 2**20


def test_a_phase_is_cut_into_what_calls_hold_and_what_they_hold_for_a_moment():
    # the phase: 0..100; a call 10..40 (an attention call 20..30 inside it), a call 50..80
    events = [(5, 100), (12, 1000), (21, 500), (25, 300), (27, -800), (35, 64), (39, -1000),
              (55, 2000), (60, -2000), (70, 50)]
    ranges = {"call#0": (10, 40), "attend#1": (20, 30), "call#2": (50, 80), "call#3": (200, 300)}
    parts = real_width.phase_bytes(events, ranges, weights=7, phase=(0, 100))
    # held: the most at a call's start or end (100 + 64 after the first, 164 + 50 at the second's end)
    assert parts["held"] == 214
    # the first call peaks at 1900 with 164 held at its end; the second at 2164 with 214 held at its end
    assert parts["activations"] == 2164 - 214
    # the attention call: 1100 at its start, peak 1900, 1100 at its end
    assert parts["attention"] == 800
    assert parts["weights"] == 7 and parts["peak"] == 7 + 2164


def test_a_phase_without_calls_is_an_error():
    with pytest.raises(RuntimeError, match="no DiT or attention call"):
        real_width.phase_bytes([(1, 10)], {"call#0": (5, 6)}, 0, (0, 10))


def test_the_cpu_kernels_buffer_follows_torchs_blocks():
    # 4680 bfloat16 queries over 9360 keys of width 128: blocks of 256 queries x 512 keys per thread
    assert workspace.cpu_kernel(4680, 9360, 128, 2, threads=2) == 2 * (256 * 512 * 6 + 256 * 128 * 4 + 2 * 256 * 4)
    assert workspace.cpu_kernel(100, 40, 32, 4, threads=1) == 32 * 40 * 4 + 32 * 32 * 4 + 2 * 32 * 4


def test_the_attention_workspace_is_the_devices():
    args = dict(queries=4680, history=4680, heads=12, head_dim=128, compute_bytes=2)
    cpu = workspace.attention_call(**args, device="cpu", joined=True)
    cuda = workspace.attention_call(**args, device="cuda", joined=True)
    assert cpu - cuda == workspace.cpu_kernel(4680, 9360, 128, 2)
    assert cuda == 4680 * 12 * 4 + 2 * 9360 * 12 * 128 * 2  # the log-sum-exp and the fork's joined rows
    quantized = workspace.attention_call(**args, device="cuda", decode_rows=1024)
    assert quantized == 2 * 2 * 1024 * 12 * 128 * 2 + 4 * 4680 * 12 * 128 * 4 + 3 * 4680 * 12 * 4


def test_a_case_the_machine_cannot_hold_is_refused_in_one_line_before_anything_is_built():
    plan = real_width.plan_of(real_width.Case(1, "FullKV", dit=TINY, frame=(64, 64), dtype="float32"))
    with pytest.raises(ConfigError) as err:
        real_width.refuse_if_too_big(plan, available=MIB)
    message = str(err.value)
    assert "\n" not in message and "the DiT needs" in message and "1.00 GiB" not in message
    assert "0.00 GiB available" in message and "fewer layers" in message
    real_width.refuse_if_too_big(plan, available=2**40)


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["FullKV", "DeCoPrune@0.85"])
def test_the_wan_path_at_a_small_width_is_what_plan_says(arm):
    """Weights exact; what calls hold, and an attention call's workspace, within the tolerance (or 64 KiB at
    these sizes) of `plan` for the CPU."""
    case = real_width.Case(1, arm, dit=TINY, frame=(64, 64), dtype="float32")
    plan = real_width.plan_of(case)
    rows = real_width.compare(real_width.measure(case, real_width.build_backbone(case)), plan)
    by = {(r.phase, r.part): r for r in rows}
    assert by["prefill", "weights"].measured == by["prefill", "weights"].planned
    for phase in ("prefill", "continuation"):
        for part in ("held", "attention"):
            r = by[phase, part]
            assert r.close, r
    assert by["continuation", "attention"].measured > by["prefill", "attention"].measured  # the fork's join


@pytest.mark.slow
def test_the_script_refuses_a_case_the_machine_cannot_hold_before_building_anything():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "scripts/bench_real_width.py", "--layers", "2000", "--arms", "FullKV",
                           "--out", "/nonexistent/real_width.md"], cwd=repo, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("bench_real_width: self_forcing + fullkv: the DiT needs ") and "available" in line
