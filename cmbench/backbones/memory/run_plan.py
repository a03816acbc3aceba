"""A run config -> its memory plan, before anything is loaded; the offloads applied to the backbone config.

Used by ``python -m cmbench plan`` (print it) and by ``run`` (:class:`ModelEvaluator` plans first, then
builds the backbone from :attr:`RunPlan.backbone_config`, and after each prefill calls
:meth:`RunPlan.settle` to trim or park the prefilled cache). The plan applies to backbones with a
``dit:`` block and a ``memory:`` block (the Wan family); any other backbone runs as configured.

Settings (``backbone.memory``): ``offloads`` (``auto`` / ``off``), ``device_gib`` (default: the device's
total, or :data:`DEFAULT_DEVICE_GIB` where no GPU is visible), ``host_gib`` (default: this machine's),
``reserve_gib``, ``context_seconds`` (default: the dataset's longest context, read from its videos'
headers; :data:`DEFAULT_CONTEXT_SECONDS` when they are not here) and ``assume_pr``.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from cmbench.backbones.base import Geometry
from cmbench.backbones.memory.kv import Retention, retention, simulate_kv
from cmbench.backbones.memory.plan import GIB, MemoryPlan, RunShape, choose_plan, refusal
from cmbench.backbones.memory import workspace
from cmbench.backbones.memory.weights import (dit_bytes, largest_tensor_bytes, scorer_bytes, text_encoder_bytes,
                                              text_encoder_config, vae_bytes)
from cmbench.backbones.wan.precision import parse_dtype
from cmbench.cache.quantized import StorageFormat, bytes_per_token, storage_format
from cmbench.cache.block_attention import LOGIT_BYTES
from cmbench.cache.quantized_bank import DECODE_ROWS
from cmbench.cache.rope import RopeSpec
from cmbench.errors import ConfigError

DEFAULT_DEVICE_GIB = 139.0  # one H200 as torch reports it, less what the driver keeps
DEFAULT_CONTEXT_SECONDS = 60.0  # CMBench contexts are about one minute
DEFAULT_RESERVE_GIB = 8.0  # device memory kept free (the authors' runtime keeps an 8 GiB safety margin)
SPATIAL_STRIDE = 8  # the Wan VAE
TEMPORAL_STRIDE = 4


def plans_memory(backbone: Any) -> bool:
    """Whether a backbone config gets a memory plan (it has ``dit`` and ``memory`` blocks)."""
    return "dit" in backbone and "memory" in backbone


def geometry_of(backbone: Any) -> Geometry:
    """The backbone's :class:`Geometry` from its config alone (no weights)."""
    dit = backbone["dit"]
    heads, dim = int(dit["num_heads"]), int(dit["dim"])
    return Geometry(num_layers=int(dit["num_layers"]), num_heads=heads, head_dim=dim // heads,
                    latent_channels=int(dit["out_channels"]), latent_height=int(backbone["height"]) // SPATIAL_STRIDE,
                    latent_width=int(backbone["width"]) // SPATIAL_STRIDE, rope=RopeSpec.wan(dim // heads),
                    patch=tuple(dit.get("patch_size", (1, 2, 2))), chunk_frames=int(backbone["chunk_frames"]))


def context_latent_frames(cfg: Any, backbone: Any) -> tuple[int, str]:
    """Latent frames of the longest context to plan for, and where the number came from."""
    from cmbench.backbones.wan.timeline import prepared_length

    memory, ctx = backbone["memory"], backbone["context"]
    fps, chunk = float(ctx["fps"]), int(backbone["chunk_frames"])
    stride = int(ctx.get("temporal_stride", TEMPORAL_STRIDE))
    seconds = memory.get("context_seconds")
    if seconds is None:
        longest = _longest_dataset_context(cfg)
        if longest is not None:
            frames, source_fps, where = longest
            latent = prepared_length(frames, source_fps, fps, chunk, stride)[1]
            data = cfg.get("data")
            source = f"the longest context of data={data.get('name')} ({where}, {frames / source_fps:.1f} s)"
            if data.get("adapter") == "miniworld":  # a real backbone planned on the CPU stand-in's short contexts
                source += f"; MiniWorld's length, not the paper's: data=cmbench plans its {DEFAULT_CONTEXT_SECONDS:g} s contexts"
            return latent, source
        seconds, why = DEFAULT_CONTEXT_SECONDS, "the dataset's videos are not here"
    else:
        why = "backbone.memory.context_seconds"
    frames = int(round(float(seconds) * fps))
    return prepared_length(frames, fps, fps, chunk, stride)[1], f"a {float(seconds):g} s context ({why})"


