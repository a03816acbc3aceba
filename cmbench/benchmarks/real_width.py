"""Real width on the CPU: Wan2.1-T2V-1.3B's transformer (Self-Forcing) with random weights at a few layers,
metered by phase against the memory plan (``scripts/bench_real_width.py``; results/real_width.md).

The DiT is built from ``configs/backbone/self_forcing.yaml``'s ``dit:`` block (width 1536, 12 heads of 128,
FFN 8960) with ``num_layers`` replaced, and runs through the same Wan code path as ``run``
(:class:`~cmbench.backbones.wan.backbone.WanBackbone`, :func:`~cmbench.generation.prefill`,
:func:`~cmbench.generation.continue_task`) at the real token geometry: 480x832 frames, 1560 tokens per latent
frame, chunks of 3 latent frames. The VAE and the text encoder are apart (a tiny VAE, a two-layer umt5 of the
real width); only the DiT's memory is compared. Each chunk runs one sampler step (a model call's memory is the
same at every step of the schedule) and its clean pass.

Measured (torch's CPU allocator, every allocation and free recorded by the profiler, as
:class:`~cmbench.benchmarks.kv_bytes.CpuMeter`; on CUDA the caching allocator's peaks), per phase
(``prefill``: the context; ``continuation``: one chunk after it):

weights
    The DiT's parameters and buffers.
held
    The most memory held at the start or the end of a DiT call (the KV cache, the prefilled one and the task's
    fork, and the call's inputs), against the plan's KV and inputs.
activations
    The most a DiT call allocates above what it holds at its start and at its end (a cache's rows allocated in
    the call are held, not transient), against the plan's ``DiT call``.
attention
    The same for one attention call (:meth:`~cmbench.cache.kv_cache.KVCache.attend`), against
    :func:`~cmbench.backbones.memory.workspace.attention_call` for the device.
peak
    The phase's peak with the weights, against the plan's DiT parts of that phase.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import OmegaConf

from cmbench.backbones.dit import DiTConfig
from cmbench.backbones.memory import workspace
from cmbench.backbones.memory.measure import module_bytes
from cmbench.backbones.memory.plan import GIB, MemoryPlan
from cmbench.backbones.memory.run_plan import plan_for
from cmbench.benchmarks.kv_bytes import window_peaks
from cmbench.config_paths import CONFIG_DIR, to_dict
from cmbench.errors import ConfigError

BACKBONE = "self_forcing"
"""The Wan2.1-T2V-1.3B family member whose config gives the DiT, the frame and the chunk."""
TOLERANCE = 0.10
"""Largest relative difference between a measured phase and the plan's that passes."""
ARMS: dict[str, tuple[dict[str, Any], str]] = {
    "FullKV": ({"name": "fullkv"}, "fp"),
    "DeCoPrune@0.85": ({"name": "decoprune", "quota_pr": 0.85, "probe_step": 0}, "fp"),
    "FullKV KIVI-4": ({"name": "fullkv"}, "kivi"),
}
"""Each arm: the method config and the storage config (``configs/storage/<name>.yaml``; KIVI at 4 bits)."""
WINDOW = "cmbench.real_width:"
COMPARED = ("held", "activations", "attention", "peak")
SLACK = 64 * 1024
"""Bytes by which a part may miss the plan at small shapes (the CI check's), where a chunk's K/V is a few KiB and
the inputs' and the provenance's few KiB are a large share of it."""
EXTRAPOLATE_LAYERS = 30
"""The real model's layers, to which the measured lines are extrapolated."""
"""The measured phases set beside the plan's (the weights are compared once per layer count)."""


