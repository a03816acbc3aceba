"""TempCache's correspondence search: each key's nearest earlier key by cosine, exact or through an index.

TempCache (arXiv 2602.01801) finds, for every cached key, the most similar key of earlier frames at any
in-frame position (content that moved is found where it moved to). Similarity is the cosine of one row's
key, its bank's heads and channels side by side (``Hg * D`` values), the lowest over the batch: what
:func:`cmbench.methods.tempcache.key_cosine` measures for a pair.

- **exact** (:func:`exact_nearest`): the cosine of every (query, candidate) pair, in blocks of queries; the
  top-1 (ties: the earliest candidate). Used while ``queries x candidates`` is at most ``exact_limit``.
- **approximate** (:func:`approximate_nearest`): a FAISS HNSW graph (``faiss-cpu``, ``pip install -e
  '.[ann]'``: Meta's maintained similarity-search library, CPU wheels for every platform CMBench runs on;
  HNSW needs no training pass, unlike IVF, so an index is built per frame from the candidates alone) over the
  unit keys averaged over the batch, inner product = cosine; each query's ``ANN_SHORTLIST`` nearest are then
  re-scored exactly (the lowest cosine over the batch) and the best kept. The index can miss the true top-1;
  a miss only merges less (the re-scored cosine is what the threshold sees).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from cmbench.errors import ConfigError

ANN_SHORTLIST = 8  # candidates the HNSW graph returns per query, re-scored exactly
HNSW_NEIGHBOURS = 32  # the graph's M (links per node): FAISS's usual setting for recall above 0.95
EXACT_BLOCK = 2**24  # cosines computed at once by the exact search (float32: 64 MiB)


def unit_keys(keys: torch.Tensor) -> torch.Tensor:
    """Rows' keys as unit vectors, heads and channels side by side.

    Parameters
    ----------
    keys : Tensor, shape ``[B, n, Hg, D]``

    Returns
    -------
    Tensor, shape ``[B, n, Hg * D]``, float32: each row divided by ``max(|row|, 1e-12)``.
    """
    x = keys.float().flatten(2)
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def exact_nearest(queries: torch.Tensor, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's most similar candidate by the lowest cosine over the batch.

    Parameters
    ----------
    queries : Tensor, shape ``[B, m, E]``
    candidates : Tensor, shape ``[B, n, E]``, ``n >= 1``
        Unit rows (:func:`unit_keys`).

    Returns
    -------
    index, cosine : Tensor, shape ``[m]`` (long, float32 on the CPU)
        The candidate (ties: the earliest) and its cosine, the minimum over the batch.
    """
    b, m, _ = queries.shape
    n = candidates.shape[1]
    step = max(1, EXACT_BLOCK // max(1, b * n))
    index, cosine = [], []
    for start in range(0, m, step):
        sims = torch.einsum("bme,bne->bmn", queries[:, start : start + step], candidates).amin(0)  # [rows, n]
        best = sims.max(dim=1)  # torch.max returns the first index of the maximum
        index.append(best.indices.cpu())
        cosine.append(best.values.cpu())
    return torch.cat(index), torch.cat(cosine)


def import_faiss() -> Any:
    """The installed ``faiss`` module; a one-line :class:`ConfigError` naming the extra when absent."""
    try:
        return importlib.import_module("faiss")
    except ImportError as err:
        raise ConfigError(f"method tempcache: the approximate correspondence search needs faiss-cpu ({err}): "
                          f"pip install -e '.[ann]', or raise method.exact_limit to search exactly") from err


def approximate_nearest(queries: torch.Tensor, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`exact_nearest` through a FAISS HNSW index: the index shortlists, the exact cosine decides.

    Parameters
    ----------
    queries : Tensor, shape ``[B, m, E]``
    candidates : Tensor, shape ``[B, n, E]``, ``n >= 1``
        Unit rows (:func:`unit_keys`).

    Returns
    -------
    index, cosine : Tensor, shape ``[m]`` (long, float32 on the CPU)
        Of the shortlisted candidates, the most similar by the lowest cosine over the batch (ties: the earliest).
    """
    faiss = import_faiss()
    n, e = candidates.shape[1], candidates.shape[2]
    mean_c = torch.nn.functional.normalize(candidates.float().mean(0), dim=-1).cpu().contiguous().numpy()
    mean_q = torch.nn.functional.normalize(queries.float().mean(0), dim=-1).cpu().contiguous().numpy()
    index = faiss.IndexHNSWFlat(e, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    index.add(mean_c)
    _, found = index.search(mean_q, min(ANN_SHORTLIST, n))
    short = torch.from_numpy(found).long()  # [m, k], -1 where the graph found fewer
    valid = short >= 0
    short = torch.where(valid, short, short.new_zeros(()))
    device = candidates.device
    picked = candidates[:, short.to(device)]  # [B, m, k, E]
    sims = torch.einsum("bme,bmke->bmk", queries, picked).amin(0).cpu()  # [m, k]
    sims = torch.where(valid, sims, torch.full_like(sims, -float("inf")))
    order = torch.sort(short, dim=1, stable=True)  # ties go to the earliest candidate: scan in candidate order
    sims = sims.gather(1, order.indices)
    best = sims.max(dim=1)
    return order.values.gather(1, best.indices[:, None]).squeeze(1), best.values


def nearest(queries: torch.Tensor, candidates: torch.Tensor, exact_limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`exact_nearest` while ``m * n <= exact_limit`` (queries times candidates), else
    :func:`approximate_nearest`. Shapes and returns as theirs."""
    if queries.shape[1] * candidates.shape[1] <= exact_limit:
        return exact_nearest(queries, candidates)
    return approximate_nearest(queries, candidates)