def _longest_dataset_context(cfg: Any) -> tuple[int, float, str] | None:
    """(frames, fps, video) of the dataset's longest context video, from the containers' headers."""
    from cmbench.data.manifest import load_manifest
    from cmbench.data.video import probe_video

    data = cfg.get("data") if hasattr(cfg, "get") else None
    if data is None:
        return None
    manifest = Path(str(data["root"])) / str(data["manifest"])
    if not manifest.is_file():
        return None
    try:
        tasks = load_manifest(str(data["root"]), str(data["manifest"]))
        videos = {str(t.video_path) for t in tasks if getattr(t, "video_path", None) is not None}
        probes = [(probe_video(v)[:2], v) for v in sorted(videos) if Path(v).is_file()]
    except Exception:  # an unreadable dataset is `validate`'s business; plan with the default length
        return None
    if not probes:
        return None
    (frames, fps), video = max(probes, key=lambda p: p[0][0] / max(p[0][1], 1e-9))
    return int(frames), float(fps), Path(video).name


def _component_folder(backbone: Any, key: str) -> Path | None:
    explicit = backbone.get(key)
    if explicit:
        return Path(str(explicit)).expanduser()
    components = backbone.get("components")
    return Path(str(components)).expanduser() / key if components else None


def scorer_device_shared(cfg: Any, device: torch.device) -> bool:
    """Whether the scorer runs on the backbone's GPU (``auto`` means the GPU in a GPU run)."""
    scorer = cfg.get("scorer") if hasattr(cfg, "get") else None
    if scorer is None or device.type != "cuda":
        return False
    where = str(scorer.get("device", "auto"))
    return where in ("auto", "cuda", str(device))


@dataclass(frozen=True)
class ModelBytes:
    """Bytes of the models a run keeps on the device (``scorer``: 0 when it runs elsewhere)."""

    dit: int
    vae: int
    text: int
    scorer: int = 0
    largest_tensor: int = 0
    text_work: int = 0  # one prompt through the text encoder (workspace.text_call)


