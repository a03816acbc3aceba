"""The prepared GPU check of the real-backbone path: random weights at LingBot World v2 1.3B's shape, asserting.

``scripts/gpu_check.py`` runs it (one command for a short GPU loan, no download): (a)-(c) below, then (e)-(h)
of :mod:`cmbench.benchmarks.gpu_loan` (real width against ``plan``, KIVI-4 attention time, the scorer's
self-check, a MiniWorld run against the committed CPU records); it prints one table of every check.

(a) **plan vs measure**: a one-minute context (random latents) is prefilled and one continuation chunk
    generated with FullKV and with DeCoPrune at 85% PR (quota mode), each with the offloads the memory
    plan picks for this device, as ``run`` picks them; the peak allocated memory of prefill +
    continuation must be within :data:`PLAN_TOLERANCE` of the plan's prediction. It prints continuation
    FPS (4 frames per latent frame, as the continuation is decoded) and the speed-up over FullKV, which
    must exceed 1 on a GPU.
(b) **host memory**: with a short context, the continuation from a prefilled cache parked in host
    memory and from a cache kept wholly in host memory (``offload_kv``) must equal the resident one
    exactly.
(c) **precision**: one chunk's flow prediction in bf16 with LingBot's float32 islands (residual stream,
    head, timestep path) must be within :data:`PRECISION_TOLERANCE` of float32, and no further from it
    than bf16 with a bf16 residual stream.

Every model call runs the LingBot config's sampler (four steps, fresh noise). ``--tiny`` runs the same
code on the CPU at tiny shapes, with peaks from :class:`~cmbench.backbones.memory.measure.PeakMemory`'s
tensor tracker instead of the CUDA allocator; a test runs it, so the check cannot rot.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from cmbench.backbones.dit import DiTConfig
from cmbench.backbones.memory import workspace
from cmbench.backbones.memory.measure import PeakMemory, module_bytes, tensor_bytes
from cmbench.backbones.memory.plan import GIB, MemoryPlan, choose_plan
from cmbench.backbones.memory.run_plan import DEFAULT_DEVICE_GIB, ModelBytes, RunPlan, shape_of
from cmbench.backbones.wan.backbone import WanBackbone, WanCondition
from cmbench.backbones.wan.camera import CameraPlan, default_intrinsics
from cmbench.backbones.wan.i2v import FirstFrameLatents
from cmbench.backbones.wan.precision import cast_for_inference, param_dtype, parse_dtype
from cmbench.backbones.wan.synthetic import TINY_VAE, build_tokenizer, random_dit, tiny_umt5_config
from cmbench.backbones.wan.text import TextEncoder
from cmbench.backbones.wan.timeline import prepared_length
from cmbench.backbones.wan.vae import WanVAE
from cmbench.cache.kv_cache import KVCache
from cmbench.config_paths import CONFIG_DIR, to_dict
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.generation.sampler import FlowMatchSampler
from cmbench.methods.registry import build_method

PLAN_TOLERANCE = 0.10
PRECISION_TOLERANCE = 0.05  # relative L2 error of the flow prediction, bf16 with islands vs float32
METHODS = ({"name": "fullkv"}, {"name": "decoprune", "quota_pr": 0.85})


@dataclass(frozen=True)
class CheckShape:
    """Shapes and sizes of one check.

    Attributes
    ----------
    dit : dict
        :class:`DiTConfig` fields.
    height, width : int
        Pixel frame (a multiple of 16).
    context_seconds, short_context_seconds : float
        The context of (a), and of (b) and (c).
    text_len : int
    device, dtype : str
    reserve_gib : float
        Device memory the plan keeps free.
    """

    dit: dict
    height: int
    width: int
    context_seconds: float
    short_context_seconds: float
    text_len: int
    device: str
    dtype: str = "bfloat16"
    reserve_gib: float = 8.0


def lingbot_config(name: str = "lingbot_world_v2_1_3b") -> Any:
    return OmegaConf.load(CONFIG_DIR / "backbone" / f"{name}.yaml")


def lingbot_settings() -> GenerationSettings:
    """The LingBot config's sampler (its ``sampler:`` block: four steps, fresh noise at every step)."""
    sampler = lingbot_config().sampler
    return GenerationSettings(sampler=FlowMatchSampler(tuple(sampler.timesteps), bool(sampler.stochastic)))