@dataclass(frozen=True)
class Case:
    """One measured configuration.

    Attributes
    ----------
    layers : int
    arm : str
        A key of :data:`ARMS`.
    context_frames : int
        Latent frames of the context (a multiple of the chunk).
    dtype, device : str
    seconds : float
        The context length ``plan`` takes (``backbone.memory.context_seconds``) for ``context_frames``.
    dit : tuple of ``(field, value)``
        ``dit:`` fields replaced besides ``num_layers`` (the tests' and the CI check's small widths).
    frame : ``(height, width)`` or None
        Another pixel frame than the config's (480x832).
    backbone : str
        The backbone config planned (only :data:`BACKBONE` is built and measured; another is planned for the
        extrapolation).
    """

    layers: int
    arm: str
    context_frames: int = 3
    dtype: str = "bfloat16"
    device: str = "cpu"
    seconds: float = 0.5
    dit: tuple[tuple[str, int], ...] = ()
    frame: tuple[int, int] | None = None
    backbone: str = BACKBONE

    def overrides(self) -> list[str]:
        """The command-line overrides of ``python -m cmbench plan`` for this case."""
        method, storage = ARMS[self.arm]
        knobs = [f"method.{k}={v}" for k, v in method.items() if k != "name"]
        storage_knobs = ["storage=kivi", "storage.bits=4"] if storage == "kivi" else []
        shape = [f"backbone.dit.{k}={v}" for k, v in self.dit]
        if self.frame is not None:
            shape += [f"backbone.context.height={self.frame[0]}", f"backbone.context.width={self.frame[1]}"]
        return [f"backbone={self.backbone}", f"backbone.dit.num_layers={self.layers}", *shape,
                f"backbone.device={self.device}", f"backbone.dtype={self.dtype}",
                f"backbone.memory.context_seconds={self.seconds:g}", f"method={method['name']}", *knobs,
                *storage_knobs, f"generation.continuation_frames={chunk_frames(self.backbone)}"]

    def command(self) -> str:
        return "python -m cmbench plan " + " ".join(self.overrides())


def backbone_config(name: str = BACKBONE) -> Any:
    return OmegaConf.load(CONFIG_DIR / "backbone" / f"{name}.yaml")


def chunk_frames(name: str = BACKBONE) -> int:
    return int(backbone_config(name).chunk_frames)


def plan_of(case: Case) -> MemoryPlan:
    """``plan``'s plan for the case, made as the command line makes it (no offloads on the CPU)."""
    from hydra import compose, initialize_config_dir

    from cmbench.config_paths import knob_overrides
    from cmbench.spec import resolve_run

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=knob_overrides(case.overrides()))
    spec = resolve_run(cfg)
    plan = plan_for(spec.plan_inputs(), spec.method)
    if plan.shape.context_frames != case.context_frames:
        raise ConfigError(f"plan took {plan.shape.context_frames} context latent frames for "
                          f"backbone.memory.context_seconds={case.seconds:g}, the case runs {case.context_frames}")
    return plan


def dit_parts(plan: MemoryPlan) -> dict[str, dict[str, int]]:
    """The plan's DiT parts per phase, as :class:`Measured` cuts them.

    ``weights``: the DiT; ``held``: the KV replay's allocation after its chunks (prefill: after the last one;
    continuation: the trimmed prefilled cache and the fork after its chunk), or before a chunk's commit with a
    quantized format's open slots (:attr:`~cmbench.backbones.memory.kv.KVTimeline.open_slot`), and the inputs; ``activations``:
    the DiT call; ``attention``: :func:`~cmbench.backbones.memory.workspace.attention_call` for the plan's
    device (inside the activations; the fork's join of shared rows is also in the replay's KV peak);
    ``peak``: the phase's DiT parts summed (the KV peak, its transients included, plus a call's peak).
    """
    s, kv = plan.shape, plan.shape.kv
    out = {}
    for phase in ("prefill", "continuation"):
        parts = plan.phases[phase]
        if phase == "prefill":  # a call ends with its chunk open: the last commit's rows and the open slots
            held = max(*kv.after_chunk, *(rows + kv.open_slot for rows in [0, *kv.after_chunk[:-1]]))
        else:
            after = [kv.fork, *kv.continuation_after_chunk]
            held = kv.prefilled_stored + max(*after, *(rows + kv.open_slot for rows in after[:-1]))
        held += parts["inputs"]
        frames = s.context_frames - (s.chunk_frames if phase == "prefill" else 0)
        attention = workspace.attention_call(s.tokens_per_chunk, frames * s.tokens_per_chunk // s.chunk_frames,
                                             s.heads, s.head_dim, s.compute_bytes, s.device, s.decode_rows,
                                             joined=phase == "continuation")
        out[phase] = {"weights": parts["DiT"], "held": held, "activations": parts["DiT call"],
                      "attention": attention,
                      "peak": parts["DiT"] + sum(v for k, v in parts.items() if "KV" in k) + parts["inputs"]
                      + parts["DiT call"]}
    return out


