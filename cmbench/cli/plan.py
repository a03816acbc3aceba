"""``python -m cmbench plan``: the memory plan of a run, before anything is loaded.

    python -m cmbench plan backbone=lingbot_world_v2_14b method=decoprune method.quota_pr=0.85 data=cmbench

Prints the predicted device memory per phase (weights, text encoder, VAE, prefill cache, fork,
activations, scorer), the offloads ``run`` would use on this machine's device (or
``backbone.memory.device_gib``) and whether it fits the reference machines. Exit 1 when it does not fit.
The first line says which context length was planned (``backbone.memory.context_seconds``, else the
longest context of ``data``'s videos, else 60 s). With ``parallel.sequence=P`` every figure is one rank's.
The config is resolved as ``run`` resolves it (:func:`cmbench.spec.resolve_run`): a bad knob of any
group is the one line ``run`` would print, before anything is planned. ``method.target_pr=p`` sizes the
caches of a method whose keep rule depends on the data for PR ``p`` (as ``backbone.memory.assume_pr=p``
does), without the calibration ``run`` makes first; a method whose memory its knob fixes (Streaming's
window) is refused, naming the ``calibrate`` line that finds the knob.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from cmbench.backbones.memory.plan import refusal
from cmbench.backbones.memory.run_plan import plan_for, plans_memory
from cmbench.backbones.memory.targets import TARGETS, cell, fit
from cmbench.calibration.matched_pr import method_knob
from cmbench.calibration.target_pr import requested_target, without_target
from cmbench.errors import ConfigError
from cmbench.spec import resolve_run


def sized_for(cfg: DictConfig, target: float) -> DictConfig:
    """``cfg`` without ``method.target_pr``, its caches sized for PR ``target`` (``backbone.memory.assume_pr``).

    Raises
    ------
    ConfigError
        ``backbone.memory.assume_pr`` is set to another PR.
    """
    out = without_target(cfg)
    if not plans_memory(out.backbone):
        return out
    assumed = OmegaConf.select(out, "backbone.memory.assume_pr")
    if assumed is not None and assumed != target:
        raise ConfigError(f"method.target_pr={target:g} and backbone.memory.assume_pr={assumed:g} both give the PR "
                          f"the caches are sized for: give one")
    with open_dict(out):
        out.backbone.memory.assume_pr = target
    return out


def execute(cfg: DictConfig) -> int:
    """Print the plan; exit 0 when it fits (with the chosen offloads), 1 otherwise."""
    target_pr = requested_target(cfg)  # checked as `run` checks it
    spec = resolve_run(cfg if target_pr is None else sized_for(cfg, target_pr))  # every knob checked, as `run` does
    knob = None if target_pr is None else method_knob(spec.method_config).name  # none: refused as `calibrate` does
    if not plans_memory(spec.backbone):
        print(f"{spec.backbone['name']}: no memory plan (a CPU model without `dit:` and `memory:` blocks); "
              f"it runs as configured")
        return 0
    plan = plan_for(spec.plan_inputs(), spec.method)
    if target_pr is not None:
        name = spec.method_name
        if plan.shape.kv_exact:  # its retention follows its knob, not an assumed PR
            raise ConfigError(f"method.target_pr={target_pr:g}: what {name} keeps follows its {knob}, not a pruning "
                              f"ratio: `python -m cmbench calibrate method={name} target_pr={target_pr:g}` finds its "
                              f"{knob}; plan with method.{knob}=<value>")
        print(f"method.target_pr={target_pr:g}: {name}'s caches sized for PR {target_pr:g}, as "
              f"backbone.memory.assume_pr={target_pr:g} sizes them (run calibrates its {knob} to it first)")
    print(plan.describe())
    split = plan.shape.sequence > 1
    print(f"reference machines (one rank of {plan.shape.sequence} per GPU):" if split else "reference machines:")
    for target in TARGETS:  # split, a one-GPU machine holds one rank: the run needs one such GPU per rank
        name = f"{target.name} per rank" if split and target.processes == 1 else target.name
        print(f"  {name}: {cell(fit(plan.shape, target), target)}")
    if not plan.fits:
        print(f"cmbench plan: {refusal(plan)}")
        return 1
    return 0
