"""KV storage formats against full precision: attention error on the tiny model's real K/V, bytes, and
attention time at a long history (``scripts/bench_kv_formats.py``; docs/kv_formats.md).

Error
    The tiny model prefills one MiniWorld context with FullKV in full precision (the re-index applied).
    Its stored history is written, chunk by chunk, into a cache of each format; the model's queries,
    keys and values of the first continuation chunk's first denoising call (recorded per layer from the
    full-precision cache) then attend over each cache. The error of a format is
    ``||out_format - out_fp|| / ||out_fp||`` over every layer's output; its reconstruction error the same
    ratio over every layer's stored keys and values (decoded against the originals); its bytes are the
    cache's ``stored_bytes()`` against full precision's.
Time
    At ``frames`` latent frames of the tiny model's geometry (64 tokens a frame, 4 heads of head dim 32;
    random K/V, the content does not change the arithmetic), one layer's ``attend`` call of a chunk (256
    queries) over the whole history, in each format and in full precision, in interleaved rounds
    (medians); ratio = format / fp at the same token count.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import cast

import torch

from cmbench.backbones.tiny import DEFAULT_WEIGHTS, TinyWorldModel
from cmbench.benchmarks.speed import make_context
from cmbench.cache import KVCache
from cmbench.cache.lowrank import basis_path
from cmbench.cache.quantized import StorageFormat
from cmbench.generation import prefill
from cmbench.methods.fullkv import FullKV

TINY_BASIS = str(basis_path(DEFAULT_WEIGHTS))
FORMATS = (
    StorageFormat("kivi", bits=4, group_size=32, residual=128),
    StorageFormat("kivi", bits=2, group_size=32, residual=128),
    StorageFormat("chunkmean", bits=4, group_size=16, residual=0, stages=1),
    StorageFormat("chunkmean", bits=2, group_size=16, residual=0, stages=2),
    StorageFormat("qvg", bits=2, group_size=32, residual=0, stages=1, clusters=16, iters=10),
    StorageFormat("qvg", bits=2, group_size=32, residual=0, stages=2, clusters=16, iters=10),
    StorageFormat("qvg", bits=4, group_size=32, residual=0, stages=1, clusters=16, iters=10),
    StorageFormat("lowrank", rank=8, residual=0, basis=TINY_BASIS),
    StorageFormat("lowrank", rank=16, residual=0, basis=TINY_BASIS),
    StorageFormat("lowrank", rank=24, residual=0, basis=TINY_BASIS),
)
"""The formats measured (each against full precision in the same run): chunkmean is the codec CMBench called
qvg before it followed Quant VideoGen's paper; lowrank reads the tiny model's committed key basis."""


@dataclass(frozen=True)
class FormatError:
    """One format on one context: attention output error, K/V reconstruction error and bytes against full
    precision."""

    name: str
    rel_error: float
    stored_bytes: int
    fp_bytes: int
    kv_error: float


@dataclass(frozen=True)
class FormatTime:
    """Median seconds of one layer's attention call over ``tokens`` history tokens."""

    name: str
    tokens: int
    seconds: float
    fp_seconds: float


def name_of(fmt: StorageFormat) -> str:
    """``fp`` or the format as run labels write it (``kivi4-g32-r128``, ``lowrank8-r0``)."""
    from cmbench.identity.labels import storage_suffix

    return "fp" if not fmt.quantized else storage_suffix(fmt.knobs() | {"basis": None})[1:]