def shape_of(name: str, geometry: Geometry, dit: Any, models: ModelBytes, method: Any, compute_bytes: int,
             height: int, width: int, text_len: int, vae_scale: float, context_frames: int,
             continuation_frames: int, assume_pr: float | None = None, notes: tuple[str, ...] = (),
             on_cpu: bool = False, sequence: int = 1, context_source: str = "",
             storage: StorageFormat | None = None) -> RunShape:
    """A :class:`RunShape` from the geometry, the DiT's fields, the model bytes and the method.

    Parameters
    ----------
    name : str
    geometry : Geometry
    dit : mapping
        The DiT's fields (``dim``, ``ffn_dim``, ``in_channels``, ``out_channels``, ``text_dim``, ``camera_dim``).
    models : ModelBytes
    method : Method
    compute_bytes : int
        Bytes per value of the DiT's compute dtype (and of the cached K/V).
    height, width, text_len, context_frames, continuation_frames : int
    vae_scale : float
        See :func:`~cmbench.backbones.memory.workspace.vae_scale`.
    assume_pr : float, optional
        See :func:`~cmbench.backbones.memory.kv.retention`.
    notes : tuple of str
    on_cpu : bool
        The device is the CPU (the cache's provenance then shares its memory).
    storage : StorageFormat, optional
        How the banks store history (default full precision): bytes per head-token of the replay.
    sequence : int
        Ranks per model (Ulysses sequence parallelism): the KV cache replayed is one rank's heads (the
        rank with the largest peak, :func:`cmbench.parallel.cache.local_layout`), the DiT call one rank's
        tokens; the weights are replicated on every rank.
    context_source : str
        Where the context length came from.
    """
    from cmbench.parallel.cache import local_layout
    from cmbench.parallel.sequence import check_heads

    g = geometry
    ret: Retention = retention(method, assume_pr, g)
    check_heads(g.num_heads, g.tokens_per_frame, sequence)
    per_rank = g.num_heads // sequence
    storage = storage or StorageFormat()
    token_bytes = bytes_per_token(storage, g.head_dim, compute_bytes, g.tokens_per_frame, g.tokens_per_chunk)
    timelines = []
    for rank in range(sequence):
        layout = local_layout(method.layout(g), rank * per_rank, per_rank)
        groups = [[(len(group.heads), group.max_tokens) for group in layer] for layer in layout]
        timelines.append(simulate_kv(g.num_layers, groups, g.head_dim, compute_bytes, g.tokens_per_chunk,
                                     math.ceil(context_frames / g.chunk_frames),
                                     math.ceil(continuation_frames / g.chunk_frames), ret, provenance=on_cpu,
                                     token_bytes=token_bytes,
                                     slot_bytes=2 * g.head_dim * compute_bytes if storage.quantized else 0))
    kv = max(timelines, key=lambda t: (max(t.prefill_peak, t.prefilled_stored + t.continuation_peak), t.host_peak))
    per_frame = g.tokens_per_frame * g.num_layers * g.num_heads * g.head_dim * 2 * compute_bytes
    notes = (*notes, f"method {method.name}: {ret.note}; KV per latent frame {per_frame / GIB:.3f} GiB")
    device = "cpu" if on_cpu else "cuda"
    decode_rows = DECODE_ROWS if storage.quantized else 0
    longest = (context_frames + continuation_frames - g.chunk_frames) * g.tokens_per_frame
    attention = workspace.attention_call(g.tokens_per_chunk, longest, per_rank, g.head_dim, compute_bytes, device,
                                         decode_rows)
    notes = (*notes, f"attention workspace per call, modelled for {device} kernels: {attention / 2**20:.1f} MiB at "
                     f"the longest history (within the DiT call; a fork's join of the rows it shares is in its KV)")
    if storage.quantized:
        fp_bytes = 2 * g.head_dim * compute_bytes
        history = (context_frames + continuation_frames) * g.tokens_per_frame
        rows = min(DECODE_ROWS, history)
        entry = storage.codecs()[0].entry_rows(g.tokens_per_frame, g.tokens_per_chunk)
        span = min(DECODE_ROWS + entry - 1, history)  # a re-index span ends at the first entry boundary past a block
        row_mib = 2 * per_rank * g.head_dim * compute_bytes / 2**20  # decoded K and V of one token of one bank
        knobs = (f"rank {storage.rank} (keys on the calibrated basis, values float16" if storage.name == "lowrank"
                 else f"{storage.bits}-bit (group {storage.group_size}")
        notes = (*notes, f"storage {storage.name} {knobs}, recent window "
                         f"{storage.residual}): {token_bytes:.1f} bytes per head-token vs {fp_bytes} in full precision "
                         f"({token_bytes / fp_bytes:.3f}); attention decodes {rows} history tokens at a time: "
                         f"{rows * row_mib:.1f} MiB of workspace and at most {LOGIT_BYTES / 2**20:.0f} MiB of float32 "
                         f"logits where no fused kernel takes a block; the re-index at most {span} tokens at a time ({span * row_mib:.1f} MiB); not in the KV peak")
    if sequence > 1:
        notes = (*notes, f"split over {sequence} ranks (parallel.sequence): {per_rank} of {g.num_heads} heads of the "
                         f"KV cache and 1/{sequence} of every frame's tokens per rank; weights, VAE and text "
                         f"encoder replicated on every rank (no FSDP)")
    label = method.name if getattr(method, "quota_pr", None) is None else f"{method.name} @ PR {method.quota_pr:g}"
    split = f" / {sequence} ranks" if sequence > 1 else ""
    return RunShape(
        name=f"{name} + {label}{split}", dit=models.dit, vae=models.vae, text=models.text, scorer=models.scorer,
        largest_tensor=models.largest_tensor, tokens_per_chunk=g.tokens_per_chunk, dim=int(dit["dim"]),
        ffn_dim=int(dit["ffn_dim"]), compute_bytes=compute_bytes, text_len=text_len,
        text_dim=int(dit.get("text_dim") or 0), height=height, width=width, chunk_frames=g.chunk_frames,
        context_frames=int(context_frames), continuation_frames=int(continuation_frames),
        i2v=int(dit["in_channels"]) > int(dit["out_channels"]), vae_scale=vae_scale, kv=kv,
        kv_exact=ret.exact, camera_values=int(dit.get("camera_dim") or 0) * math.prod(g.patch),
        text_work=models.text_work, notes=notes, sequence=sequence, context_source=context_source,
        heads=per_rank, head_dim=g.head_dim, device=device, decode_rows=decode_rows)


