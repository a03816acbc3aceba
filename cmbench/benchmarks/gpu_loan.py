"""The parts of the one GPU check (``scripts/gpu_check.py``) that a short GPU loan needs beyond (a)-(c) of
:mod:`cmbench.benchmarks.gpu_check`, each judged against what is committed beside the script
(``scripts/gpu_check_expected.json``), so a loan gives pass or fail without recomputing anything on a CPU:

(e) **real width**: the Self-Forcing DiT (Wan2.1-T2V-1.3B, 1536 wide) at 1, 2 and 4 layers with random weights,
    FullKV, DeCoPrune and FullKV in KIVI-4, metered on the device (:mod:`cmbench.benchmarks.real_width`, the
    CUDA caching allocator's events) beside ``plan`` for that device, and that plan beside the committed one;
(f) **quantized attention time**: one attention call over LingBot World v2 1.3B's one-minute history (244
    latent frames of 1560 tokens, a chunk of 6240 queries) with the history in KIVI-4 against full precision
    at the same tokens (target: within :data:`KIVI_TIME_TARGET`), and block attention on the device's fused
    kernels equal to one SDPA call;
(g) **the scorer's self-check** (:func:`cmbench.benchmarks.scorer_check.run_check` with tiny random models:
    the device preprocessing against transformers' / PIL's, fp32 against bf16);
(h) **MiniWorld**: DeCoPrune on two tasks of a small MiniWorld suite with the tiny model on the device, its
    records (score, PR) equal to the committed CPU records within :data:`SCORE_TOLERANCE` and
    :data:`PR_TOLERANCE`.

``tiny`` runs the same code on the CPU at small shapes (a test runs it); there (e) compares with the CPU plan,
(f) is reported, not asserted, and (h) must equal the committed CPU records within the same tolerances.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cmbench.benchmarks import real_width

EXPECTED = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check_expected.json"
"""The committed expectations: ``plan`` per real-width case and device, and the MiniWorld CPU records."""
KIVI_TIME_TARGET = 1.3
SCORE_TOLERANCE = 0.02
PR_TOLERANCE = 0.01
SMALL_WIDTH = (("dim", 64), ("ffn_dim", 128), ("num_heads", 2), ("text_dim", 32))
MINIWORLD = ["data.clip_frames=24", "data.min_absence_frames=16", "data.sources.synthetic.videos=2",
             "data.sources.synthetic.reappear=2", "data.sources.synthetic.revisit=1", "data.sources.real.videos=1",
             "data.sources.real.reappear=1", "data.sources.real.revisit=0"]
"""A small MiniWorld suite (3 contexts, 4 tasks); the check runs its first two tasks."""
MINIWORLD_TASKS = 2


def real_width_cases(tiny: bool, device: str) -> list[real_width.Case]:
    """(e)'s cases: 1, 2 and 4 layers of the real width on ``device`` (tiny: 1 and 2 layers at a small width and
    frame, float32, on the CPU)."""
    if tiny:
        return [real_width.Case(n, arm, dtype="float32", device="cpu", dit=SMALL_WIDTH, frame=(64, 64))
                for n in (1, 2) for arm in real_width.ARMS]
    return [real_width.Case(n, arm, device=device) for n in (1, 2, 4) for arm in real_width.ARMS]


def case_key(case: real_width.Case) -> str:
    return f"{case.device}/{case.layers}/{case.arm}" + ("/small" if case.dit else "")


def expected_plans(cases: list[real_width.Case]) -> dict[str, dict[str, dict[str, int]]]:
    """``plan``'s DiT parts per phase for each case (what ``--write-expected`` commits)."""
    return {case_key(c): real_width.dit_parts(real_width.plan_of(c)) for c in cases}