def refuse_if_too_big(plan: MemoryPlan, available: int | None = None) -> None:
    """One line, before anything is built, when the case's DiT peak does not fit this machine's available
    memory (the benchmark refuses rather than swapping)."""
    parts = dit_parts(plan)
    need = max(p["peak"] for p in parts.values())
    available = available_bytes() if available is None else available
    if need > available:
        raise ConfigError(f"{plan.shape.name}: the DiT needs {need / GIB:.2f} GiB at its peak and this machine has "
                          f"{available / GIB:.2f} GiB available: fewer layers (--layers), a shorter context or a "
                          f"smaller dtype")


def available_bytes() -> int:
    """Memory the kernel says it can give without swapping (``MemAvailable``), or the physical total."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def build_backbone(case: Case, seed: int = 0):
    """The family's DiT of the case (its layers, its ``dit`` fields) with random weights, a tiny VAE (the real
    strides) and a two-layer umt5 of the DiT's text width, at the case's frame and the config's chunk."""
    from diffusers import AutoencoderKLWan
    from transformers import UMT5EncoderModel

    from cmbench.backbones.wan.backbone import WanBackbone
    from cmbench.backbones.wan.precision import parse_dtype
    from cmbench.backbones.wan.synthetic import TINY_VAE, build_tokenizer, random_dit, tiny_umt5_config
    from cmbench.backbones.wan.text import TextEncoder
    from cmbench.backbones.wan.vae import WanVAE

    cfg = backbone_config()
    dit_cfg = dict(to_dict(cfg.dit), num_layers=case.layers, **dict(case.dit))
    compute = parse_dtype(case.dtype)
    dit = random_dit(DiTConfig.from_dict(dit_cfg), case.device, compute, seed=seed)
    torch.manual_seed(seed + 1)
    vae = WanVAE(AutoencoderKLWan(**TINY_VAE), device=case.device)
    text_model = UMT5EncoderModel(tiny_umt5_config(int(dit_cfg["text_dim"]))).to(compute)  # type: ignore[arg-type]
    text = TextEncoder(text_model, build_tokenizer(), int(cfg.text_len), case.device)
    height, width = case.frame or (int(cfg.context.height), int(cfg.context.width))
    return WanBackbone(dit, vae, text, height, width, chunk_frames=int(cfg.chunk_frames), device=case.device,
                       name=f"{BACKBONE}_random")


class MeteredAttention:
    """An attention backend that marks each ``attend`` call as a profiler range (the rest passes through)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function(WINDOW + "attend"):
            return self.inner.attend(layer, q, k, v)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def metered(dit: torch.nn.Module) -> Iterator[None]:
    """Mark every DiT call and every attention call as profiler ranges while active."""
    from cmbench.backbones.dit import SelfAttention

    ranges: list[Any] = []

    def enter(module, args):
        ranges.append(torch.profiler.record_function(WINDOW + "call"))
        ranges[-1].__enter__()

    def leave(module, args, output):
        ranges.pop().__exit__(None, None, None)

    def wrap(module, args, kwargs):
        if "attention" in kwargs:
            return args, {**kwargs, "attention": MeteredAttention(kwargs["attention"])}
        return (*args[:3], MeteredAttention(args[3]), *args[4:]), kwargs

    handles = [dit.register_forward_pre_hook(enter), dit.register_forward_hook(leave)]
    handles += [m.register_forward_pre_hook(wrap, with_kwargs=True) for m in dit.modules()
                if isinstance(m, SelfAttention)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@dataclass
class Measured:
    """One case's measured bytes per phase (keys of :data:`COMPARED` and ``weights``) and its seconds."""

    case: Case
    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    pr: float = 0.0