def run_shape(cfg: Any, method: Any, context_frames: int | None = None) -> RunShape:
    """Every quantity the plan needs, from a resolved root config and the built method (no weights read).

    Parameters
    ----------
    cfg : mapping
        The resolved root config (``backbone``, ``generation``, ``data``, ``scorer``).
    method : Method
    context_frames : int, optional
        Context latent frames (default: :func:`context_latent_frames`).
    """
    backbone = cfg["backbone"]
    dit = backbone["dit"]
    device = torch.device(str(backbone.get("device", "cuda")))
    dtype = str(backbone.get("dtype", "bfloat16"))
    notes = []
    where = "given"
    if context_frames is None:
        context_frames, where = context_latent_frames(cfg, backbone)
    text_dtype, vae_dtype = str(backbone.get("text_dtype", "bfloat16")), str(backbone.get("vae_dtype", "float32"))
    text_folder = _component_folder(backbone, "text_encoder")
    text, text_source = text_encoder_bytes(text_folder, text_dtype)
    text_cfg = text_encoder_config(text_folder)[0]
    text_len = int(backbone.get("text_len", 512))
    text_work = workspace.text_call(text_len, text_cfg.d_model, text_cfg.d_ff, text_cfg.num_heads,
                                    torch.empty((), dtype=parse_dtype(text_dtype)).element_size())
    vae, vae_source, vae_width = vae_bytes(_component_folder(backbone, "vae"), vae_dtype)
    fp32_residual = bool(backbone.get("fp32_residual", False))
    dit_total = dit_bytes(dit, dtype, fp32_residual)
    islands = "float32 islands incl. residual stream and head" if fp32_residual else "float32 islands"
    notes.append(f"DiT {dit_total / GIB:.2f} GiB ({dtype}, {islands}); text encoder {text / GIB:.2f} GiB "
                 f"({text_source}); VAE {vae / GIB:.2f} GiB ({vae_source})")
    scorer_total = 0
    if scorer_device_shared(cfg, device):
        scorer_total, scorer_notes = scorer_bytes(cfg["scorer"])
        notes += [f"scorer on the same device: {n}" for n in scorer_notes]
    models = ModelBytes(dit_total, vae, text, scorer_total, largest_tensor_bytes(dit), text_work)
    return shape_of(str(backbone.get("name", "backbone")), geometry_of(backbone), dit, models, method,
                    torch.empty((), dtype=parse_dtype(dtype)).element_size(), int(backbone["height"]),
                    int(backbone["width"]), text_len,
                    workspace.vae_scale(torch.empty((), dtype=parse_dtype(vae_dtype)).element_size(), vae_width),
                    int(context_frames),
                    int(cfg["generation"]["continuation_frames"]), backbone["memory"].get("assume_pr"), tuple(notes),
                    on_cpu=device.type == "cpu", sequence=int((cfg.get("parallel") or {}).get("sequence", 1)),
                    context_source=where, storage=storage_format(cfg.get("storage")))


def configured_offloads(backbone: Any) -> tuple[str, ...]:
    """Offloads the backbone config already asks for."""
    out = []
    if str(backbone.get("text_device") or "") == "cpu":
        out.append("text_cpu")
    if backbone.get("offload_kv"):
        out.append("offload_kv")
    if (backbone.get("memory") or {}).get("park_prefill"):
        out.append("park_prefill")
    return tuple(out)


