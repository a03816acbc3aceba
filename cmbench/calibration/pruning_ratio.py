"""The pruning ratio a method setting realises on calibration contexts (never the test suite).

:class:`PRMeter` runs a method's generation exactly as ``python -m cmbench run`` does (context replay
through the dataset adapter and the backbone's encoder; the context prefilled with the context's seed
under each task's own conditioning, one prefill shared by tasks whose prefill keys agree, as the
evaluator does it: :func:`cmbench.runs.evaluator.prefilled_for`; :func:`cmbench.generation.continue_task`
with each task's seed; the memory plan), on a fixed sample of calibration tasks, and returns the mean
over those tasks of the continuation's PR: the number ``run`` records as a run's ``pr``. Nothing is
decoded or scored. Contexts are encoded once and reused for every setting measured.

The calibration data (:func:`calibration_config`): for MiniWorld, the same suite knobs built with
``world_seed + 1`` under ``calibration.root`` (default ``<data.root>_calibration``, the held-out world
the head map is calibrated on); for any other dataset (the official set), a folder of calibration
contexts in the same format, given as ``calibration.root``. The cache stores its history in the run's
storage format (:func:`calibration_storage`): a bytes target is measured in the bytes the run stores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from cmbench.cache.quantized import StorageFormat
from cmbench.calibration.target_quantity import PR, TargetQuantity
from cmbench.config_paths import editable_copy, to_dict
from cmbench.data import Task, load_manifest
from cmbench.data.adapter import build_adapter
from cmbench.errors import ConfigError
from cmbench.generation import continue_task
from cmbench.hashing import task_seed
from cmbench.methods.base import Method
from cmbench.methods.knobs import Knob


def calibration_config(cfg: DictConfig) -> DictConfig:
    """``cfg`` with ``data`` pointing at the calibration contexts.

    Raises
    ------
    ConfigError
        No calibration folder for a dataset without a built-in calibration world, or one that is the
        test suite's own folder.
    """
    out = editable_copy(cfg)
    data = out.data
    root = OmegaConf.select(cfg, "calibration.root")
    with open_dict(data):
        if str(cfg.data.get("adapter", "")) == "miniworld":
            data.root = str(root or f"{cfg.data.root}_calibration")
            data.world_seed = int(cfg.data.world_seed) + 1
            data.check_counts = False
        elif root:
            data.root = str(root)
        else:
            raise ConfigError(f"calibration.root is not set: data={cfg.data.name} has no built-in calibration world; "
                              "give a folder of calibration contexts in its format (calibration.root=/path), never "
                              "the test suite's")
    if Path(str(data.root)).resolve() == Path(str(cfg.data.root)).resolve():
        raise ConfigError(f"calibration.root={data.root} is the test suite's folder (data.root): a knob calibrated on "
                          "the test contexts would be tuned on the test; give another folder")
    return out


def calibration_storage(cfg: DictConfig) -> StorageFormat:
    """The storage format of ``cfg``'s run (its ``storage`` group; full precision without one), checked
    against the backbone's head dim as ``run`` checks it: the format a calibration measures in.

    Raises
    ------
    ConfigError
        The format's knobs out of range (:func:`cmbench.spec.storage_spec`).
    """
    from cmbench.spec import storage_spec

    block = cfg.get("storage")
    return storage_spec(None if block is None else to_dict(block), to_dict(cfg.backbone))


def calibration_cache_dtype(cfg: DictConfig) -> str | None:
    """The cache precision of ``cfg``'s run (``cache.dtype``, checked as ``run`` checks it; ``None``: the
    model's own): the precision a calibration measures in."""
    from cmbench.spec import cache_dtype_spec

    block = cfg.get("cache")
    return cache_dtype_spec(None if block is None else to_dict(block))


