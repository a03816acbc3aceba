"""Quantized KV storage: the bank formats ``kivi`` and ``qvg`` beside the full-precision ``fp``.

A format decides how a bank holds its history rows; what a method sees (rows, provenance, eviction,
restore, forks) does not change. Every history row is *encoded* when its chunk is committed, into one
``uint8`` row per side (keys, values) that the bank moves, gathers, shares and copies like any other
row; the parameters that several rows share live in a per-bank *table* keyed by provenance.

``kivi`` (KIVI: keys per channel, values per token)
    Keys: each channel of a *key group* (``group_size`` consecutive token positions of one latent
    frame) is quantized to ``bits`` with one zero point and one scale, kept in the key table (keyed
    by ``(frame, pos // group_size)``); a row holds only its packed codes. Values: each token's
    channels in groups of ``group_size`` get their own zero point and scale, stored in the row.
``qvg`` (Quant VideoGen's smoothing and progressive residual quantization)
    Keys and values alike: the per-chunk mean (per head and channel, ``float16``, in the table keyed by
    the chunk index) is subtracted, the residual is quantized per token in channel groups, and each
    further stage (``stages``) quantizes what the previous stages left; a row holds every stage's codes,
    zero points and scales.

Both keep the last ``residual`` committed tokens in full precision as well (KIVI's recent window):
attention reads those rows from the full-precision copy, which is dropped once a newer chunk pushes
them out. Codes are packed ``8 // bits`` to a byte; zero points, scales and means are ``float16``.

Quantization is asymmetric: ``zero = min``, ``scale = (max - min) / (2**bits - 1)`` rounded in
``float16`` so that the range is covered, codes ``round((x - zero) / scale)``; a decoded entry is
``zero + code * scale``, within ``scale / 2`` of the original (per stage, of what that stage saw).

The bank's ``stored_bytes()`` is the exact device size of what it holds for its history: every row's
codes and in-row parameters, the table entries its rows use, and the full-precision recent window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from cmbench.errors import ConfigError

FORMATS = ("fp", "kivi", "qvg")
BITS = (2, 4, 8)
PARAM = torch.float16  # zero points, scales, means


@dataclass(frozen=True)
class StorageFormat:
    """How banks store their history.

    Attributes
    ----------
    name : str
        ``fp`` (the cache's dtype, unchanged), ``kivi`` or ``qvg``.
    bits : int
        Bits per code (2, 4 or 8).
    group_size : int
        Channels per quantization group of a token (values; qvg keys too; must divide the head dim) and
        token positions per key group (kivi keys).
    residual : int
        Most recent committed tokens also kept in full precision (>= 0).
    stages : int
        Quantization stages of a token (qvg; kivi uses one).
    """

    name: str = "fp"
    bits: int = 4
    group_size: int = 32
    residual: int = 0
    stages: int = 1

    @property
    def quantized(self) -> bool:
        return self.name != "fp"

    def label(self) -> str:
        """How the format reads in a run label (``kivi4``, ``qvg2x2``); ``""`` for ``fp``."""
        if not self.quantized:
            return ""
        stages = f"x{self.stages}" if self.name == "qvg" else ""
        return f"{self.name}{self.bits}{stages}"

    def check(self, head_dim: int | None = None) -> "StorageFormat":
        """The format itself when its knobs are valid (``head_dim``: also that ``group_size`` divides it).

        Raises
        ------
        ConfigError
            One line naming the key and its limit.
        """
        if self.name not in FORMATS:
            raise ConfigError(f"storage.name={self.name!r}: expected one of {', '.join(FORMATS)}")
        if not self.quantized:
            return self
        if self.bits not in BITS:
            raise ConfigError(f"storage.bits={self.bits!r}: expected one of {', '.join(map(str, BITS))}")
        if not _whole(self.group_size) or self.group_size < 1:
            raise ConfigError(f"storage.group_size={self.group_size!r}: expected a whole number >= 1")
        if head_dim is not None and head_dim % self.group_size:
            raise ConfigError(f"storage.group_size={self.group_size}: must divide the head dim {head_dim}")
        if not _whole(self.residual) or self.residual < 0:
            raise ConfigError(f"storage.residual={self.residual!r}: expected a whole number of tokens >= 0")
        if not _whole(self.stages) or not 1 <= self.stages <= 4:
            raise ConfigError(f"storage.stages={self.stages!r}: expected a whole number in [1, 4]")
        if self.name == "kivi" and self.stages != 1:
            raise ConfigError(f"storage.stages={self.stages}: kivi quantizes in one stage (stages=1)")
        return self

    def codecs(self) -> tuple["Codec", "Codec"]:
        """The key and value codecs of a quantized format."""
        if self.name == "kivi":
            return ChannelGroups(self.bits, self.group_size), TokenGroups(self.bits, self.group_size, 1, False)
        if self.name == "qvg":
            side = TokenGroups(self.bits, self.group_size, self.stages, True)
            return side, side
        raise ValueError(f"storage {self.name!r} stores rows unencoded")

    def row_bytes(self, head_dim: int) -> int:
        """Bytes of one token of one head in the rows (keys + values; tables and the recent window apart)."""
        if not self.quantized:
            raise ValueError("row_bytes is for quantized formats")
        key, value = self.codecs()
        return key.width(head_dim) + value.width(head_dim)


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
        Distinct chunks among the tokens (qvg's means).
    recent : int
        Tokens held in full precision as well (the recent window, at most ``residual``).
    """
    per_head = batch * heads
    if not fmt.quantized:
        return 2 * tokens * per_head * head_dim * element_bytes
    key, value = fmt.codecs()
    rows = tokens * per_head * (key.width(head_dim) + value.width(head_dim))
    param = torch.empty(0, dtype=PARAM).element_size()
    tables = (key_groups * 2 * head_dim * param if fmt.name == "kivi" else chunks * 2 * head_dim * param) * per_head
    return rows + tables + 2 * recent * per_head * head_dim * element_bytes


def bytes_per_token(fmt: StorageFormat, head_dim: int, element_bytes: int, tokens_per_frame: int,
                    chunk_tokens: int) -> float:
    """Bytes one history token of one head costs in ``fmt`` over a long history (the rows, and the table
    entries shared by a key group or a chunk spread over their tokens; the recent window, a constant, apart)."""
    if not fmt.quantized:
        return 2.0 * head_dim * element_bytes
    frames = chunk_tokens // tokens_per_frame
    groups = frames * -(-tokens_per_frame // fmt.group_size)  # key groups of one chunk
    return history_bytes(fmt, chunk_tokens, 1, head_dim, 1, element_bytes, key_groups=groups, chunks=1) / chunk_tokens


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def storage_format(block: Mapping[str, object] | None) -> StorageFormat:
    """A ``storage`` config block as a checked :class:`StorageFormat` (``None``: ``fp``).

    Raises
    ------
    ConfigError
        An unknown key, or a knob out of range (:meth:`StorageFormat.check`).
    """
    if not block:
        return StorageFormat()
    known = {"name", "bits", "group_size", "residual", "stages"}
    extra = sorted(set(block) - known - {"description"})
    if extra:
        raise ConfigError(f"storage.{extra[0]}: not a storage knob (expected {', '.join(sorted(known))})")
    values = {k: block[k] for k in known if k in block and block[k] is not None}
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


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    """``float16 [..., P]`` -> ``uint8 [..., 2 P]``."""
    return x.contiguous().view(torch.uint8)


def _from_bytes(raw: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., 2 P]`` -> ``float16 [..., P]``."""
    return raw.contiguous().view(PARAM)


# ---------------------------------------------------------------------------------------------- codecs
@dataclass(frozen=True)
class Table:
    """Parameters shared by rows: ``keys long [g]`` (sorted, CPU) and ``data float16 [B, g, Hg, P, D]``."""

    keys: torch.Tensor
    data: torch.Tensor | None

    @staticmethod
    def empty() -> "Table":
        return Table(torch.zeros(0, dtype=torch.long), None)

    def nbytes(self) -> int:
        return 0 if self.data is None else self.data.numel() * self.data.element_size()

    def rows(self, keys: torch.Tensor) -> torch.Tensor:
        """Entries of these keys (``long [m]``, each present) in ``float32``: ``[B, m, Hg, P, D]`` (converted
        before they are repeated per row)."""
        assert self.data is not None
        return self.data.index_select(1, torch.searchsorted(self.keys, keys).to(self.data.device)).float()

    def only(self, keys: torch.Tensor) -> "Table":
        """The entries of these keys (the others dropped)."""
        if self.data is None:
            return self
        kept = torch.isin(self.keys, keys)
        if bool(kept.all()):
            return self
        idx = kept.nonzero().squeeze(1)
        return Table(self.keys[idx], self.data.index_select(1, idx.to(self.data.device)))

    def merged(self, keys: torch.Tensor, data: torch.Tensor) -> "Table":
        """This table with new entries (``keys [g']`` not present, ``data [B, g', Hg, P, D]``)."""
        if self.data is None:
            order = keys.argsort()
            return Table(keys[order], data.index_select(1, order.to(data.device)))
        all_keys = torch.cat([self.keys, keys])
        order = all_keys.argsort()
        both = torch.cat([self.data, data.to(self.data.device)], dim=1)
        return Table(all_keys[order], both.index_select(1, order.to(both.device)))

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Table":
        return self if self.data is None else Table(self.keys, fn(self.data))


class Codec:
    """How one side (keys or values) of a row is encoded; rows of one table key share its entry."""

    bits: int

    def key(self, prov: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """Table key of each row ``long [m]`` from its provenance, or ``None`` (no table)."""
        return None

    def entry_rows(self, tokens_per_frame: int, tokens_per_chunk: int) -> int:
        """Most rows of one bank that share one table entry (1: no table)."""
        return 1

    def fit(self, x: torch.Tensor, index: torch.Tensor, groups: int) -> torch.Tensor:
        """Table entries ``float16 [B, groups, Hg, P, D]`` from rows ``x [B, m, Hg, D]`` of ``index [m]``."""
        raise NotImplementedError

    def width(self, head_dim: int) -> int:
        """Bytes of one row of one head."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
        """``x [B, m, Hg, D]`` with its rows' table entries ``[B, m, Hg, P, D]`` -> ``uint8 [B, m, Hg, W]``."""
        raise NotImplementedError

    def decode(self, raw: torch.Tensor, params: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """Inverse of :meth:`encode`: ``uint8 [B, m, Hg, W]`` -> ``[B, m, Hg, D]`` in ``dtype``."""
        raise NotImplementedError


@dataclass(frozen=True)
class ChannelGroups(Codec):
    """KIVI's keys: per channel over a key group of ``group`` positions of one frame (table: zero, scale)."""

    bits: int
    group: int

    def key(self, prov: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return prov["frame"] * 2**32 + prov["pos"] // self.group

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

    def key(self, prov: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        return prov["chunk"].clone() if self.smooth else None

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
            parts += [pack(codes.reshape(B, m, Hg, D), self.bits), _as_bytes(torch.cat([zero, scale], dim=-1))]
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
            zs = _from_bytes(part[..., code_bytes:]).float()  # [B, m, Hg, 2 G]: zero points, then scales
            out = out + torch.addcmul(zs[..., :G, None], codes, zs[..., G:, None]).reshape(B, m, Hg, D)
        return out.to(dtype)
