"""The key basis of the ``lowrank`` storage format (:mod:`cmbench.cache.lowrank`), fitted on calibration
contexts, never the test suite.

The calibration tasks are those a knob calibration uses (:func:`~cmbench.calibration.pruning_ratio.calibration_config`:
MiniWorld's held-out world, or ``calibration.root`` for another dataset; the same seeded sample of
``calibration.tasks``). Each distinct context is read and encoded as ``run`` does it and prefilled with FullKV in
full precision; the keys its cache then holds (after RoPE and the re-index, as the cache stores them) are
gathered per layer and head, and each head's basis is the right singular vectors of its keys, strongest first.
The file records the fingerprint of the weights it was fitted on and the tasks it read.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from cmbench.cache.kv_cache import KVCache
from cmbench.cache.lowrank import basis_path, fit_basis, save_basis
from cmbench.data import Task


def cached_keys(cache: KVCache) -> list[torch.Tensor]:
    """Every layer's history keys, ``[B * n, H, D]`` each (the heads of its banks put back in head order)."""
    out = []
    for banks in cache.banks:
        parts = {}
        for bank in banks:
            k, _ = bank.history()  # [B, n, Hg, D]
            for i, head in enumerate(bank.group.heads):
                parts[head] = k[:, :, i].reshape(-1, k.shape[-1])
        out.append(torch.stack([parts[h] for h in sorted(parts)], dim=1))
    return out


def fit_key_basis(cfg: DictConfig, n_tasks: int, out: str | Path | None = None) -> Path:
    """Fit the key basis of ``cfg``'s backbone on ``n_tasks`` calibration tasks and write it to ``out``
    (default: beside the backbone's weights, :func:`~cmbench.cache.lowrank.basis_path`); returns the path."""
    from cmbench.backbones.loading import build_backbone
    from cmbench.backbones.memory.run_plan import plan_run
    from cmbench.calibration.pruning_ratio import calibration_config, calibration_tasks
    from cmbench.data.adapter import build_adapter
    from cmbench.errors import ConfigError
    from cmbench.generation import prefill
    from cmbench.identity.code import path_fingerprint
    from cmbench.methods.fullkv import FullKV
    from cmbench.runs.evaluator import encode_context

    weights = cfg.backbone.get("path")
    if out is None and not weights:
        raise ConfigError(f"backbone={cfg.backbone.name} names no weights (path) to write its key basis beside; "
                          "give --out")
    ccfg = calibration_config(cfg)
    tasks = calibration_tasks(ccfg, n_tasks)
    backbone = build_backbone(plan_run(ccfg, FullKV()).backbone_config)
    adapter = build_adapter(ccfg.data)
    layers: list[list[torch.Tensor]] = []
    contexts: dict[str, Task] = {}
    for task in tasks:
        contexts.setdefault(task.context_id, task)
    with torch.no_grad():
        for task in contexts.values():
            latents = encode_context(ccfg.backbone.context, adapter, backbone, task)[1]
            pre = prefill(backbone, FullKV(), latents, backbone.condition(task), seed=int(cfg.seed))
            for layer, keys in enumerate(cached_keys(pre.cache)):
                if layer == len(layers):
                    layers.append([])
                layers[layer].append(keys.float())
    fitted = [fit_basis(torch.cat(keys)) for keys in layers]
    path = Path(out) if out is not None else basis_path(str(weights))
    meta = {"weights": path_fingerprint(str(weights)) if weights else "", "backbone": str(cfg.backbone.name),
            "calibration": f"{ccfg.data.root} ({len(contexts)} contexts of tasks {', '.join(t.task_id for t in tasks)})",
            "keys": "FullKV prefill, as cached (after RoPE and the re-index), uncentered"}
    save_basis(path, torch.stack([b for b, _ in fitted]), torch.stack([s for _, s in fitted]), meta)
    return path