def shapes() -> dict[str, CheckShape]:
    """``1.3b``: LingBot World v2 1.3B's DiT at 480x832, a one-minute context; ``tiny``: the CPU dry run."""
    real = to_dict(lingbot_config().dit)
    tiny = dict(real, dim=64, ffn_dim=128, num_heads=2, num_layers=2, text_dim=32)
    return {"1.3b": CheckShape(real, 480, 832, 60.0, 10.0, 512, "cuda"),
            "tiny": CheckShape(tiny, 48, 64, 12.0, 3.0, 16, "cpu")}


@dataclass
class Report:
    """What the check measured; ``failures`` lists every assertion that did not hold, ``table`` every check of
    the parts that report one (part, check, value, bound, result)."""

    rows: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    table: list[dict] = field(default_factory=list)

    def add(self, part: str, name: str, value: float, bound: str, passed: bool, asserted: bool = True) -> None:
        """One row of the table; an asserted row that did not pass is a failure."""
        result = ("ok" if passed else "FAILED") if asserted else f"reported ({'within' if passed else 'off'})"
        self.table.append({"part": part, "check": name, "value": float(value), "bound": bound, "result": result})
        if asserted and not passed:
            self.failures.append(f"({part}) {name}: {value:.4g}, bound {bound}")

    def markdown(self) -> str:
        """The table as markdown."""
        lines = ["| part | check | value | bound | result |", "|---|---|---:|---|---|"]
        lines += [f"| {r['part']} | {r['check']} | {r['value']:.4g} | {r['bound']} | {r['result']} |"
                  for r in self.table]
        return "\n".join(lines) + "\n"

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)
            self.say(f"[check] FAILED: {what}")


def build_backbone(shape: CheckShape, seed: int = 0, dtype: str | None = None) -> WanBackbone:
    """A LingBot-shaped backbone with random weights: the DiT at ``shape``, a tiny VAE (the real strides) and a
    two-layer umt5 of the real width."""
    from diffusers import AutoencoderKLWan
    from transformers import UMT5EncoderModel

    compute = parse_dtype(dtype or shape.dtype)
    dit = random_dit(DiTConfig.from_dict(shape.dit), shape.device, compute, seed=seed, fp32_residual=True)
    torch.manual_seed(seed + 1)
    vae = WanVAE(AutoencoderKLWan(**TINY_VAE), device=shape.device)
    # transformers types its wrapped ``PreTrainedModel.to`` as taking the model again; a dtype is right
    text_model = UMT5EncoderModel(tiny_umt5_config(int(shape.dit["text_dim"]))).to(compute)  # type: ignore[arg-type]
    text = TextEncoder(text_model, build_tokenizer(), shape.text_len, shape.device)
    return WanBackbone(dit, vae, text, shape.height, shape.width, chunk_frames=4, device=shape.device,
                       name="lingbot_random")


def condition(backbone: WanBackbone, context_frames: int, seed: int = 0) -> WanCondition:
    """A task's condition over the timeline: continue_prompt, the static camera, a random first frame (its
    I2V latents encoded now, before anything is measured)."""
    rng = np.random.default_rng(seed)
    first = rng.integers(0, 255, (backbone.height, backbone.width, 3), dtype=np.uint8)
    i2v = FirstFrameLatents(backbone.vae, first, context_frames + 16)
    i2v.channels(0, 1)
    return WanCondition("check", ("a room",) * 6, "the camera turns back to the vase", context_frames,
                        CameraPlan.static(default_intrinsics(backbone.height, backbone.width)), i2v)


def context_latents(backbone: WanBackbone, seconds: float, seed: int = 0) -> torch.Tensor:
    """Random context latents of a ``seconds`` context prepared at 16 fps (whole chunks)."""
    g = backbone.geometry
    frames = prepared_length(int(round(16 * seconds)), 16.0, 16.0, g.chunk_frames, 4)[1]
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, g.latent_channels, frames, g.latent_height, g.latent_width, generator=gen).to(backbone.device)