def load_expected(path: Path = EXPECTED) -> dict[str, Any]:
    """The committed expectations (``scripts/gpu_check.py --write-expected`` writes them)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (python scripts/gpu_check.py --write-expected writes it)")
    return json.loads(path.read_text())


def check_real_width(report, tiny: bool, device: str, expected: dict[str, Any]) -> None:
    """(e): each case's plan equal to the committed one, and its measured parts beside it.

    Asserted: the weights, and what calls hold of a full-precision cache, within the benchmark's tolerance; a
    full-precision phase's peak not above the plan's (the plan must not under-predict). Reported: activations
    and the attention workspace (the activations' coefficients were fitted at small widths and the CPU measures
    0.75 of them at the real width: results/real_width.md), and what calls hold and the peak of a KIVI cache (a
    quantized bank keeps its full-precision chunk slot after the chunk is committed, which the replay does not
    count). At tiny shapes a part may also miss by :data:`~cmbench.benchmarks.real_width.SLACK` bytes.
    """
    backbones: dict[int, Any] = {}
    for case in real_width_cases(tiny, device):
        key = case_key(case)
        plan = real_width.plan_of(case)
        planned = real_width.dit_parts(plan)
        report.add("e", f"{key}: plan as committed", 0.0, "equal", planned == expected["plans"].get(key))
        if case.layers not in backbones:
            backbones.clear()
            backbones[case.layers] = real_width.build_backbone(case)
        measured = real_width.measure(case, backbones[case.layers])
        quantized = "KIVI" in case.arm
        for row in real_width.compare(measured, plan):
            name = f"{key} {row.phase} {row.part} (measured / plan)"
            bound = f"1 +- {real_width.TOLERANCE:g}" + (" or 64 KiB" if tiny else "")
            if row.part == "weights" or (row.part == "held" and not quantized):
                report.add("e", name, row.ratio, bound, row.close if tiny else row.within)
            elif row.part == "peak":
                under = row.measured <= row.planned + (real_width.SLACK if tiny else 0)
                report.add("e", name, row.ratio, "<= 1" + (" + 64 KiB" if tiny else ""), under, asserted=not quantized)
            else:
                report.add("e", name, row.ratio, bound, row.close if tiny else row.within, asserted=False)
    backbones.clear()


def lingbot_history(tiny: bool):
    """(f)'s geometry and history frames: LingBot World v2 1.3B's and its one-minute context (tiny: the tiny
    model's, 48 frames)."""
    from cmbench.backbones.memory.run_plan import geometry_of
    from cmbench.backbones.tiny import TinyWorldModel
    from cmbench.backbones.wan.timeline import prepared_length

    if tiny:
        return TinyWorldModel.from_pretrained().geometry, 48
    g = geometry_of(real_width.backbone_config("lingbot_world_v2_1_3b"))
    return g, prepared_length(16 * 60, 16.0, 16.0, g.chunk_frames, 4)[1] // g.chunk_frames * g.chunk_frames


def check_quantized_attention(report, tiny: bool, device: str, rounds: int = 5) -> None:
    """(f): median seconds of one attention call over the history in KIVI-4 against full precision, and block
    attention on the device's kernels against one SDPA call."""
    from cmbench.benchmarks.kv_formats import filled
    from cmbench.cache import block_attention
    from cmbench.cache.quantized import StorageFormat

    g, frames = lingbot_history(tiny)
    dtype = torch.float32 if tiny else torch.bfloat16
    seconds = {}
    for name, fmt in (("full precision", StorageFormat()), ("KIVI-4", StorageFormat("kivi", bits=4, group_size=32,
                                                                                    residual=128))):
        cache, (q, k, v) = filled(fmt, frames, geometry=g, device=device, dtype=dtype)
        cache.attend(0, q, k, v)  # warm-up
        times = []
        for _ in range(rounds):
            _sync(device)
            start = time.perf_counter()
            cache.attend(0, q, k, v)
            _sync(device)
            times.append(time.perf_counter() - start)
        seconds[name] = statistics.median(times)
        del cache, q, k, v
    ratio = seconds["KIVI-4"] / seconds["full precision"]
    report.say(f"[f] one attention call over {frames} latent frames ({frames * g.tokens_per_frame} tokens) of "
               f"history, {g.tokens_per_chunk} queries: full precision {seconds['full precision'] * 1e3:.1f} ms, "
               f"KIVI-4 {seconds['KIVI-4'] * 1e3:.1f} ms")
    report.add("f", "KIVI-4 / full-precision attention time", ratio, f"<= {KIVI_TIME_TARGET:g}",
               ratio <= KIVI_TIME_TARGET, asserted=not tiny)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, g.num_heads, g.head_dim, generator=gen).to(device=device, dtype=dtype)
               for n in (97, 300, 300))
    bias = torch.randn(300, generator=gen).to(device)
    for biased in (False, True):
        got = block_attention.attention(q, [(k[:, :37], v[:, :37]), (k[:, 37:], v[:, 37:])], bias if biased else None)
        mask = None if not biased else bias.to(dtype).expand(1, g.num_heads, 97, 300)
        want = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask).transpose(1, 2)
        err = float((got.float() - want.float()).abs().max())
        kernel = block_attention.kernel(torch.device(device), dtype, g.head_dim, biased)
        report.add("f", f"block attention ({kernel} kernel{', bias' if biased else ''}) vs one SDPA call, max abs",
                   err, "<= 2e-2" if dtype == torch.bfloat16 else "<= 1e-5",
                   err <= (2e-2 if dtype == torch.bfloat16 else 1e-5))