def phase_bytes(events: list[tuple[int, int]], ranges: dict[str, tuple[int, int]], weights: int,
                phase: tuple[int, int]) -> dict[str, int]:
    """One phase's measured parts from the allocator's events and the profiler's ranges inside ``phase``.

    Parameters
    ----------
    events : list of ``(time, bytes)``
        Every allocation and free since the session started (the weights were allocated before it).
    ranges : dict ``key -> (start, end)``
        Profiler ranges, keys ``"<kind>#<n>"`` with kind ``call`` or ``attend``.
    weights : int
    phase : ``(start, end)``
    """
    inside = {k: r for k, r in ranges.items() if phase[0] <= r[0] and r[1] <= phase[1]}
    ends = {k + "@end": (r[1], r[1]) for k, r in inside.items()}
    peaks = window_peaks(events, {**inside, **ends, "phase": phase})
    calls = [(*peaks[k], peaks[k + "@end"][0]) for k in inside if k.startswith("call#")]
    attends = [(*peaks[k], peaks[k + "@end"][0]) for k in inside if k.startswith("attend#")]
    if not calls or not attends:
        raise RuntimeError("no DiT or attention call was recorded in the phase")
    return {"weights": weights, "held": max(max(start, end) for start, _, end in calls),
            "activations": max(peak - max(start, end) for start, peak, end in calls),
            "attention": max(peak - max(start, end) for start, peak, end in attends),
            "peak": weights + peaks["phase"][1]}


def measure(case: Case, backbone) -> Measured:
    """Prefill a random context of ``case.context_frames`` latent frames and generate one chunk after it, every
    allocation and free on the backbone's device recorded by the profiler (the CPU's allocator, or CUDA's
    caching allocator) and cut into the phases' parts (:func:`phase_bytes`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from cmbench.backbones.wan.backbone import WanCondition
    from cmbench.cache.quantized import storage_format
    from cmbench.generation import GenerationSettings, continue_task, prefill
    from cmbench.generation.sampler import FlowMatchSampler
    from cmbench.methods.registry import build_method

    cfg = backbone_config()
    method_cfg, storage = ARMS[case.arm]
    knobs = {k: v for k, v in to_dict(OmegaConf.load(CONFIG_DIR / "storage" / f"{storage}.yaml")).items()
             if k != "description"}
    settings = GenerationSettings(sampler=FlowMatchSampler((float(cfg.sampler.timesteps[0]),), True),
                                  storage=storage_format({**knobs, **({"bits": 4} if storage == "kivi" else {})}))
    method = build_method(method_cfg)
    g = backbone.geometry
    cond = WanCondition("real_width", ("a room",), "a room", case.context_frames)
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(1, g.latent_channels, case.context_frames, g.latent_height, g.latent_width,
                          generator=gen).to(backbone.device)
    backbone.text.encode("a room")  # the prompt's states cached before anything is measured
    cuda = backbone.device.type == "cuda"
    start = time.perf_counter()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])  # as torch's memory timeline
    with metered(backbone.dit), profile(activities=activities, profile_memory=True) as prof:
        with torch.profiler.record_function(WINDOW + "prefill"):
            pre = prefill(backbone, method, latents, cond, seed=2, settings=settings)
            pre.cache.trim()  # as run settles a prefilled cache it keeps on the device
        with torch.profiler.record_function(WINDOW + "continuation"):
            cont = continue_task(backbone, pre, cond, g.chunk_frames, seed=3)
        if cuda:
            torch.cuda.synchronize(backbone.device)
    seconds = time.perf_counter() - start
    device_type = DeviceType.CUDA if cuda else DeviceType.CPU
    events: list[tuple[int, int]] = []
    ranges: dict[str, tuple[int, int]] = {}
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if name == "[memory]" and e.device_type() == device_type:
            events.append((e.start_ns(), e.nbytes()))
        elif name.startswith(WINDOW):
            ranges[f"{name[len(WINDOW):]}#{len(ranges)}"] = (e.start_ns(), e.end_ns())
    weights = module_bytes(backbone.dit)
    phases = {}
    for phase in ("prefill", "continuation"):
        span = next(r for k, r in ranges.items() if k.startswith(phase + "#"))
        phases[phase] = phase_bytes(events, ranges, weights, span)
    return Measured(case, phases, seconds, float(cont.ledger.pruning_ratio()))


DIFFERENCES = (
    "- **weights**: the DiT's parameters and buffers, counted from the model built; `plan` counts them on the "
    "meta device with the loader's casts: equal.",
    "- **held** (full precision): the KV replay's allocation after each chunk (the bank's geometric growth, the "
    "trimmed prefilled cache, a fork's room for the continuation) plus the inputs.",
    "- **held** (KIVI-4): a quantized bank holds its full-precision chunk slot (one chunk's K and V per layer) "
    "from a layer's first call of a chunk until the chunk is committed, and releases it then; a call ends with "
    "its chunk open, so what it holds is the codes of the chunks before and every layer's slot, as the replay "
    "counts them (`KVTimeline.open_slot`).",
    "- **activations**: `plan`'s DiT call is `L x c x (1.4 f + 12.5 d)` per call (coefficients fitted with the "
    "tensor tracker at small token grids, LingBot's float32 residual stream included); at this width in bfloat16 "
    "with a bfloat16 residual stream a call measures about `L x c x (2 f + 4 d)` (the FFN's two `f`-wide tensors "
    "and a few `d`-wide ones): the plan over-predicts (left so: it errs on the side of fitting).",
    "- **attention**: what one `attend` holds for a moment beyond its inputs and output: the log-sum-exp, "
    "torch's CPU flash attention's per-thread blocks, and in a fork the join of the shared history with the "
    "chunk's rows (full precision), or two decoded blocks and four float32 accumulators (KIVI-4). `plan` models "
    "it for the device's kernels (`workspace.attention_call`); on CUDA the kernels' part is none "
    "(scripts/gpu_check.py measures it).",
    "- **peak**: the phase's peak against the plan's sum of the KV peak (growth, gather and re-index transients "
    "included) and a call's activations, which the run never holds at one moment: the plan over-predicts.",
)
"""The reasons the results page gives for each part's difference (no number: the table has them)."""


