"""Which reference machines a plan fits, with which offloads: the table of docs/real_backbones.md.

Each target is checked with :func:`~cmbench.backbones.memory.plan.choose_plan` (device memory minus the
reserve; host memory is reported, not checked, since it depends on the node). Without
``parallel.sequence`` CMBench runs one model per GPU (``torchrun`` shards contexts), so "4xH200" fits
exactly where one H200 does, four contexts at a time, with four times the host memory for the offloads.
A row split over ``P`` ranks (``parallel.sequence=P``) is one rank's memory: each GPU of the machine holds
one rank (4xH200 with ``P = 4``: the paper's setup, one model over the four GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from cmbench.backbones.memory.plan import GIB, MemoryPlan, RunShape, choose_plan
from cmbench.backbones.memory.run_plan import DEFAULT_RESERVE_GIB

# the rows of docs/real_backbones.md's table: (backbone config, method overrides), one-minute context;
# `method=decoprune` alone is its own rule sized for the paper's realised PR, `method.quota_pr` is exact
DOCUMENTED = (("lingbot_world_v2_14b", ("method=fullkv",)),
              ("lingbot_world_v2_14b", ("method=decoprune",)),
              ("lingbot_world_v2_14b", ("method=decoprune", "method.quota_pr=0.85")),
              ("lingbot_world_v2_1_3b", ("method=fullkv",)),
              ("lingbot_world_v2_1_3b", ("method=decoprune", "method.quota_pr=0.85")),
              ("lingbot_world_v2_14b", ("method=fullkv", "parallel.sequence=4")),
              ("lingbot_world_v2_14b", ("method=decoprune", "parallel.sequence=4")),
              ("lingbot_world_v2_14b", ("method=decoprune", "method.quota_pr=0.85", "parallel.sequence=4")),
              ("lingbot_world_v2_1_3b", ("method=fullkv", "parallel.sequence=4")))


@dataclass(frozen=True)
class Target:
    """A reference machine: GPUs, the memory of one, and how many processes share its host."""

    name: str
    device_gib: float
    processes: int = 1


TARGETS = (Target("one H200 (139 GiB)", 139.0), Target("4xH200 (one model per GPU, or split: one rank per GPU)", 139.0, 4),
           Target("one 80 GB GPU (79.6 GiB)", 79.6))
SHORT = {"text_cpu": "text on CPU", "park_prefill": "prefilled KV in host RAM",
         "offload_kv": "all KV in host RAM, PCIe-bound"}


def fit(shape: RunShape, target: Target, reserve_gib: float = DEFAULT_RESERVE_GIB) -> MemoryPlan:
    """The cheapest plan for ``target`` (host not checked)."""
    return choose_plan(shape, int(target.device_gib * GIB), None, int(reserve_gib * GIB))


def cell(plan: MemoryPlan, target: Target) -> str:
    """A table cell: fits or not, the offloads, the device peak and the host need of the node."""
    if not plan.fits_device():
        return f"no: {plan.peak / GIB:.0f} GiB even with every offload"
    offloads = ", ".join(SHORT[o] for o in plan.offloads) or "as configured"
    host = f"; host {target.processes * plan.host_need / GIB:.0f} GiB" if plan.host else ""
    return f"yes ({offloads}): {plan.peak / GIB:.0f} GiB{host}"


def fit_table(shapes: list[RunShape], reserve_gib: float = DEFAULT_RESERVE_GIB) -> str:
    """Markdown: one row per shape, with the figures ``python -m cmbench plan`` prints for it: the weights,
    the continuation's prefilled and task K/V and the peak as configured (``backbone.memory.offloads=off``),
    then its line for each :data:`TARGETS` entry."""
    head = ["backbone + method", "DiT / text enc. (GiB)", "prefilled KV (GiB)", "task KV (GiB)",
            "peak, as configured (GiB)"] + [t.name for t in TARGETS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes:
        plain = choose_plan(shape, None, None, 0, auto=False)
        continuation = plain.phases["continuation"]
        row = [shape.name, f"{shape.dit / GIB:.2f} / {shape.text / GIB:.2f}",
               f"{continuation['prefilled KV'] / GIB:.2f}", f"{continuation['task KV'] / GIB:.2f}",
               f"{plain.peak / GIB:.2f} ({plain.peak_phase})"]
        row += [cell(fit(shape, t, reserve_gib), t) for t in TARGETS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def documented_shapes(context_seconds: float = 60.0) -> list[RunShape]:
    """The :data:`DOCUMENTED` runs' shapes, from the shipped configs (a one-minute context, the paper's
    scorer on the same GPU)."""
    from hydra import compose, initialize_config_dir

    from cmbench.backbones.memory.run_plan import run_shape
    from cmbench.config_paths import CONFIG_DIR, knob_overrides, to_dict
    from cmbench.methods.registry import build_method

    shapes = []
    for backbone, method in DOCUMENTED:
        overrides = [f"backbone={backbone}", *method, "scorer=owl_sam_dino",
                     f"backbone.memory.context_seconds={context_seconds}"]
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = compose(config_name="config", overrides=knob_overrides(overrides))
        shapes.append(run_shape(cfg, build_method(to_dict(cfg.method))))
    return shapes