def check_scorer(report, tiny: bool, device: str) -> None:
    """(g): the scorer's self-check with tiny random models on the device (what needs real weights is reported
    by ``scripts/gpu_check_scorer.py`` given the weights)."""
    from cmbench.benchmarks.scorer_check import run_check, tiny_config

    with tempfile.TemporaryDirectory() as tmp:
        checks = run_check(tiny_config(Path(tmp)), device, tiny=True, n_frames=4, rounds=1)
    for c in checks.checks:
        report.add("g", c.name, c.value, c.bound, c.passed, asserted=c.asserted)


def miniworld_records(device: str, folder: Path) -> list[dict[str, Any]]:
    """(h)'s run: DeCoPrune on the small suite's first tasks with the tiny model on ``device`` (the suite built
    under ``folder``), each task's id, score and PR."""
    from hydra import compose, initialize_config_dir

    from cmbench.config_paths import CONFIG_DIR, knob_overrides
    from cmbench.runs.experiment import run_experiment
    from cmbench.runs.records import RECORDS, read_records_file
    from cmbench.spec import resolve_run

    overrides = ["method=decoprune", f"limit={MINIWORLD_TASKS}", f"out_dir={folder / 'runs'}", "progress=false",
                 f"data.root={folder / 'suite'}", *MINIWORLD, f"backbone.device={device}"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=knob_overrides(overrides))
    done = run_experiment(resolve_run(cfg))
    records = [r for r, _ in read_records_file(done.run_dir / RECORDS)]
    nan = float("nan")  # a failed task has no score: its difference fails the check
    return [{"task_id": r.task_id, "score": nan if r.score is None else float(r.score),
             "pr": nan if r.pr is None else float(r.pr)} for r in records]


def check_miniworld(report, device: str, folder: Path, expected: dict[str, Any]) -> None:
    """(h): the device's records against the committed CPU records."""
    reference = {r["task_id"]: r for r in expected["miniworld"]}
    records = miniworld_records(device, folder)
    report.add("h", "tasks run = committed tasks", float(len(records)), str(len(reference)),
               {r["task_id"] for r in records} == set(reference))
    for r in records:
        ref = reference.get(r["task_id"])
        if ref is None:
            continue
        for key, tol in (("score", SCORE_TOLERANCE), ("pr", PR_TOLERANCE)):
            diff = abs(r[key] - ref[key])
            report.add("h", f"{r['task_id']} {key} vs CPU record (abs)", diff, f"<= {tol:g}", diff <= tol)


def write_expected(path: Path, device: str = "cuda") -> dict[str, Any]:
    """Compute and write what the check compares with: the plans of both forms' real-width cases and the CPU
    records of the MiniWorld run (run on this machine's CPU)."""
    cases = real_width_cases(False, device) + real_width_cases(True, "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        out = {"plans": expected_plans(cases), "miniworld": miniworld_records("cpu", Path(tmp)),
               "torch": torch.__version__}
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