@dataclass(frozen=True)
class Row:
    """One case, one phase, one part: measured beside planned."""

    layers: int
    arm: str
    phase: str
    part: str
    measured: int
    planned: int

    @property
    def ratio(self) -> float:
        return self.measured / self.planned if self.planned else math.inf

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE

    @property
    def close(self) -> bool:
        """Within the tolerance, or :data:`SLACK` bytes of the plan (what small shapes' inputs round to)."""
        return self.within or abs(self.measured - self.planned) <= SLACK


def compare(measured: Measured, plan: MemoryPlan) -> list[Row]:
    """Every part of :data:`COMPARED` (and the weights, in the prefill) beside the plan's."""
    planned = dit_parts(plan)
    rows = []
    for phase in ("prefill", "continuation"):
        parts = (("weights",) if phase == "prefill" else ()) + COMPARED
        rows += [Row(measured.case.layers, measured.case.arm, phase, part, measured.phases[phase][part],
                     planned[phase][part]) for part in parts]
    return rows


def markdown(rows: list[Row]) -> str:
    """The rows as a markdown table (MiB), each marked when it is off the plan by more than :data:`TOLERANCE`."""
    lines = ["| layers | arm | phase | part | measured MiB | plan MiB | measured / plan |",
             "|---:|---|---|---|---:|---:|---:|"]
    for r in rows:
        mark = "" if r.within else " **off**"
        lines.append(f"| {r.layers} | {r.arm} | {r.phase} | {r.part} | {r.measured / 2**20:.1f} | "
                     f"{r.planned / 2**20:.1f} | {r.ratio:.3f}{mark} |")
    return "\n".join(lines)


def fit_layers(rows: list[Row], arm: str, phase: str, part: str) -> tuple[float, float] | None:
    """Least-squares ``(intercept, per layer)`` of the measured bytes of one part against the layer count, or
    ``None`` with fewer than two layer counts."""
    points = [(r.layers, r.measured) for r in rows if (r.arm, r.phase, r.part) == (arm, phase, part)]
    if len({n for n, _ in points}) < 2:
        return None
    mean_n = sum(n for n, _ in points) / len(points)
    mean_b = sum(b for _, b in points) / len(points)
    slope = sum((n - mean_n) * (b - mean_b) for n, b in points) / sum((n - mean_n) ** 2 for n, _ in points)
    return mean_b - slope * mean_n, slope


