"""The memory plan of a run: predicted device (and host) memory per phase, and the offloads that fit.

A run holds, per context and task, in order (:mod:`cmbench.runs.evaluator`):

``load``
    the DiT (plus one float32 checkpoint tensor while it is cast), the VAE, the text encoder (unless on
    the CPU) and the scorer's networks (when on the same device);
``encode``
    the context video encoded (the pixels on the device, the VAE's workspace) and LingBot's I2V latents;
``prefill``
    the KV cache growing chunk by chunk (:func:`~cmbench.backbones.memory.kv.simulate_kv`) and one DiT
    call's activations;
``continuation``
    the prefilled cache (trimmed to its history; nothing on the device when parked in host memory) plus
    one task's fork with room for the whole continuation (reading the prefilled rows in place, or a
    whole copy of a parked cache), and a DiT call;
``decode``
    the prefilled cache and the VAE decoding the continuation after the context (the fork is freed);
``score``
    the prefilled cache and the scorer's workspace.

Offloads, cheapest first: the text encoder on the CPU (prompts are encoded once and cached), the
prefilled cache in host memory while its tasks run (one host-to-device copy per task), then the whole
KV cache in host memory staged one layer at a time (``offload_kv``: PCIe-bound). :func:`choose_plan`
takes the first set whose peak fits the device (minus a reserve for the CUDA context and the
allocator) and whose host need fits the host, or returns the smallest one with ``fits`` false.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cmbench.backbones.memory import workspace
from cmbench.backbones.memory.kv import KVTimeline

GIB = 2**30
OFFLOAD_SETS: tuple[tuple[str, ...], ...] = ((), ("text_cpu",), ("park_prefill",), ("text_cpu", "park_prefill"),
                                             ("offload_kv",), ("text_cpu", "offload_kv"))
OFFLOAD_NAMES = {"text_cpu": "text encoder on the CPU (backbone.text_device=cpu)",
                 "park_prefill": "prefilled cache in host memory during continuations",
                 "offload_kv": "whole KV cache in host memory, staged per layer (backbone.offload_kv=true)"}


@dataclass(frozen=True)
class RunShape:
    """Everything a run's memory depends on, in bytes and counts (built by ``config.run_shape``).

    Attributes
    ----------
    name : str
        Backbone and method, for messages.
    dit, vae, text, scorer : int
        Bytes of each model on its device (``scorer``: 0 when it runs elsewhere).
    largest_tensor : int
        The largest DiT parameter in float32 (the loader's transient).
    tokens_per_chunk, dim, ffn_dim, compute_bytes, text_len, text_dim : int
        For one DiT call's activations.
    height, width, chunk_frames : int
        Pixel frame and AR chunk (latent frames).
    context_frames, continuation_frames : int
        Latent frames of the longest context and of a continuation.
    i2v : bool
        LingBot's first-frame latents are encoded for the whole timeline.
    vae_scale : float
        The VAE's workspace relative to the float32 Wan 2.1 VAE's (:func:`workspace.vae_scale`).
    kv : KVTimeline
        The KV cache replayed for this method (:func:`~cmbench.backbones.memory.kv.simulate_kv`).
    kv_exact : bool
        Whether the KV replay is exact for the method (``False``: its retention is assumed).
    camera_values : int
        Camera channels per token (0 without a camera path).
    text_work : int
        One prompt through the text encoder (on its device).
    notes : tuple of str
    sequence : int
        Ranks per model (Ulysses sequence parallelism): the KV and the DiT call are one rank's.
    context_source : str
        Where the context length came from (printed on the plan's first line).
    heads, head_dim : int
        Attention heads of one rank and their width (for the attention workspace).
    device : str
        ``cpu`` or ``cuda``: whose attention kernels the workspace is modelled for.
    decode_rows : int
        History rows a quantized bank decodes at a time (0: full precision).
    """

    name: str
    dit: int
    vae: int
    text: int
    scorer: int
    largest_tensor: int
    tokens_per_chunk: int
    dim: int
    ffn_dim: int
    compute_bytes: int
    text_len: int
    text_dim: int
    height: int
    width: int
    chunk_frames: int
    context_frames: int
    continuation_frames: int
    i2v: bool
    vae_scale: float
    kv: KVTimeline
    kv_exact: bool = True
    camera_values: int = 0
    text_work: int = 0
    notes: tuple[str, ...] = ()
    sequence: int = 1
    context_source: str = ""
    heads: int = 0
    head_dim: int = 0
    device: str = "cuda"
    decode_rows: int = 0


@dataclass
class MemoryPlan:
    """Predicted bytes per phase for one set of offloads.

    Attributes
    ----------
    shape : RunShape
    offloads : tuple of str
        Keys of :data:`OFFLOAD_NAMES`.
    phases : dict[str, dict[str, int]]
        Phase -> component -> device bytes.
    host : dict[str, int]
        Component -> host bytes the offloads need (besides the process itself).
    device_bytes, host_bytes : int or None
        What the plan was checked against (``None``: not checked).
    reserve : int
        Device bytes kept free.
    device_note : str
        Where ``device_bytes`` came from when it is not a device's own (an assumed H200 where no GPU is
        visible), printed with it.
    """

    shape: RunShape
    offloads: tuple[str, ...]
    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)
    device_bytes: int | None = None
    host_bytes: int | None = None
    reserve: int = 0
    device_note: str = ""

    @property
    def peak(self) -> int:
        """The most device bytes of any phase."""
        return max(sum(parts.values()) for parts in self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: sum(self.phases[p].values()))

    @property
    def host_need(self) -> int:
        return sum(self.host.values())

    def fits_device(self, device_bytes: int | None = None, reserve: int | None = None) -> bool:
        device_bytes = self.device_bytes if device_bytes is None else device_bytes
        reserve = self.reserve if reserve is None else reserve
        return device_bytes is None or self.peak + reserve <= device_bytes

    def fits_host(self, host_bytes: int | None = None) -> bool:
        host_bytes = self.host_bytes if host_bytes is None else host_bytes
        return host_bytes is None or self.host_need <= host_bytes

    @property
    def fits(self) -> bool:
        return self.fits_device() and self.fits_host()

    def describe(self) -> str:
        """A readable table: each phase's peak and its largest parts, then the offloads and the verdict."""
        s = self.shape
        source = f" ({s.context_source})" if s.context_source else ""
        split = f"; split over {s.sequence} ranks, memory per rank" if s.sequence > 1 else ""
        lines = [f"{s.name}: {s.context_frames} context + {s.continuation_frames} "
                 f"continuation latent frames{source}{split}"]
        lines += [f"  {note}" for note in self.shape.notes]
        lines.append(f"  {'phase':<13}{'device GiB':>11}   parts (GiB)")
        for phase, parts in self.phases.items():
            shown = ", ".join(f"{k} {v / GIB:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
            mark = "  <- peak" if phase == self.peak_phase else ""
            lines.append(f"  {phase:<13}{sum(parts.values()) / GIB:>11.2f}   {shown}{mark}")
        offloads = "; ".join(OFFLOAD_NAMES[o] for o in self.offloads) or "none"
        lines.append(f"  offloads: {offloads}")
        if self.host:
            lines.append(f"  host memory for the offloads: {self.host_need / GIB:.2f} GiB ("
                         + ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.host.items()) + ")")
        if self.device_bytes is not None:
            verdict = "fits" if self.fits_device() else "does NOT fit"
            note = f": {self.device_note}" if self.device_note else ""
            lines.append(f"  device: peak {self.peak / GIB:.2f} GiB + reserve {self.reserve / GIB:.2f} GiB "
                         f"{verdict} {self.device_bytes / GIB:.2f} GiB{note}")
        if self.host_bytes is not None and self.host:
            verdict = "fits" if self.fits_host() else "does NOT fit"
            lines.append(f"  host: {self.host_need / GIB:.2f} GiB {verdict} {self.host_bytes / GIB:.2f} GiB")
        return "\n".join(lines)


def build_plan(shape: RunShape, offloads: tuple[str, ...] = ()) -> MemoryPlan:
    """The phases of a run with these offloads (see the module docstring)."""
    s, kv = shape, shape.kv
    text_cpu, park, offload = "text_cpu" in offloads, "park_prefill" in offloads, "offload_kv" in offloads
    models = {"DiT": s.dit, "VAE": s.vae, "text encoder": 0 if text_cpu else s.text, "scorer": s.scorer}
    call = workspace.dit_call(s.tokens_per_chunk, s.dim, s.ffn_dim, s.compute_bytes, s.text_len, s.text_dim,
                              s.camera_values, s.sequence)
    text_work = 0 if text_cpu else s.text_work
    latent_pixels = (s.height // 8) * (s.width // 8)
    # context latents, LingBot's I2V latents for the whole timeline, a chunk's camera map (float32, cached)
    inputs = (s.context_frames + (s.context_frames + s.continuation_frames if s.i2v else 0)) * 16 * latent_pixels * 4
    inputs += s.tokens_per_chunk * s.camera_values * 4
    pixel_frames = 4 * (s.context_frames - 1) + 1
    encode = workspace.vae_encode(pixel_frames, s.height, s.width, s.vae_scale)
    if s.i2v:
        i2v_frames = 4 * (s.context_frames + s.continuation_frames - 1) + 1
        encode = max(encode, workspace.vae_first_frame(i2v_frames, s.height, s.width, s.vae_scale))
    prefilled = 0 if (park or offload) else kv.prefilled_stored
    plan = MemoryPlan(shape, tuple(offloads))
    plan.phases["load"] = {**models, "cast": s.largest_tensor}
    plan.phases["encode"] = {**models, "VAE encode": encode}
    plan.phases["prefill"] = {**models, "KV": kv.staging_peak if offload else kv.prefill_peak,
                              "DiT call": call, "text call": text_work, "inputs": inputs}
    plan.phases["continuation"] = {**models, "prefilled KV": prefilled,
                                   "task KV": kv.staging_peak if offload else
                                   kv.parked_continuation_peak if park else kv.continuation_peak,
                                   "DiT call": call, "text call": text_work, "inputs": inputs}
    plan.phases["decode"] = {**models, "prefilled KV": prefilled, "inputs": inputs,
                             "VAE decode": workspace.vae_decode(s.continuation_frames, s.height, s.width,
                                                                s.vae_scale)}
    plan.phases["score"] = {**models, "prefilled KV": prefilled, "inputs": inputs,
                            "scorer work": workspace.SCORER_WORKSPACE_BYTES if s.scorer else 0}
    if text_cpu:
        plan.host["text encoder"] = s.text
    if kv.store_peak:
        plan.host["host store"] = kv.store_peak
    if offload:
        plan.host["KV cache"] = kv.host_peak
    elif park:
        plan.host["prefilled KV"] = kv.prefilled_stored
    return plan


def choose_plan(shape: RunShape, device_bytes: int | None, host_bytes: int | None, reserve: int,
                forced: tuple[str, ...] = (), auto: bool = True) -> MemoryPlan:
    """The first offload set (cheapest first, always including ``forced``) that fits.

    Parameters
    ----------
    shape : RunShape
    device_bytes, host_bytes : int or None
        Capacities (``None``: not checked).
    reserve : int
        Device bytes kept free.
    forced : tuple of str
        Offloads the configuration already asks for.
    auto : bool
        ``False``: plan exactly ``forced``.

    Returns
    -------
    MemoryPlan
        ``fits`` false when even every offload does not (the one with the smallest device peak).
    """
    candidates = [tuple(sorted(set(o) | set(forced))) for o in OFFLOAD_SETS] if auto else [tuple(sorted(forced))]
    plans = []
    for offloads in dict.fromkeys(candidates):
        plan = build_plan(shape, offloads)
        plan.device_bytes, plan.host_bytes, plan.reserve = device_bytes, host_bytes, reserve
        if plan.fits:
            return plan
        plans.append(plan)
    return min(plans, key=lambda p: (not p.fits_host(), p.peak))


def refusal(plan: MemoryPlan) -> str:
    """One message naming the numbers and the fixes, for a plan that does not fit."""
    s = plan.shape
    where = f"{plan.device_bytes / GIB:.1f} GiB" if plan.device_bytes is not None else "the device"
    parts = plan.phases[plan.peak_phase]
    biggest = ", ".join(f"{k} {v / GIB:.1f} GiB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:3])
    offloads = "; ".join(OFFLOAD_NAMES[o] for o in plan.offloads) or "no offload"
    message = (f"{s.name} does not fit {where}: with {offloads} it needs {plan.peak / GIB:.1f} GiB at "
               f"{plan.peak_phase} ({biggest}) + {plan.reserve / GIB:.1f} GiB reserve")
    if plan.host and plan.host_bytes is not None and not plan.fits_host():
        message += f" and {plan.host_need / GIB:.1f} GiB of host memory ({plan.host_bytes / GIB:.1f} GiB here)"
    on_device = [p for p in (build_plan(s, o) for o in OFFLOAD_SETS) if p.peak + plan.reserve <= (plan.device_bytes or 0)]
    if on_device:  # the device would do; the host is short
        best = min(on_device, key=lambda p: p.host_need)
        fix = (f"it fits the device with {'; '.join(OFFLOAD_NAMES[o] for o in best.offloads) or 'no offload'} given "
               f"{best.host_need / GIB:.1f} GiB of host memory: run where the host has it (or set "
               f"backbone.memory.host_gib if this one does)")
    else:
        fix = ("a GPU with more memory, a method that keeps fewer tokens (e.g. method.quota_pr=0.85), or a "
               "shorter context (backbone.memory.context_seconds)")
    return f"{message}. Fix: {fix}; `python -m cmbench plan` prints the whole plan"
