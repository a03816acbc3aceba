"""A storage format checked on random K/V (``python -m cmbench check storage=...``): its round trip stays
within the format's error bound and its byte count is exact.

A one-layer cache of ``heads`` heads of ``head_dim`` in the format stores random chunks (with
outlier channels in the keys, as real keys have), drops every third token and compacts, then:

- ``round trip``: every decoded history entry (the recent window aside, which must be exact) is within
  ``bound`` of the original: half a quantization step of the head's whole range for kivi (a group's
  range is never wider), twice that for chunkmean (the chunk mean can widen a token's residual range to
  twice the head's); for qvg half a symmetric step (``absmax / (2**(bits-1) - 1)``) of the head's range,
  doubled for each k-means stage after the first (a stage's centroid lies within the range of what it
  clustered, so each stage at most doubles the residual's range);
- for lowrank instead: each decoded value is its ``float16`` rounding (within ``2**-11`` of it, relative),
  and each decoded key is the orthogonal projection of the original onto its head's first ``rank`` basis
  directions, within the ``float16`` rounding of its coefficients (``2**-11`` of their norm); without a
  basis file the check fits one on its own random keys;
- ``bytes``: ``stored_bytes()`` equals the count from the format's layout alone
  (:func:`cmbench.cache.quantized.history_bytes`) and, after a trim, the bytes of the tensors the bank
  holds (rows outside the recent window, tables, recent window, lowrank's bases).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from cmbench.cache.kv_cache import KVCache
from cmbench.cache.lowrank import fit_basis, save_basis
from cmbench.cache.quantized import StorageFormat, history_bytes
from cmbench.cache.quantized_bank import QuantizedBank
from cmbench.cache.rope import RopeSpec


@dataclass(frozen=True)
class FormatCheck:
    """One check of a storage format: its name, whether it passed, and what was measured."""

    name: str
    passed: bool
    detail: str


def _chunk(gen: torch.Generator, tokens: int, heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(1, tokens, heads, head_dim, generator=gen)
    k[..., : max(1, head_dim // 16)] *= 8.0
    return k, torch.randn(1, tokens, heads, head_dim, generator=gen)


def check_format(fmt: StorageFormat, head_dim: int = 32, heads: int = 2, tokens_per_frame: int = 16,
                 seed: int = 0) -> list[FormatCheck]:
    """The round-trip and byte checks of ``fmt`` (quantized or low-rank) on a random cache (see the module
    docstring): at least 6 chunks of 2 frames, and enough that the recent window is at most a quarter of the
    tokens."""
    if fmt.name == "lowrank" and fmt.basis is None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "key_basis.safetensors"
            gen = torch.Generator().manual_seed(seed + 1)
            basis, singular = fit_basis(torch.cat([_chunk(gen, 64, heads, head_dim)[0][0] for _ in range(4)]))
            save_basis(path, basis[None], singular[None], {"weights": "", "fitted": "the check's random keys"})
            return check_format(replace(fmt, basis=str(path)), head_dim, heads, tokens_per_frame, seed)
    fmt.check(head_dim)
    chunks = max(6, -(-4 * fmt.residual // (2 * tokens_per_frame)))
    cache = KVCache(1, heads, head_dim, tokens_per_frame, RopeSpec.wan(head_dim), compute_attention=False)
    cache.use_storage(fmt)
    gen = torch.Generator().manual_seed(seed)
    keys, values = [], []
    for i in range(chunks):
        k, v = _chunk(gen, 2 * tokens_per_frame, heads, head_dim)
        cache.begin_chunk(i, 2 * i, 2)
        cache.attend(0, k, k, v)
        cache.commit_chunk()
        keys.append(k)
        values.append(v)
    keep = (torch.arange(chunks * 2 * tokens_per_frame) % 3) != 0
    cache.compact(lambda bank: keep)
    cache.trim()
    bank = cache.banks[0][0]
    assert isinstance(bank, QuantizedBank)
    orig_k, orig_v = torch.cat(keys, 1)[:, keep], torch.cat(values, 1)[:, keep]
    got_k, got_v = bank.history()
    recent = torch.isin(bank.field("gid"), bank.tail_gid)
    levels = 2**fmt.bits - 1
    widen = {"chunkmean": 2.0, "qvg": levels / (2 ** (fmt.bits - 1) - 1) * 2 ** (fmt.stages - 1)}.get(fmt.name, 1.0)
    worst = 0.0
    sides = [(got_k, orig_k), (got_v, orig_v)] if fmt.name != "lowrank" else []
    if fmt.name == "lowrank":
        basis = bank.codecs[0].held()[0].float()  # [Hg, D, rank]
        coeff = torch.einsum("bmhd,hdr->bmhr", orig_k, basis)
        near = (got_k - torch.einsum("bmhr,hdr->bmhd", coeff, basis)).norm(dim=-1) / (coeff.norm(dim=-1) * 2**-11 * 1.01 + 1e-6)
        rounded = (got_v - orig_v).abs() / (orig_v.abs() * 2**-11 * 1.01 + 2**-24)
        worst = max(float(near[:, ~recent].max()), float(rounded[:, ~recent].max())) if bool((~recent).any()) else 0.0
        for got, orig in ((got_k, orig_k), (got_v, orig_v)):
            if not torch.equal(got[:, recent], orig[:, recent]):
                worst = float("inf")
    for got, orig in sides:
        span = (orig.amax(dim=(0, 1, 3)) - orig.amin(dim=(0, 1, 3)))[None, None, :, None]  # per head
        bound = widen * span / levels / 2 * (1 + 1e-2) + 1e-3 * span
        err = (got - orig).abs()
        worst = max(worst, float((err[:, ~recent] / bound).max()) if bool((~recent).any()) else 0.0)
        if not torch.equal(got[:, recent], orig[:, recent]):
            worst = float("inf")
    bound = (f"half a {fmt.bits}-bit step of the head's range{f', times {widen:g}' if widen > 1 else ''}"
             if fmt.name != "lowrank" else f"keys: their rank-{fmt.rank} projection; values: float16 rounding")
    trip = FormatCheck("round trip", worst <= 1.0, f"largest error {worst:.2f} of its bound ({bound}); recent window exact")
    prov = bank.field("frame") * 2**32 + bank.field("pos") // fmt.group_size
    counted = history_bytes(fmt, bank.n, heads, head_dim, 1, 4, key_groups=len(prov.unique()),
                            chunks=len(bank.field("chunk").unique()), recent=int(recent.sum()))
    held = [*(bank.tail or ()), *(t.data for t in bank.tables if t.data is not None),
            *(t for codec in bank.codecs for t in codec.held())]
    encoded = (~recent).nonzero().squeeze(1)  # the rows' slots that hold codes (a trim left no spare rows)
    rows = [t.index_select(1, encoded) for t in (bank.k, bank.v) if t is not None]
    tensors = sum(t.numel() * t.element_size() for t in [*held, *rows])
    stored = cache.stored_bytes()
    size = FormatCheck("bytes", stored == counted == tensors,
                       f"stored_bytes {stored}, counted from the layout {counted}, tensors held {tensors} "
                       f"({bank.n} tokens x {heads} heads; fp: {history_bytes(StorageFormat(), bank.n, heads, head_dim, 1, 4)})")
    return [trip, size]