def report(rows: list[Row], measured: list[Measured], threads: int, extrapolated: dict[str, MemoryPlan],
           lingbot: tuple[Case, MemoryPlan] | None = None) -> str:
    """The results page: the cases' commands, the table, the extrapolation of each arm to the layers of its
    plan in ``extrapolated`` (arm -> plan), and ``lingbot``'s plan scaled by the ratios extrapolated here."""
    cases = [m.case for m in measured]
    lines = [f"# Real width on the CPU: {BACKBONE}'s DiT (Wan2.1-T2V-1.3B) at a few layers, measured beside `plan`",
             "", "Generated by `python scripts/bench_real_width.py` (cmbench/benchmarks/real_width.py), "
             f"torch {torch.__version__}, {threads} CPU threads, random weights; a {cases[0].context_frames}-latent-"
             "frame context (one chunk of 3 x 1560 tokens) prefilled and one chunk generated, one sampler step "
             "per chunk. Measured: torch's CPU allocator (profiler events); plan: the same `plan` a run makes "
             f"(device cpu). **off**: more than {TOLERANCE:.0%} from the plan.", "",
             "| layers | arm | seconds | PR | plan command |", "|---:|---|---:|---:|---|"]
    lines += [f"| {m.case.layers} | {m.case.arm} | {m.seconds:.0f} | {m.pr:.3f} | `{m.case.command()}` |"
              for m in measured]
    lines += ["", markdown(rows), "", "## Where measured and planned differ", "", *DIFFERENCES, ""]
    fits = []
    for arm, plan in extrapolated.items():
        planned = dit_parts(plan)
        for phase in ("prefill", "continuation"):
            for part in ("weights", "held", "activations", "attention", "peak"):
                fit = fit_layers(rows, arm, phase, part)
                if fit is None:
                    continue
                value = fit[0] + EXTRAPOLATE_LAYERS * fit[1]
                big = planned[phase][part]
                fits.append(f"| {arm} | {phase} | {part} | {fit[0] / 2**20:.1f} | {fit[1] / 2**20:.2f} | "
                            f"{value / 2**20:.1f} | {big / 2**20:.1f} | {value / big:.3f} |")
    if fits:
        lines += [f"## Extrapolation to {EXTRAPOLATE_LAYERS} layers (an extrapolation, not a measurement)", "",
                  "A least-squares line through the measured layer counts, evaluated at "
                  f"{EXTRAPOLATE_LAYERS} layers (the real model's), beside `plan` at {EXTRAPOLATE_LAYERS} layers.", "",
                  "| arm | phase | part | intercept MiB | per layer MiB | extrapolated MiB | plan MiB | ratio |",
                  "|---|---|---|---:|---:|---:|---:|---:|", *fits, ""]
        if lingbot is not None:
            lines += _lingbot_lines(rows, lingbot, extrapolated[lingbot[0].arm])
    return "\n".join(lines) + "\n"


def _lingbot_lines(rows: list[Row], lingbot: tuple[Case, MemoryPlan], small: MemoryPlan) -> list[str]:
    """LingBot World v2 14B's plan for one chunk of context and one generated, each part scaled by the
    measured / planned ratio extrapolated to 30 layers for the same arm here (``small``: its plan at 30 layers)."""
    case, plan = lingbot
    planned = dit_parts(plan)
    out = [f"## {case.backbone} (an extrapolation, not a measurement)", "",
           f"`{case.command()}`: its plan per part, times the ratio of the line through this page's measurements "
           f"at {EXTRAPOLATE_LAYERS} layers to `plan` at {EXTRAPOLATE_LAYERS} layers ({case.arm}). A wider model's "
           "activations and workspaces need not scale as these do: a GPU measures them (scripts/gpu_check.py).", "",
           "| phase | part | plan MiB | x ratio | extrapolated MiB |", "|---|---|---:|---:|---:|"]
    small_parts = dit_parts(small)
    for phase in ("prefill", "continuation"):
        for part in ("weights", "held", "activations", "attention", "peak"):
            fit = fit_layers(rows, case.arm, phase, part)
            if fit is None or not small_parts[phase][part]:
                continue
            ratio = (fit[0] + EXTRAPOLATE_LAYERS * fit[1]) / small_parts[phase][part]
            out.append(f"| {phase} | {part} | {planned[phase][part] / 2**20:.1f} | {ratio:.3f} | "
                       f"{planned[phase][part] * ratio / 2**20:.1f} |")
    return [*out, ""]
