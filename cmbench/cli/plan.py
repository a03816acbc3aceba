"""``python -m cmbench plan``: the memory plan of a run, before anything is loaded.

    python -m cmbench plan backbone=lingbot_world_v2_14b method=decoprune method.quota_pr=0.85 data=cmbench

Prints the predicted device memory per phase (weights, text encoder, VAE, prefill cache, fork,
activations, scorer), the offloads ``run`` would use on this machine's device (or
``backbone.memory.device_gib``) and whether it fits the reference machines. Exit 1 when it does not fit.
The first line says which context length was planned (``backbone.memory.context_seconds``, else the
longest context of ``data``'s videos, else 60 s). With ``parallel.sequence=P`` every figure is one rank's.
The config is resolved as ``run`` resolves it (:func:`cmbench.spec.resolve_run`): a bad knob of any
group is the one line ``run`` would print, before anything is planned.
"""

from __future__ import annotations

from omegaconf import DictConfig

from cmbench.backbones.memory.plan import refusal
from cmbench.backbones.memory.run_plan import plan_for, plans_memory
from cmbench.backbones.memory.targets import TARGETS, cell, fit
from cmbench.spec import resolve_run


def execute(cfg: DictConfig) -> int:
    """Print the plan; exit 0 when it fits (with the chosen offloads), 1 otherwise."""
    spec = resolve_run(cfg)  # the run's every knob checked, its method built, as `run` does
    if not plans_memory(spec.backbone):
        print(f"{spec.backbone['name']}: no memory plan (a CPU model without `dit:` and `memory:` blocks); "
              f"it runs as configured")
        return 0
    plan = plan_for(spec.plan_inputs(), spec.method)
    print(plan.describe())
    print("reference machines:" if plan.shape.sequence == 1 else
          f"reference machines (one rank of {plan.shape.sequence} per GPU):")
    for target in TARGETS:
        print(f"  {target.name}: {cell(fit(plan.shape, target), target)}")
    if not plan.fits:
        print(f"cmbench plan: {refusal(plan)}")
        return 1
    return 0