def capacities(backbone: Any) -> tuple[int | None, int | None, int, str]:
    """(device bytes, host bytes, reserve bytes) to plan against, and a note when the device's bytes are
    assumed (no GPU visible and no ``backbone.memory.device_gib``: :data:`DEFAULT_DEVICE_GIB`, an H200)."""
    memory = backbone["memory"]
    device = torch.device(str(backbone.get("device", "cuda")))
    if memory.get("host_gib") is not None:
        host_bytes = int(float(memory["host_gib"]) * GIB)
    else:
        host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    note = ""
    if memory.get("device_gib") is not None:
        device_bytes = int(float(memory["device_gib"]) * GIB)
    elif device.type == "cpu":
        device_bytes = host_bytes
    elif device.type == "cuda" and torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count():
        device_bytes = int(torch.cuda.get_device_properties(device).total_memory)
    else:
        device_bytes = int(DEFAULT_DEVICE_GIB * GIB)
        note = ("an assumed H200, as no GPU is visible here (backbone.memory.device_gib=G plans for another "
                "device)")
    return device_bytes, host_bytes, int(float(memory.get("reserve_gib", DEFAULT_RESERVE_GIB)) * GIB), note


def plan_for(cfg: Any, method: Any, context_frames: int | None = None) -> MemoryPlan:
    """The chosen plan for a resolved root config (``backbone.memory.offloads``: ``auto`` or ``off``)."""
    backbone = cfg["backbone"]
    mode = str(backbone["memory"].get("offloads", "auto"))
    if mode not in ("auto", "off"):
        raise ConfigError(f"backbone.memory.offloads must be 'auto' or 'off', got {mode!r}")
    device_bytes, host_bytes, reserve, device_note = capacities(backbone)
    shape = run_shape(cfg, method, context_frames)
    on_host = torch.device(str(backbone.get("device", "cuda"))).type == "cpu"  # nothing to offload to
    plan = choose_plan(shape, device_bytes, None if on_host else host_bytes, reserve, configured_offloads(backbone),
                       auto=mode == "auto" and not on_host)
    plan.device_note = device_note
    return plan


@dataclass
class RunPlan:
    """What ``run`` does with the plan: the backbone config to build, and what happens after a prefill.

    Attributes
    ----------
    plan : MemoryPlan or None
        ``None`` for a backbone without a memory plan (the tiny model).
    backbone_config : DictConfig
        The backbone config with the chosen offloads applied (``text_device``, ``offload_kv``).
    park_prefill : bool
        Move each prefilled cache to host memory while its tasks run.
    """

    plan: MemoryPlan | None
    backbone_config: Any
    park_prefill: bool = False

    def settle(self, cache) -> None:
        """After a prefill: park the cache in host memory, or trim it to its history where it is (a no-op
        without a plan)."""
        if self.plan is None:
            return
        if self.park_prefill:
            cache.park("cpu")
        else:
            cache.trim()


def plan_run(cfg: Mapping[str, Any], method: Any) -> RunPlan:
    """Plan before loading anything; apply the offloads or refuse with a :class:`ConfigError`.

    Parameters
    ----------
    cfg : mapping
        ``backbone``, ``data``, ``scorer`` and ``generation`` (``continuation_frames``) resolved, as
        plain mappings or a root config.
    method : Method

    Returns
    -------
    RunPlan
    """
    backbone = cfg["backbone"]
    if not plans_memory(backbone):
        return RunPlan(None, backbone)
    plan = plan_for(cfg, method)
    if not plan.fits:
        raise ConfigError(refusal(plan))
    applied = OmegaConf.to_container(backbone, resolve=True) if isinstance(backbone, DictConfig) \
        else copy.deepcopy(dict(backbone))
    assert isinstance(applied, dict)
    if "text_cpu" in plan.offloads:
        applied["text_device"] = "cpu"
    if "offload_kv" in plan.offloads:
        applied["offload_kv"] = True
    return RunPlan(plan, OmegaConf.create(applied), park_prefill="park_prefill" in plan.offloads)