def plan_check(backbone: WanBackbone, shape: CheckShape, method, context_frames: int) -> MemoryPlan:
    """The plan ``run`` would make for this backbone and method on this device (models counted as loaded)."""
    g, dit = backbone.geometry, backbone.dit
    text_cfg = backbone.text.model.config
    models = ModelBytes(module_bytes(dit), module_bytes(backbone.vae.model),
                        module_bytes(backbone.text.model) if backbone.text.device == backbone.device else 0,
                        text_work=workspace.text_call(shape.text_len, text_cfg.d_model, text_cfg.d_ff,
                                                      text_cfg.num_heads, param_dtype(dit).itemsize))
    device = torch.device(shape.device)
    scale = workspace.vae_scale(4, int(backbone.vae.model.config.base_dim))
    run_shape = shape_of("lingbot_random", g, shape.dit, models, method, param_dtype(dit).itemsize,
                         shape.height, shape.width, shape.text_len, scale, context_frames, g.chunk_frames,
                         on_cpu=device.type == "cpu")
    if device.type == "cuda":
        device_bytes = int(torch.cuda.get_device_properties(device).total_memory)
        import os

        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return choose_plan(run_shape, device_bytes, host, int(shape.reserve_gib * GIB))
    return choose_plan(run_shape, None, None, 0, auto=False)  # on the CPU everything is host memory already


def predicted_peak(plan: MemoryPlan) -> int:
    """The plan's peak over what the check runs: prefill and continuation."""
    return max(sum(plan.phases[p].values()) for p in ("prefill", "continuation"))


