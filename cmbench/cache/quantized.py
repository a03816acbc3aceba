"""Quantized KV storage: the bank formats ``kivi``, ``qvg`` and ``chunkmean`` beside the full-precision ``fp``.

A format decides how a bank holds its history rows; what a method sees (rows, provenance, eviction,
restore, forks) does not change. Every history row is *encoded* when its chunk is committed, into one
``uint8`` row per side (keys, values) that the bank moves, gathers, shares and copies like any other
row; the parameters that several rows share live in a per-bank *table* keyed by provenance.

``kivi`` (KIVI: keys per channel, values per token)
    Keys: each channel of a *key group* (``group_size`` consecutive token positions of one latent
    frame) is quantized to ``bits`` with one zero point and one scale, kept in the key table (keyed
    by ``(frame, pos // group_size)``); a row holds only its packed codes. Values: each token's
    channels in groups of ``group_size`` get their own zero point and scale, stored in the row.
``qvg`` (Quant VideoGen, arXiv 2602.02958, as its authors' code builds it)
    Keys and values alike, per chunk, layer and head. *Semantic-aware smoothing*: the chunk's tokens are
    clustered by k-means into ``clusters`` groups and each token's centroid is subtracted. *Progressive
    residual quantization*: each of ``stages`` k-means stages clusters what the previous stage left (stage
    ``s`` is a vector quantizer of stage ``s - 1``'s residual), and the last residual is quantized to
    ``bits`` per element, symmetric (``code = round(x / scale)`` in ``[-q, q]``, ``q = 2**(bits-1) - 1``,
    ``scale = absmax / q``) with one scale per ``group_size`` channels. Stored: the centroids of every
    stage (``float16``, the table keyed by chunk), and per token and head one ``uint8`` cluster id per
    stage, the packed codes and the ``float16`` scales (the row).
``chunkmean`` (the per-chunk-mean codec CMBench called ``qvg`` before it followed the paper)
    Keys and values alike: the chunk's mean (per head and channel, ``float16``, the table keyed by chunk)
    is subtracted, the residual is quantized per token in channel groups with a zero point and a scale,
    and each further stage (``stages``) quantizes what the previous stages left.

Each keeps the last ``residual`` committed tokens in full precision (KIVI's recent window), once: a row
in the window is held only there (attention reads it from that copy) and is encoded when a newer chunk
pushes it out, on the table entries fitted when its chunk was committed. Codes are packed ``8 // bits``
to a byte; zero points, scales, means and centroids are ``float16``.

kivi and chunkmean quantize asymmetrically: ``zero = min``, ``scale = (max - min) / (2**bits - 1)``
rounded in ``float16`` so that the range is covered, codes ``round((x - zero) / scale)``; a decoded entry
is ``zero + code * scale``, within ``scale / 2`` of the original (per stage, of what that stage saw).
qvg's scale is rounded up in ``float16`` likewise, so a decoded residual is within ``scale / 2`` too.

The bank's ``stored_bytes()`` is the exact device size of what it holds for its history: the encoded
rows outside the recent window (codes and in-row parameters), the table entries its rows use, and the
full-precision recent window.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

import torch

from cmbench.cache.codec import PARAM, Codec, Table, as_bytes, from_bytes
from cmbench.cache.lowrank import Float16Rows, LowRankKeys, lowrank_codecs
from cmbench.errors import ConfigError

FORMATS = ("fp", "kivi", "qvg", "chunkmean", "lowrank")
BITS = (2, 4, 8)
MAX_CLUSTERS = 256  # a cluster id is one uint8


@dataclass(frozen=True)
class StorageFormat:
    """How banks store their history.

    Attributes
    ----------
    name : str
        ``fp`` (the cache's dtype, unchanged), ``kivi``, ``qvg``, ``chunkmean`` or ``lowrank``
        (:mod:`cmbench.cache.lowrank`).
    bits : int
        Bits per code (2, 4 or 8).
    group_size : int
        Channels per quantization group of a token (values; qvg and chunkmean keys too; must divide the
        head dim) and token positions per key group (kivi keys).
    residual : int
        Most recent committed tokens kept in full precision instead of encoded (>= 0).
    stages : int
        qvg: k-means stages, each clustering the previous stage's residual; chunkmean: quantization stages
        of a token; kivi uses one.
    clusters : int or None
        qvg: k-means clusters of each stage, per chunk, layer and head (1 to 256, at most a chunk's tokens).
    iters : int or None
        qvg: k-means iterations (assign, then move each centroid to its tokens' mean) of each stage.
    rank : int or None
        lowrank: coefficients a key keeps (1 to the head dim).
    basis : str or None
        lowrank: the key basis file (``None`` in a config: the one beside the backbone's weights).
    """

    name: str = "fp"
    bits: int = 4
    group_size: int = 32
    residual: int = 0
    stages: int = 1
    clusters: int | None = None
    iters: int | None = None
    rank: int | None = None
    basis: str | None = None

    @property
    def quantized(self) -> bool:
        return self.name != "fp"

    def label(self) -> str:
        """How the format reads in a run label (``kivi4``, ``qvg2x1k16``, ``chunkmean2x2``); ``""`` for ``fp``."""
        if not self.quantized:
            return ""
        if self.name == "qvg":
            return f"qvg{self.bits}x{self.stages}k{self.clusters}"
        if self.name == "lowrank":
            return f"lowrank{self.rank}"
        stages = f"x{self.stages}" if self.name == "chunkmean" else ""
        return f"{self.name}{self.bits}{stages}"

    def knobs(self, fingerprint: Callable[[str], str] | None = None) -> dict[str, object]:
        """The knobs that define the format (those a format does not use, ``None``, left out): what a run's
        identity hashes, so that a kivi run hashes as it did before qvg's knobs existed.

        Parameters
        ----------
        fingerprint : callable ``path -> str``, optional
            What names lowrank's basis file by its content, not where it is (a run's identity passes
            :func:`cmbench.identity.code.file_fingerprint`); without it, or for a basis that is not a file,
            the basis is named by its path.
        """
        if self.name == "lowrank":
            basis = self.basis
            if fingerprint is not None and basis and Path(basis).is_file():
                basis = fingerprint(basis)
            return {"name": self.name, "rank": self.rank, "residual": self.residual, "basis": basis}
        return {k: v for k, v in asdict(self).items() if v is not None}

    def check(self, head_dim: int | None = None, chunk_tokens: int | None = None) -> "StorageFormat":
        """The format itself when its knobs are valid (``head_dim``: also that ``group_size`` divides it;
        ``chunk_tokens``: also that qvg's clusters fit in a chunk).

        Raises
        ------
        ConfigError
            One line naming the key and its limit.
        """
        if self.name not in FORMATS:
            raise ConfigError(f"storage.name={self.name!r}: expected one of {', '.join(FORMATS)}")
        if not self.quantized:
            return self
        if not _whole(self.residual) or self.residual < 0:
            raise ConfigError(f"storage.residual={self.residual!r}: expected a whole number of tokens >= 0")
        if self.name == "lowrank":  # keys projected, values kept: no bits, groups or stages
            if not _whole(self.rank) or self.rank < 1:  # type: ignore[operator]
                raise ConfigError(f"storage.rank={self.rank!r}: expected a whole number of key coefficients >= 1")
            if head_dim is not None and self.rank > head_dim:  # type: ignore[operator]
                raise ConfigError(f"storage.rank={self.rank}: above the head dim {head_dim} (at most {head_dim})")
            return self
        if self.bits not in BITS:
            raise ConfigError(f"storage.bits={self.bits!r}: expected one of {', '.join(map(str, BITS))}")
        if not _whole(self.group_size) or self.group_size < 1:
            raise ConfigError(f"storage.group_size={self.group_size!r}: expected a whole number >= 1")
        if head_dim is not None and head_dim % self.group_size:
            raise ConfigError(f"storage.group_size={self.group_size}: must divide the head dim {head_dim}")
        if not _whole(self.stages) or not 1 <= self.stages <= 4:
            raise ConfigError(f"storage.stages={self.stages!r}: expected a whole number in [1, 4]")
        if self.name == "kivi" and self.stages != 1:
            raise ConfigError(f"storage.stages={self.stages}: kivi quantizes in one stage (stages=1)")
        if self.rank is not None or self.basis is not None:
            raise ConfigError(f"storage.rank={self.rank!r}: only lowrank projects keys")
        if self.name != "qvg":
            for knob in ("clusters", "iters"):
                if getattr(self, knob) is not None:
                    raise ConfigError(f"storage.{knob}={getattr(self, knob)!r}: only qvg clusters tokens")
            return self
        if not _whole(self.clusters) or not 1 <= self.clusters <= MAX_CLUSTERS:  # type: ignore[operator]
            raise ConfigError(f"storage.clusters={self.clusters!r}: expected a whole number in [1, {MAX_CLUSTERS}] "
                              "(a cluster id is one byte)")
        if chunk_tokens is not None and self.clusters > chunk_tokens:  # type: ignore[operator]
            raise ConfigError(f"storage.clusters={self.clusters}: more clusters than a chunk's {chunk_tokens} "
                              f"tokens (at most {chunk_tokens})")
        if not _whole(self.iters) or self.iters < 1:  # type: ignore[operator]
            raise ConfigError(f"storage.iters={self.iters!r}: expected a whole number of k-means iterations >= 1")
        return self

    def codecs(self, layer: int | None = None, heads: tuple[int, ...] | None = None) -> tuple["Codec", "Codec"]:
        """The key and value codecs of a quantized format (lowrank: of layer ``layer``'s bank of ``heads``,
        on their bases; without them, codecs that only say their widths)."""
        if self.name == "lowrank":
            assert self.rank is not None
            if layer is None or heads is None or self.basis is None:
                return LowRankKeys(self.rank, torch.zeros(0)), Float16Rows()
            return lowrank_codecs(self.basis, self.rank, layer, heads)
        if self.name == "kivi":
            return ChannelGroups(self.bits, self.group_size), TokenGroups(self.bits, self.group_size, 1, False)
        if self.name == "chunkmean":
            side: Codec = TokenGroups(self.bits, self.group_size, self.stages, True)
            return side, side
        if self.name == "qvg":
            assert self.clusters is not None and self.iters is not None
            side = ClusteredResidual(self.bits, self.group_size, self.stages, self.clusters, self.iters)
            return side, side
        raise ValueError(f"storage {self.name!r} stores rows unencoded")

    def row_bytes(self, head_dim: int) -> int:
        """Bytes of one token of one head in the rows (keys + values; tables and the recent window apart)."""
        if not self.quantized:
            raise ValueError("row_bytes is for quantized formats")
        key, value = self.codecs()
        return key.width(head_dim) + value.width(head_dim)

    def fixed_bytes(self, heads: int, head_dim: int) -> int:
        """Bytes a bank of ``heads`` heads holds whatever its history (lowrank: its heads' ``float16`` bases)."""
        return heads * head_dim * self.rank * PARAM.itemsize if self.name == "lowrank" else 0  # type: ignore[operator]


def history_bytes(fmt: StorageFormat, tokens: int, heads: int, head_dim: int, batch: int, element_bytes: int,
                  key_groups: int = 0, chunks: int = 0, recent: int = 0) -> int:
    """Bytes a bank of ``heads`` heads holds for ``tokens`` history tokens in ``fmt``, counted from the
    format's layout alone (what :meth:`QuantizedBank.stored_bytes` must equal).

    Parameters
    ----------
    fmt : StorageFormat
    tokens, heads, head_dim, batch : int
    element_bytes : int
        Bytes of one element in the model's precision (fp rows and the recent window).
    key_groups : int
        Distinct kivi key groups ``(frame, pos // group_size)`` among the tokens.
    chunks : int
        Distinct chunks among the tokens (the entries of qvg's centroids and chunkmean's means).
    recent : int
        Tokens in the recent window (at most ``residual``): held in full precision only.
    """
    per_head = batch * heads
    if not fmt.quantized:
        return 2 * tokens * per_head * head_dim * element_bytes
    key, value = fmt.codecs()
    rows = (tokens - recent) * per_head * (key.width(head_dim) + value.width(head_dim))
    tables = sum((key_groups if codec.key_kind == "key group" else chunks) * codec.entry_bytes(head_dim)
                 for codec in (key, value))
    fixed = fmt.fixed_bytes(heads, head_dim)
    return rows + tables * per_head + 2 * recent * per_head * head_dim * element_bytes + fixed


def bytes_per_token(fmt: StorageFormat, head_dim: int, element_bytes: int, tokens_per_frame: int,
                    chunk_tokens: int) -> float:
    """Bytes one history token of one head costs in ``fmt`` over a long history (the rows, and the table
    entries shared by a key group or a chunk spread over their tokens; the recent window, a constant, apart)."""
    if not fmt.quantized:
        return 2.0 * head_dim * element_bytes
    frames = chunk_tokens // tokens_per_frame
    groups = frames * -(-tokens_per_frame // fmt.group_size)  # key groups of one chunk
    held = history_bytes(fmt, chunk_tokens, 1, head_dim, 1, element_bytes, key_groups=groups, chunks=1)
    return (held - fmt.fixed_bytes(1, head_dim)) / chunk_tokens


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


QVG_DEFAULTS = {"clusters": 16, "iters": 10}
"""qvg's k-means knobs where a ``storage`` block leaves them out (configs/storage/qvg.yaml states them)."""


def storage_format(block: Mapping[str, object] | None) -> StorageFormat:
    """A ``storage`` config block as a checked :class:`StorageFormat` (``None``: ``fp``).

    Raises
    ------
    ConfigError
        An unknown key, or a knob out of range (:meth:`StorageFormat.check`).
    """
    if not block:
        return StorageFormat()
    known = {"name", "bits", "group_size", "residual", "stages", "clusters", "iters", "rank", "basis"}
    extra = sorted(set(block) - known - {"description"})
    if extra:
        raise ConfigError(f"storage.{extra[0]}: not a storage knob (expected {', '.join(sorted(known))})")
    values = {k: block[k] for k in known if k in block and block[k] is not None}
    if values.get("name") == "qvg":
        values = {**QVG_DEFAULTS, **values}
    return StorageFormat(**values).check()  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- numerics
def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``uint8 [..., D]`` codes below ``2**bits`` -> ``uint8 [..., D * bits // 8]``, code ``i`` of a byte in
    its bits ``[i * bits, (i + 1) * bits)``."""
    per = 8 // bits
    parts = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)
    return (parts << shifts).sum(-1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack`: ``uint8 [..., W]`` -> ``uint8 [..., W * 8 // bits]``."""
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    codes = (packed.unsqueeze(-1) >> shifts) & (2**bits - 1)
    return codes.reshape(*packed.shape[:-1], -1)


def unpack_float(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`unpack` as ``float32`` codes, ``[..., W * 8 // bits]``: one table lookup per byte (a byte's
    codes, from a ``[256, 8 // bits]`` table), cheaper than shifting, masking and converting."""
    table = unpack(torch.arange(256, dtype=torch.uint8, device=packed.device)[:, None], bits).float()
    codes = torch.nn.functional.embedding(packed.int(), table)
    return codes.reshape(*packed.shape[:-1], -1)


def affine(lo: torch.Tensor, hi: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``float16`` zero point and scale whose grid ``zero + [0, 2**bits - 1] * scale`` covers ``[lo, hi]``."""
    levels = 2**bits - 1
    zero = lo.to(PARAM)
    zero = torch.where(zero.float() > lo, torch.nextafter(zero, torch.full_like(zero, -math.inf)), zero)
    scale = ((hi - zero.float()) / levels).to(PARAM)
    short = zero.float() + scale.float() * levels < hi
    scale = torch.where(short, torch.nextafter(scale, torch.full_like(scale, math.inf)), scale)
    return zero, scale


def quantize(x: torch.Tensor, zero: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes ``uint8`` of ``x`` (``float``) on the grid of ``zero`` and ``scale`` (broadcast to ``x``)."""
    s = scale.float()
    safe = torch.where(s > 0, s, torch.ones_like(s))
    return torch.round((x - zero.float()) / safe).clamp_(0, 2**bits - 1).to(torch.uint8)


# ---------------------------------------------------------------------------------------------- codecs
@dataclass(frozen=True)
class ChannelGroups(Codec):
    """KIVI's keys: per channel over a key group of ``group`` positions of one frame (table: zero, scale)."""

    bits: int
    group: int
    key_kind: ClassVar[str | None] = "key group"

    def key(self, prov: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return prov["frame"] * 2**32 + prov["pos"] // self.group

    def entry_bytes(self, head_dim: int) -> int:
        return 2 * head_dim * PARAM.itemsize  # a zero point and a scale per channel

    def entry_rows(self, tokens_per_frame: int, tokens_per_chunk: int) -> int:
        return min(self.group, tokens_per_frame)

    def fit(self, x: torch.Tensor, index: torch.Tensor, groups: int) -> torch.Tensor:
        B, _, Hg, D = x.shape
        idx = index.to(x.device)[None, :, None, None].expand_as(x)
        xf = x.float()
        lo = xf.new_full((B, groups, Hg, D), math.inf).scatter_reduce(1, idx, xf, "amin")
        hi = xf.new_full((B, groups, Hg, D), -math.inf).scatter_reduce(1, idx, xf, "amax")
        zero, scale = affine(lo, hi, self.bits)
        return torch.stack([zero, scale], dim=3)

    def width(self, head_dim: int) -> int:
        return head_dim * self.bits // 8

    def encode(self, x: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
        assert params is not None
        return pack(quantize(x.float(), params[..., 0, :], params[..., 1, :], self.bits), self.bits)

    def decode(self, raw: torch.Tensor, params: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        assert params is not None
        return torch.addcmul(params[..., 0, :], unpack_float(raw, self.bits), params[..., 1, :]).to(dtype)


@dataclass(frozen=True)
class TokenGroups(Codec):
    """Per token, channels in groups of ``group``, ``stages`` progressive stages; ``smooth``: the chunk's
    mean (per head and channel, table keyed by chunk) is subtracted first."""

    bits: int
    group: int
    stages: int
    smooth: bool

    @property
    def key_kind(self) -> str | None:  # type: ignore[override]
        return "chunk" if self.smooth else None

    def key(self, prov: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        return prov["chunk"].clone() if self.smooth else None

    def entry_bytes(self, head_dim: int) -> int:
        return head_dim * PARAM.itemsize if self.smooth else 0  # the chunk's mean

    def entry_rows(self, tokens_per_frame: int, tokens_per_chunk: int) -> int:
        return tokens_per_chunk if self.smooth else 1

    def fit(self, x: torch.Tensor, index: torch.Tensor, groups: int) -> torch.Tensor:
        B, _, Hg, D = x.shape
        dev = index.to(x.device)
        sums = x.new_zeros((B, groups, Hg, D), dtype=torch.float32).index_add_(1, dev, x.float())
        count = torch.bincount(index, minlength=groups).to(x.device, torch.float32)
        return (sums / count[None, :, None, None]).to(PARAM).unsqueeze(3)

    def width(self, head_dim: int) -> int:
        return self.stages * (head_dim * self.bits // 8 + 2 * 2 * (head_dim // self.group))

    def encode(self, x: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
        B, m, Hg, D = x.shape
        rest = x.float() - (params[..., 0, :].float() if params is not None else 0.0)
        parts = []
        for _ in range(self.stages):
            grouped = rest.reshape(B, m, Hg, D // self.group, self.group)
            zero, scale = affine(grouped.amin(-1), grouped.amax(-1), self.bits)
            codes = quantize(grouped, zero[..., None], scale[..., None], self.bits)
            rest = rest - torch.addcmul(zero[..., None].float(), codes.float(), scale[..., None].float()).reshape(rest.shape)
            parts += [pack(codes.reshape(B, m, Hg, D), self.bits), as_bytes(torch.cat([zero, scale], dim=-1))]
        return torch.cat(parts, dim=-1)

    def decode(self, raw: torch.Tensor, params: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        B, m, Hg, width = raw.shape
        G = 8 * width // self.stages // (self.group * self.bits + 32)  # channel groups of a stage
        D, code_bytes = G * self.group, G * self.group * self.bits // 8
        out = params[..., 0, :] if params is not None else raw.new_zeros((B, m, Hg, D), dtype=torch.float32)
        step = code_bytes + 4 * G
        for stage in range(self.stages):
            part = raw[..., stage * step : (stage + 1) * step]
            codes = unpack_float(part[..., :code_bytes], self.bits).reshape(B, m, Hg, G, self.group)
            zs = from_bytes(part[..., code_bytes:]).float()  # [B, m, Hg, 2 G]: zero points, then scales
            out = out + torch.addcmul(zs[..., :G, None], codes, zs[..., G:, None]).reshape(B, m, Hg, D)
        return out.to(dtype)


def nearest(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Index of each point's nearest centroid (squared Euclidean; the lowest index on a tie), ``long [N, n]``,
    of points ``x [N, n, D]`` and centroids ``[N, k, D]`` (``float32``)."""
    dist = centroids.square().sum(-1).unsqueeze(1) - 2 * x @ centroids.transpose(1, 2)
    return dist.argmin(-1)


def kmeans(x: torch.Tensor, k: int, iters: int) -> torch.Tensor:
    """``k`` centroids ``float32 [N, k, D]`` of each of ``N`` point sets ``x [N, n, D]`` (``n >= k``).

    Seeded by farthest points (deterministic: the first point, then each time the point farthest from
    the seeds so far), then ``iters`` Lloyd iterations (assign every point to its nearest centroid, move
    each centroid to its points' mean; a centroid left without points stays where it is).
    """
    N, n, D = x.shape
    x = x.float()
    seeds = torch.zeros(N, k, dtype=torch.long, device=x.device)
    gap = (x - x[:, :1]).square().sum(-1)  # [N, n]: squared distance to the nearest seed so far
    for j in range(1, k):
        seeds[:, j] = gap.argmax(-1)
        new = x.gather(1, seeds[:, j, None, None].expand(N, 1, D))
        gap = torch.minimum(gap, (x - new).square().sum(-1))
    centroids = x.gather(1, seeds[..., None].expand(N, k, D))
    for _ in range(iters):
        ids = nearest(x, centroids)
        sums = torch.zeros_like(centroids).scatter_add_(1, ids[..., None].expand(N, n, D), x)
        count = torch.zeros(N, k, device=x.device).scatter_add_(1, ids, torch.ones(N, n, device=x.device))
        centroids = torch.where(count[..., None] > 0, sums / count.clamp_min(1)[..., None], centroids)
    return centroids


def symmetric_scale(absmax: torch.Tensor, bits: int) -> torch.Tensor:
    """``float16`` scale whose grid ``[-q, q] * scale`` (``q = 2**(bits-1) - 1``) covers ``[-absmax, absmax]``."""
    q = 2 ** (bits - 1) - 1
    scale = (absmax / q).to(PARAM)
    short = scale.float() * q < absmax
    return torch.where(short, torch.nextafter(scale, torch.full_like(scale, math.inf)), scale)


@dataclass(frozen=True)
class ClusteredResidual(Codec):
    """Quant VideoGen: ``stages`` k-means stages of ``clusters`` centroids per chunk and head (table keyed by
    chunk: ``[B, g, Hg, stages * clusters, D]``), each clustering the previous stage's residual, then the
    last residual quantized symmetric to ``bits`` with one scale per ``group`` channels.

    A row of one head: ``stages`` cluster ids (``uint8``), the packed codes (``D * bits / 8`` bytes), the
    ``float16`` scales (``2 * D / group`` bytes). Encoding assigns each row to its nearest stored centroid
    at each stage, so a row restored onto its chunk's entry gets its codes back.
    """

    bits: int
    group: int
    stages: int
    clusters: int
    iters: int
    key_kind: ClassVar[str | None] = "chunk"

    def key(self, prov: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return prov["chunk"].clone()

    def entry_rows(self, tokens_per_frame: int, tokens_per_chunk: int) -> int:
        return tokens_per_chunk

    def entry_bytes(self, head_dim: int) -> int:
        return self.stages * self.clusters * head_dim * PARAM.itemsize

    def params(self, table: Table, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' distinct entries ``float32 [B, u, Hg, stages * clusters, D]`` and each row's ``long [m]``."""
        return table.lookup(keys)

    def width(self, head_dim: int) -> int:
        return self.stages + head_dim * self.bits // 8 + PARAM.itemsize * (head_dim // self.group)

    def fit(self, x: torch.Tensor, index: torch.Tensor, groups: int) -> torch.Tensor:
        """Every stage's centroids of each chunk's rows (a chunk with fewer rows than ``clusters``: one
        centroid per row, the rest copies of the first, which no row is assigned)."""
        B, _, Hg, D = x.shape
        C = self.clusters
        out = x.new_empty((B, groups, Hg, self.stages * C, D), dtype=PARAM)
        for g in range(groups):
            rows = (index == g).nonzero().squeeze(1).to(x.device)
            rest = x.index_select(1, rows).float().permute(0, 2, 1, 3).reshape(B * Hg, len(rows), D)
            for stage in range(self.stages):
                found = kmeans(rest, min(C, len(rows)), self.iters).to(PARAM)
                cents = torch.cat([found, found[:, :1].expand(-1, C - found.shape[1], -1)], 1).float()
                out[:, g, :, stage * C : (stage + 1) * C] = cents.reshape(B, Hg, C, D).to(PARAM)
                ids = nearest(rest, cents)
                rest = rest - cents.gather(1, ids[..., None].expand(-1, -1, D))
        return out

    def encode(self, x: torch.Tensor, params: Any) -> torch.Tensor:
        entries, inverse = params
        B, m, Hg, D = x.shape
        C = self.clusters
        rest = x.to(torch.float32, copy=True)  # written in place below: never the caller's tensor
        ids = torch.empty((B, m, Hg, self.stages), dtype=torch.uint8, device=x.device)
        for u in range(entries.shape[1]):
            rows = (inverse == u).nonzero().squeeze(1).to(x.device)
            part = rest.index_select(1, rows).permute(0, 2, 1, 3).reshape(B * Hg, len(rows), D)
            for stage in range(self.stages):
                cents = entries[:, u, :, stage * C : (stage + 1) * C].reshape(B * Hg, C, D)
                chosen = nearest(part, cents)
                part = part - cents.gather(1, chosen[..., None].expand(-1, -1, D))
                ids[:, rows, :, stage] = chosen.reshape(B, Hg, len(rows)).transpose(1, 2).to(torch.uint8)
            rest[:, rows] = part.reshape(B, Hg, len(rows), D).transpose(1, 2)
        q = 2 ** (self.bits - 1) - 1
        grouped = rest.reshape(B, m, Hg, D // self.group, self.group)
        scale = symmetric_scale(grouped.abs().amax(-1), self.bits)
        s = scale.float()[..., None]
        codes = torch.round(grouped / torch.where(s > 0, s, torch.ones_like(s))).clamp_(-q, q).add_(q).to(torch.uint8)
        return torch.cat([ids, pack(codes.reshape(B, m, Hg, D), self.bits), as_bytes(scale)], dim=-1)

    def decode(self, raw: torch.Tensor, params: Any, dtype: torch.dtype) -> torch.Tensor:
        entries, inverse = params
        B, m, Hg, width = raw.shape
        S, C, P = self.stages, self.clusters, self.stages * self.clusters
        D = 8 * self.group * (width - S) // (self.group * self.bits + 8 * PARAM.itemsize)
        code_bytes, q = D * self.bits // 8, 2 ** (self.bits - 1) - 1
        codes = unpack_float(raw[..., S : S + code_bytes], self.bits).reshape(B, m, Hg, D // self.group, self.group)
        scale = from_bytes(raw[..., S + code_bytes :]).float()[..., None]
        out = ((codes - q) * scale).reshape(B, m, Hg, D)
        flat = entries.permute(0, 2, 1, 3, 4).reshape(-1, D)  # [B * Hg * u * P, D]
        u = entries.shape[1]
        heads = torch.arange(B, device=raw.device)[:, None] * Hg + torch.arange(Hg, device=raw.device)  # [B, Hg]
        base = (heads[:, None, :] * u + inverse.to(raw.device)[None, :, None]) * P  # [B, m, Hg]: entry's first row
        for stage in range(S):
            index = base + stage * C + raw[..., stage].long()
            out = out + torch.nn.functional.embedding(index, flat)
        return out.to(dtype)