class _Recorder:
    """A cache proxy recording every layer's first ``attend`` inputs ``(q, k, v)`` (each ``[B, L, H, D]``)."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.calls: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __getattr__(self, name):
        return getattr(self.cache, name)

    def attend(self, layer, q, k, v):
        self.calls.setdefault(layer, (q.clone(), k.clone(), v.clone()))
        return self.cache.attend(layer, q, k, v)


def replay(source: KVCache, fmt: StorageFormat) -> KVCache:
    """A cache in ``fmt`` holding ``source``'s history (each layer's one bank, chunk by chunk, as stored)."""
    out = KVCache(source.num_layers, source.num_heads, source.head_dim, source.tokens_per_frame, source.rope,
                  compute_attention=False)
    if fmt.quantized:
        out.use_storage(fmt)
    start = 0
    for info in source.chunks:
        out.begin_chunk(info.index, info.frame_start, info.num_frames)
        for layer in range(source.num_layers):
            k, v = source.banks[layer][0].history()
            part_k, part_v = k[:, start : start + info.length], v[:, start : start + info.length]
            out.attend(layer, part_k, part_k, part_v)
        out.commit_chunk()
        start += info.length
    out.compute_attention = True
    return out


def attention_errors(context_frames: int = 48, seed: int = 0,
                     formats: tuple[StorageFormat, ...] = FORMATS) -> list[FormatError]:
    """Each format's attention error and bytes on the committed tiny model's K/V of one context."""
    backbone = TinyWorldModel.from_pretrained()
    g = backbone.geometry
    latents, plan = make_context(backbone, context_frames, g.chunk_frames, seed)
    pre = prefill(backbone, FullKV(), latents, plan, seed)
    recorder = _Recorder(pre.cache.fork())
    recorder.cache.begin_chunk(pre.next_chunk, pre.context_frames, g.chunk_frames)
    noise = torch.randn(1, g.latent_channels, g.chunk_frames, g.latent_height, g.latent_width,
                        generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        backbone.denoise(noise, 0.999, cast(KVCache, recorder), pre.context_frames, plan)
    reference = replay(pre.cache, StorageFormat())
    fp_out = _outputs(reference, recorder.calls)
    ref = torch.linalg.vector_norm(torch.stack([b.norm() for b in fp_out]))
    out = []
    for fmt in formats:
        cache = replay(pre.cache, fmt)
        kv = _kv_error(cache, reference)
        got = _outputs(cache, recorder.calls)
        err = torch.linalg.vector_norm(torch.stack([(a - b).norm() for a, b in zip(got, fp_out)]))
        out.append(FormatError(name_of(fmt), float(err / ref), cache.stored_bytes(), reference.stored_bytes(), kv))
    return out


def _kv_error(cache: KVCache, reference: KVCache) -> float:
    """``||decoded - original|| / ||original||`` over every layer's stored keys and values."""
    diff, norm = [], []
    for bank, ref in zip(cache.all_banks(), reference.all_banks()):
        for got, want in zip(bank.history(), ref.history()):
            diff.append((got - want).norm())
            norm.append(want.norm())
    return float(torch.linalg.vector_norm(torch.stack(diff)) / torch.linalg.vector_norm(torch.stack(norm)))


def _outputs(cache: KVCache, calls: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """Every layer's attention of the recorded call over ``cache`` (the next chunk opened for it)."""
    info = cache.chunks[-1]
    cache.begin_chunk(info.index + 1, info.frame_end, info.num_frames)
    return [cache.attend(layer, *calls[layer]) for layer in range(cache.num_layers)]


def filled(fmt: StorageFormat, frames: int, seed: int = 0, geometry=None, device: str = "cpu",
           dtype: torch.dtype = torch.float32) -> tuple[KVCache, tuple[torch.Tensor, ...]]:
    """A one-layer cache in ``fmt`` of ``geometry`` (default the tiny model's) holding ``frames`` latent frames of
    random K/V on ``device``, with the next chunk open; and that chunk's ``(q, k, v)``, each
    ``[1, tokens_per_chunk, heads, head_dim]`` (the tiny model's: ``[1, 256, 4, 32]``) in ``dtype``."""
    g = geometry or TinyWorldModel.from_pretrained().geometry
    cache = KVCache(1, g.num_heads, g.head_dim, g.tokens_per_frame, g.rope, compute_attention=False)
    if fmt.quantized:
        cache.use_storage(fmt)
    gen = torch.Generator().manual_seed(seed)
    shape = (1, g.tokens_per_chunk, g.num_heads, g.head_dim)

    def randn() -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)

    for chunk in range(frames // g.chunk_frames):
        k, v = randn(), randn()
        cache.begin_chunk(chunk, chunk * g.chunk_frames, g.chunk_frames)
        cache.attend(0, k, k, v)
        cache.commit_chunk()
    cache.compute_attention = True
    cache.begin_chunk(frames // g.chunk_frames, frames, g.chunk_frames)
    q, k, v = (randn() for _ in range(3))
    return cache, (q, k, v)


def attention_times(frames: int = 768, rounds: int = 7,
                    formats: tuple[StorageFormat, ...] = FORMATS) -> list[FormatTime]:
    """Median seconds of one attention call over ``frames`` frames of history, per format and for fp,
    measured in interleaved rounds."""
    everyone = (StorageFormat(), *formats)
    caches = [filled(fmt, frames) for fmt in everyone]
    times: list[list[float]] = [[] for _ in everyone]
    for _ in range(rounds):
        for i, (cache, (q, k, v)) in enumerate(caches):
            start = time.perf_counter()
            cache.attend(0, q, k, v)
            times[i].append(time.perf_counter() - start)
    fp = statistics.median(times[0])
    tokens = caches[0][0].banks[0][0].n
    return [FormatTime(name_of(fmt), tokens, statistics.median(t), fp) for fmt, t in zip(formats, times[1:])]