def run_method(backbone: WanBackbone, shape: CheckShape, method_cfg: dict, latents: torch.Tensor,
               settings: GenerationSettings, report: Report) -> tuple[dict, torch.Tensor]:
    """(a) for one method: plan, apply the offloads, prefill, settle, one chunk; compare the peak.

    Each method starts as a run's first context does: a fresh condition (no camera map cached yet, its
    I2V latents encoded) and no prompt encoded yet.
    """
    method = build_method(method_cfg)
    cond = condition(backbone, latents.shape[2])
    backbone.text.clear_cache()
    plan = plan_check(backbone, shape, method, latents.shape[2])
    report.say(plan.describe())
    if not plan.fits:
        report.check(False, f"{method.name}: the plan does not fit this machine (see above); not run")
        return {"method": method.name, "fits": False}, torch.zeros(0)
    backbone.offload_kv = "offload_kv" in plan.offloads
    settle = RunPlan(plan, None, park_prefill="park_prefill" in plan.offloads)
    device = torch.device(shape.device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # on the CPU the tracker sees what is allocated inside; what exists already: the models and the inputs
    baseline = module_bytes(backbone.dit, backbone.vae.model, backbone.text.model)
    baseline += tensor_bytes([latents])
    if cond.first_frame is not None and cond.first_frame.latents is not None:
        baseline += tensor_bytes([cond.first_frame.latents])
    with PeakMemory(device, baseline=baseline) as peak:
        pre = prefill(backbone, method, latents, cond, seed=2, settings=settings)
        settle.settle(pre.cache)
        cont = continue_task(backbone, pre, cond, backbone.geometry.chunk_frames, seed=3)
    backbone.offload_kv = False
    predicted = predicted_peak(plan)
    frames = 4 * cont.latents.shape[2]  # decoded after the context: 4 frames per latent frame
    target = getattr(method, "quota_pr", None)
    row = {"method": method.name + (f"@{target}" if target else ""),
           "offloads": ",".join(plan.offloads) or "-", "context_latent_frames": int(latents.shape[2]),
           "prefill_s": round(pre.seconds, 2), "continuation_s": round(cont.seconds, 3),
           "fps": round(frames / cont.seconds, 3), "pr": round(float(cont.ledger.pruning_ratio()), 4),
           "peak_mib": round(peak.peak / 2**20, 2), "planned_mib": round(predicted / 2**20, 2),
           "ratio": round(peak.peak / predicted, 4)}
    report.say(f"[a] {row}")
    report.add("a", f"{row['method']}: peak {row['peak_mib']} MiB / plan {row['planned_mib']} MiB", peak.peak / predicted,
               f"1 +- {PLAN_TOLERANCE:g}", abs(peak.peak / predicted - 1.0) <= PLAN_TOLERANCE)
    report.check(bool(torch.isfinite(cont.latents).all()), f"{row['method']}: non-finite continuation")
    del pre
    return row, cont.latents.float().cpu()


def check_plan(backbone: WanBackbone, shape: CheckShape, settings: GenerationSettings, report: Report) -> None:
    """(a): FullKV and DeCoPrune over the long context."""
    latents = context_latents(backbone, shape.context_seconds)
    report.say(f"[a] context: {shape.context_seconds:g} s -> {latents.shape[2]} latent frames "
               f"({backbone.geometry.tokens_per_frame} tokens each)")
    rows = [run_method(backbone, shape, m, latents, settings, report)[0] for m in METHODS]
    full, pruned = rows
    if "continuation_s" not in full or "continuation_s" not in pruned:
        report.rows += rows
        return
    speedup = full["continuation_s"] / pruned["continuation_s"]
    report.say(f"[a] speed-up of {pruned['method']} over FullKV: {speedup:.2f}x (continuation only)")
    report.check(full["pr"] == 0.0, f"FullKV PR is {full['pr']}, expected 0")
    report.check(0.5 < pruned["pr"] <= 0.86, f"DeCoPrune PR {pruned['pr']} is not about its 85% budget")
    if torch.device(shape.device).type == "cuda":
        report.check(speedup > 1.0, f"DeCoPrune is not faster than FullKV ({speedup:.2f}x)")
    report.rows += rows + [{"speedup": round(speedup, 3)}]


def check_host_memory(backbone: WanBackbone, shape: CheckShape, settings: GenerationSettings,
                      report: Report) -> None:
    """(b): resident, parked and host-resident caches give the same continuation."""
    latents = context_latents(backbone, shape.short_context_seconds, seed=1)
    cond = condition(backbone, latents.shape[2], seed=1)
    method = build_method(METHODS[1])
    n = backbone.geometry.chunk_frames
    pre = prefill(backbone, method, latents, cond, seed=2, settings=settings)
    resident = continue_task(backbone, pre, cond, n, seed=3).latents
    pre.cache.park("cpu")
    parked = continue_task(backbone, pre, cond, n, seed=3).latents
    backbone.offload_kv = True
    try:
        pre_host = prefill(backbone, method, latents, cond, seed=2, settings=settings)
        host = continue_task(backbone, pre_host, cond, n, seed=3).latents
    finally:
        backbone.offload_kv = False
    diffs = {name: float((other - resident).abs().max()) for name, other in
             (("parked prefilled cache", parked), ("offload_kv", host))}
    for name, diff in diffs.items():
        report.say(f"[b] {name} vs resident: max abs difference {diff}")
        report.add("b", f"{name} continuation vs resident (max abs)", diff, "0", diff == 0.0)
    report.rows.append({"host_memory_max_diff": diffs})


def check_precision(shape: CheckShape, report: Report) -> None:
    """(c): one chunk's flow, bf16 with float32 islands and with a bf16 residual, against float32."""
    full = build_backbone(shape, seed=5, dtype="float32")
    outs = {}
    variants = {"float32": full.dit, "bf16 + islands": cast(full.dit, True), "bf16 residual": cast(full.dit, False)}
    latents = context_latents(full, shape.short_context_seconds, seed=2)[:, :, : full.geometry.chunk_frames]
    cond = condition(full, latents.shape[2], seed=2)
    for name, dit in variants.items():
        full.dit = dit
        cache = KVCache.from_geometry(full.geometry)
        cache.begin_chunk(0, 0, latents.shape[2])
        with torch.no_grad():
            outs[name] = full.velocity(latents, 0.899, cache, 0, cond).cpu()
    err = {k: float((outs[k] - outs["float32"]).norm() / outs["float32"].norm()) for k in variants if k != "float32"}
    report.say("[c] relative error vs float32: " + ", ".join(f"{k} {v:.2e}" for k, v in err.items()))
    report.add("c", "bf16 with float32 islands vs float32 (relative L2)", err["bf16 + islands"],
               f"< {PRECISION_TOLERANCE:g}", err["bf16 + islands"] < PRECISION_TOLERANCE)
    report.check(err["bf16 + islands"] <= err["bf16 residual"],
                 "the float32 residual stream is not closer to float32 than a bf16 one")
    report.rows.append({"precision_rel_err": err})


def cast(dit, fp32_residual: bool):
    """A bf16 copy of a float32 DiT (the same weights), with or without the float32 residual stream."""
    return cast_for_inference(copy.deepcopy(dit), torch.bfloat16, fp32_residual=fp32_residual)


PARTS = "abcefgh"
"""The parts :func:`run_check` runs by default ((d) runs apart, under torchrun)."""


def run_check(name: str = "1.3b", parts: str = PARTS, folder: Path | None = None) -> Report:
    """Run the named parts at the named shape; the report lists every failed assertion.

    Parameters
    ----------
    name : {"1.3b", "tiny"}
    parts : str
        Letters of the parts: (a)-(c) here, (e)-(h) in :mod:`cmbench.benchmarks.gpu_loan`.
    folder : Path, optional
        Where (h) builds its small suite and runs (default: a temporary folder).
    """
    from cmbench.benchmarks import gpu_loan

    shape = shapes()[name]
    report = Report()
    start = time.perf_counter()
    torch.manual_seed(0)
    if torch.device(shape.device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        report.say(f"[check] {torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / GIB:.1f}"
                   f" GiB; the plan assumes {DEFAULT_DEVICE_GIB:g} GiB where no GPU is visible)")
    tiny = name == "tiny"
    expected = gpu_loan.load_expected() if set(parts) & set("eh") else {}
    loan_parts = {"e": lambda: gpu_loan.check_real_width(report, tiny, shape.device, expected),
                  "f": lambda: gpu_loan.check_quantized_attention(report, tiny, shape.device),
                  "g": lambda: gpu_loan.check_scorer(report, tiny, shape.device),
                  "h": lambda: _in_folder(folder, lambda f: gpu_loan.check_miniworld(report, shape.device, f, expected))}
    if set(parts) & set("abc"):
        _parts_abc(shape, name, parts, report)
    for part, run in loan_parts.items():
        if part in parts:
            began = time.perf_counter()
            run()
            report.say(f"[{part}] done in {time.perf_counter() - began:.0f} s")
    report.say(f"[check] {'OK' if not report.failures else f'{len(report.failures)} FAILED'} in "
               f"{time.perf_counter() - start:.0f} s")
    return report


def _in_folder(folder: Path | None, run) -> None:
    if folder is not None:
        run(folder)
        return
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp))