def calibration_tasks(cfg: DictConfig, n_tasks: int) -> list[Task]:
    """The calibration tasks: the suite built or checked (:meth:`ensure`), then the same stratified seeded
    sample of ``n_tasks`` that ``run limit=n_tasks`` takes (``cfg`` from :func:`calibration_config`)."""
    from cmbench.runs.runner import select_tasks

    if n_tasks < 1:
        raise ConfigError(f"calibration.tasks={n_tasks}: expected a positive number of calibration tasks")
    build_adapter(cfg.data).ensure()
    tasks = load_manifest(str(cfg.data.root), str(cfg.data.manifest))
    return select_tasks(tasks, limit=n_tasks, seed=int(cfg.sample_seed))


class PRMeter:
    """Measure the mean continuation PR (or another :class:`TargetQuantity`) of method settings on
    calibration tasks.

    Parameters
    ----------
    cfg : DictConfig
        The root config of the calibration data (:func:`calibration_config`): ``data``, ``backbone``,
        ``generation``, ``seed`` and the run's ``storage`` format, if any (:func:`calibration_storage`).
    tasks : list of Task
        :func:`calibration_tasks`.
    on_task : callable ``(done, total)``, optional
        Called after each task of a measurement (progress inside a probe).
    quantity : TargetQuantity
        What a measurement returns: the PR (default), or the share of FullKV's device bytes saved.
    """

    def __init__(self, cfg: DictConfig, tasks: list[Task], on_task: Callable[[int, int], None] | None = None,
                 quantity: TargetQuantity = PR):
        from cmbench.spec import generation_settings

        if not tasks:
            raise ConfigError(f"no calibration tasks in {cfg.data.root}")
        self.cfg = cfg
        self.tasks = tasks
        self.on_task = on_task
        self.quantity = quantity
        self.settings = replace(generation_settings(cfg.generation), storage=calibration_storage(cfg),
                                cache_dtype=calibration_cache_dtype(cfg))
        self.adapter = build_adapter(cfg.data)
        self.continuation_frames = int(cfg.generation.continuation_frames)
        self.backbone: Any = None
        self._latents: dict[str, torch.Tensor] = {}

    def _contexts(self) -> dict[str, list[Task]]:
        groups: dict[str, list[Task]] = {}
        for task in self.tasks:
            groups.setdefault(task.context_id, []).append(task)
        return groups

    def _encoded(self, task: Task) -> torch.Tensor:
        """The context latents of ``task``, ``[1, C, q0, h, w]`` (encoded once)."""
        from cmbench.runs.evaluator import encode_context

        if task.context_id not in self._latents:
            self._latents[task.context_id] = encode_context(self.cfg.backbone.context, self.adapter, self.backbone, task)[1]
        return self._latents[task.context_id]

    def task_prs(self, method: Method) -> list[float]:
        """The continuation PR (:attr:`quantity`'s searched value) of every calibration task under
        ``method``, in task order."""
        from cmbench.backbones.loading import build_backbone
        from cmbench.backbones.memory.run_plan import plan_run
        from cmbench.runs.evaluator import HeldPrefill, prefilled_for

        plan = plan_run(self.cfg, method)
        if self.backbone is None:
            self.backbone = build_backbone(plan.backbone_config)
        seed = int(self.cfg.seed)
        prs: dict[str, float] = {}
        for group in self._contexts().values():
            held = HeldPrefill(self._encoded(group[0]))
            for task in group:
                cond = self.backbone.condition(task)
                prefilled = prefilled_for(held, task, cond, backbone=self.backbone, method=method,
                                          settings=self.settings, memory=plan, seed=seed)
                cont = continue_task(self.backbone, prefilled, cond, self.continuation_frames,
                                     task_seed(seed, task.task_id))
                prs[task.task_id] = float(self.quantity.measured(cont.ledger))
                if self.on_task is not None:
                    self.on_task(len(prs), len(self.tasks))
        return [prs[t.task_id] for t in self.tasks]

    def __call__(self, method: Method) -> float:
        """The mean continuation PR over the calibration tasks (what ``run`` reports as ``pr``)."""
        return float(np.mean(self.task_prs(method)))


def knob_value(knob: Knob, value: float) -> float | int:
    """A knob value as the method takes it: an int for whole-valued knobs."""
    return int(round(value)) if knob.integer else float(value)
