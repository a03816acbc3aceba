"""The low-rank storage format ``lowrank``: keys projected to rank ``r`` per layer and head, values kept.

Low-rank KV is the third way LLM serving cuts KV memory, beside eviction and quantization. Palu (arXiv
2407.21118) factors each key projection into a rank-``r`` down-projection and an up-projection fitted
offline on calibration data (per head, or per group of heads) and caches the rank-``r`` latents; ShadowKV
(arXiv 2410.21465) takes the SVD of the pre-RoPE keys of a prefill and keeps their low-rank factors, values
offloaded. CMBench's ``lowrank`` follows Palu's shape with a fixed basis:

- per layer and head, an orthonormal basis ``P [D, D]`` of the keys, fitted once on calibration contexts
  (the right singular vectors of the keys a FullKV prefill of the calibration tasks caches, the strongest
  first; :mod:`cmbench.calibration.key_basis`), never on the test suite, stored as a small artefact beside
  the backbone's weights and keyed by their fingerprint;
- a history key ``k`` is stored as its ``r`` coefficients ``c = k @ P[:, :r]`` (``float16``) and read back as
  ``c @ P[:, :r].T``: its orthogonal projection onto the basis's first ``r`` directions (exact at ``r = D``);
- values are kept, in ``float16`` (the 2 bytes a serving cache's bfloat16 rows take);
- the bank holds its heads' ``P[:, :r]`` in ``float16``: counted in its bytes.

Keys are cached after RoPE (as every CMBench format sees them), so the basis is fitted on rotated keys and a
re-index decodes, rotates and projects them again (a rotation can move a key out of the basis's span: one more
projection error). Palu and ShadowKV project pre-RoPE keys and rotate at attention time; CMBench does not.
The recent window (``residual``) and forks, eviction and restore work as for the quantized formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from cmbench.cache.codec import PARAM, Codec, as_bytes, from_bytes

BASIS_SUFFIX = "_key_basis.safetensors"
"""A backbone's key basis lives beside its weights: ``<weights stem>_key_basis.safetensors``."""


def basis_path(weights: str | Path) -> Path:
    """Where the key basis of the backbone whose weights are ``weights`` lives by default."""
    weights = Path(weights)
    return weights.with_name(weights.stem + BASIS_SUFFIX)


def fit_basis(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormal key bases of each head, strongest direction first.

    Parameters
    ----------
    keys : Tensor, shape ``[N, H, D]``
        Keys of ``N`` tokens (one layer), as the cache stores them.

    Returns
    -------
    basis : Tensor, shape ``[H, D, D]``, float32
        Column ``j`` of head ``h``: its keys' ``j``-th right singular vector (of the uncentered keys).
    singular : Tensor, shape ``[H, D]``, float32
        The singular values, decreasing.
    """
    x = keys.double().transpose(0, 1)  # [H, N, D]
    eigval, eigvec = torch.linalg.eigh(x.transpose(1, 2) @ x)  # ascending
    return eigvec.flip(-1).float(), eigval.flip(-1).clamp_min(0).sqrt().float()


def save_basis(path: str | Path, basis: torch.Tensor, singular: torch.Tensor, meta: dict[str, str]) -> None:
    """Write a key basis ``[layers, H, D, D]`` with its singular values ``[layers, H, D]`` and ``meta``
    (the weights' fingerprint, the calibration contexts)."""
    save_file({"basis": basis.contiguous(), "singular": singular.contiguous()}, str(path), metadata=meta)


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int) -> tuple[torch.Tensor, dict[str, str]]:
    with safe_open(path, framework="pt") as f:
        return f.get_tensor("basis"), dict(f.metadata() or {})


def load_basis(path: str | Path) -> tuple[torch.Tensor, dict[str, str]]:
    """A key basis file's ``basis [layers, H, D, D]`` (float32) and metadata (read once per file version)."""
    path = Path(path)
    return _load(str(path), path.stat().st_mtime_ns)


@dataclass(frozen=True)
class LowRankKeys(Codec):
    """Keys as ``rank`` ``float16`` coefficients on a bank's heads' bases ``basis [Hg, D, rank]``."""

    rank: int
    basis: torch.Tensor = field(compare=False)  # [Hg, D, rank], float16
    bits: int = 16
    key_kind: ClassVar[str | None] = None

    def width(self, head_dim: int) -> int:
        return self.rank * PARAM.itemsize

    def held(self) -> list[torch.Tensor]:
        return [self.basis]

    def encode(self, x: torch.Tensor, params: Any) -> torch.Tensor:
        """``x [B, m, Hg, D]`` -> its coefficients ``x @ P`` as bytes, ``uint8 [B, m, Hg, 2 rank]``."""
        coeff = torch.einsum("bmhd,hdr->bmhr", x.float(), self.basis.to(x.device, torch.float32))
        return as_bytes(coeff.to(PARAM))

    def decode(self, raw: torch.Tensor, params: Any, dtype: torch.dtype) -> torch.Tensor:
        """Coefficient bytes ``[B, m, Hg, 2 rank]`` -> keys ``c @ P.T`` ``[B, m, Hg, D]`` in ``dtype``."""
        coeff = from_bytes(raw).float()
        return torch.einsum("bmhr,hdr->bmhd", coeff, self.basis.to(raw.device, torch.float32)).to(dtype)


@dataclass(frozen=True)
class Float16Rows(Codec):
    """Rows kept as they are, in ``float16`` (``2 D`` bytes a head)."""

    bits: int = 16
    key_kind: ClassVar[str | None] = None

    def width(self, head_dim: int) -> int:
        return head_dim * PARAM.itemsize

    def encode(self, x: torch.Tensor, params: Any) -> torch.Tensor:
        return as_bytes(x.to(PARAM))

    def decode(self, raw: torch.Tensor, params: Any, dtype: torch.dtype) -> torch.Tensor:
        return from_bytes(raw).to(dtype)


def lowrank_codecs(basis_file: str | Path, rank: int, layer: int, heads: tuple[int, ...]) -> tuple[Codec, Codec]:
    """The key and value codecs of layer ``layer``'s bank of ``heads`` (the basis file's first ``rank`` columns)."""
    basis, _ = load_basis(basis_file)
    if layer >= basis.shape[0] or max(heads) >= basis.shape[1]:
        raise ValueError(f"the key basis {basis_file} has {basis.shape[0]} layers of {basis.shape[1]} heads: "
                         f"no head {max(heads)} of layer {layer}")
    mine = basis[layer, list(heads), :, :rank].to(PARAM).contiguous()
    return LowRankKeys(rank, mine), Float16Rows()