def _parts_abc(shape: CheckShape, name: str, parts: str, report: Report) -> None:
    """(a), (b) and (c), those of ``parts``."""
    began = time.perf_counter()
    backbone = build_backbone(shape)
    params = sum(p.numel() for p in backbone.dit.parameters())
    report.say(f"[check] {name}: DiT {params / 1e9:.2f} B parameters, {backbone.geometry.num_layers} layers x "
               f"{backbone.geometry.num_heads} heads, {shape.height}x{shape.width}, {shape.dtype} on {shape.device}")
    settings = lingbot_settings()
    warm = context_latents(backbone, 1.0)  # kernels and allocator warmed up before anything is measured
    continue_task(backbone, prefill(backbone, build_method({"name": "fullkv"}), warm,
                                    condition(backbone, warm.shape[2]), 0, settings), condition(backbone, warm.shape[2]),
                  4, 0)
    if "a" in parts:
        check_plan(backbone, shape, settings, report)
    if "b" in parts:
        check_host_memory(backbone, shape, settings, report)
    del backbone
    if torch.device(shape.device).type == "cuda":
        torch.cuda.empty_cache()
    if "c" in parts:
        check_precision(shape, report)
    report.say(f"[a-c] done in {time.perf_counter() - began:.0f} s")


def run_split_check(name: str = "1.3b", seconds: float | None = None) -> Report:
    """(d) under ``torchrun --nproc_per_node=P``: the model split over the ``P`` ranks (Ulysses; NCCL on GPUs,
    gloo on the CPU) against one process on rank 0, FullKV and DeCoPrune at 85% PR over the short context.

    Asserts on every rank: the continuation equals the one-process run (max difference within 1e-2 of the
    output's scale in bf16, 1e-5 on the CPU in float32), the PR ledgers and kept tokens are identical, and
    the rank's peak of stored K/V is ``1/P`` of the one-process peak within 10%.
    """
    import os

    import torch.distributed as dist

    from cmbench.parallel import SequenceGroup, split_backbone

    shape = shapes()[name]
    size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if torch.device(shape.device).type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        shape = replace(shape, device=f"cuda:{torch.cuda.current_device()}")
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        shape = replace(shape, dtype="float32")
    # NCCL for CUDA tensors, gloo for the CPU tensors of the split cache's accounting (NCCL alone refuses them)
    dist.init_process_group("cpu:gloo,cuda:nccl" if "cuda" in shape.device else "gloo")
    report = Report()
    try:
        settings = lingbot_settings()
        backbone = build_backbone(shape)  # the same seeds on every rank: the same random weights
        latents = context_latents(backbone, shape.short_context_seconds if seconds is None else seconds)
        results: dict[str, dict] = {}

        def generate(method_cfg: dict) -> dict:
            method = build_method(method_cfg)
            cond = condition(backbone, latents.shape[2])
            peak = {"kv": 0}

            def note(cache, sig):
                local = getattr(cache, "local_stored_bytes", cache.stored_bytes)()
                peak["kv"] = max(peak["kv"], local)

            pre = prefill(backbone, method, latents, cond, seed=2, settings=settings, on_chunk_end=note)
            cont = continue_task(backbone, pre, cond, backbone.geometry.chunk_frames, seed=3, on_chunk_end=note)
            return {"latents": cont.latents.float().cpu(), "context": pre.ledger.summary(),
                    "generation": cont.ledger.summary(), "kept": cont.kept_tokens, "peak": peak["kv"]}

        methods: tuple[dict[str, Any], ...] = ({"name": "fullkv"}, {"name": "decoprune", "quota_pr": 0.85})
        if rank == 0:
            results = {str(m["name"]): generate(m) for m in methods}
        dist.barrier()
        objects: list[Any] = [results]
        dist.broadcast_object_list(objects, src=0)
        one = objects[0]
        split_backbone(backbone, SequenceGroup(rank, size, check_masks=True))
        tolerance = 1e-5 if shape.dtype == "float32" else 1e-2
        for m in methods:
            mine, ref = generate(m), one[m["name"]]
            scale = float(ref["latents"].abs().max())
            diff = float((mine["latents"] - ref["latents"]).abs().max())
            ratio = mine["peak"] / ref["peak"]
            row = {"method": m["name"], "ranks": size, "rank": rank, "max_diff": diff, "scale": scale,
                   "rank_peak_mib": round(mine["peak"] / 2**20, 2), "one_process_peak_mib": round(ref["peak"] / 2**20, 2),
                   "ratio": round(ratio, 4)}
            report.rows.append(row)
            report.say(f"[d] {row}")
            report.check(diff <= tolerance * max(scale, 1.0), f"{m['name']} rank {rank}: split continuation differs by "
                                                               f"{diff:.3g} (scale {scale:.3g})")
            for key in ("context", "generation", "kept"):
                report.check(mine[key] == ref[key], f"{m['name']} rank {rank}: {key} differs from one process")
            report.check(abs(ratio * size - 1) <= 0.1, f"{m['name']} rank {rank}: peak K/V {ratio:.3f} of one "
                                                          f"process, not 1/{size} within 10%")
    finally:
        dist.destroy_process_group()
    return report
