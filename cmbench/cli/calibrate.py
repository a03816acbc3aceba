"""``python -m cmbench calibrate method=X target_pr=0.85``: the method's own knob for a target PR.

Searches the knob the method declares (:attr:`cmbench.methods.base.Method.knob`) on calibration
contexts (``calibration.root``; for MiniWorld a world built with ``world_seed + 1``), printing every
probe, and writes ``<out_dir>/calibration/method/<method>_pr<t>.yaml`` (a method config to run as is)
and ``<out_dir>/calibration/<method>_pr<t>.json`` (the search log); then prints the ``run`` line that
uses it. A rerun of the same calibration reuses the log. See docs/matched_pr.md.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cmbench.calibration.matched_pr import (CALIBRATION_DIR, Calibration, calibrate_method, calibration_options, method_knob,
                                            pr_tag)
from cmbench.calibration.progress import CalibrationProgress
from cmbench.calibration.target_quantity import BYTES, NAMED, PR, TargetQuantity
from cmbench.config_paths import to_dict
from cmbench.errors import ConfigError

# overrides that choose the method or the calibration, not the setup a calibrated run shares
_CALIBRATION_OVERRIDES = ("method=", "method.", "+method.", "++method.", "target_pr=", "target_bytes=", "target_prs=",
                          "methods=",
                          "calibration.", "label=")


def target_of(value: object, key: str = "target_pr") -> float:
    """A target PR from the command line, checked."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"{key}={value!r}: expected a pruning ratio in [0, 1), e.g. {key}=0.85")
    return float(value)


def setup_overrides() -> list[str]:
    """The command line's overrides that a run with the calibrated method must repeat (data, backbone,
    generation, seed, out_dir ...): every Hydra override except the method and calibration ones."""
    from hydra.core.hydra_config import HydraConfig

    return [o for o in HydraConfig.get().overrides.task if not o.startswith(_CALIBRATION_OVERRIDES)]


def run_line(result: Calibration, overrides: list[str]) -> str:
    """The exact ``<interpreter> -m cmbench run`` line that runs the calibrated method config, with the
    interpreter that runs this command (``sys.executable``): it works outside an activated venv too. The
    config folder is where CMBench wrote the yaml (``result.yaml`` is computed, never a received log's)."""
    folder = str(Path(result.yaml).parent.parent.resolve())
    extra = os.environ.get("CMBENCH_CONFIG_PATH")
    path = folder + (os.pathsep + extra if extra else "")
    option = Path(result.yaml).stem
    args = [f"method={option}", f"label={result.label}", *overrides]
    python = shlex.quote(sys.executable or "python")  # the interpreter that ran calibrate: it has CMBench
    return f"CMBENCH_CONFIG_PATH={shlex.quote(path)} {python} -m cmbench run {' '.join(shlex.quote(a) for a in args)}"


def show_probe(value: float, pr: float, quantity: TargetQuantity = PR) -> None:
    """One line of the search log (of a calibration reused, not measured now)."""
    print(f"  probe {value:.6g}: {quantity.text(pr)}", flush=True)


def progress(cfg: DictConfig, max_probes: int, quantity: TargetQuantity = PR) -> CalibrationProgress:
    """Progress lines of calibrating ``cfg.method`` (stdout, with the search log)."""
    return CalibrationProgress(method_knob(to_dict(cfg.method)).name, max_probes, stream=sys.stdout, quantity=quantity)


def describe(result: Calibration) -> list[str]:
    """The result in a few lines: found value, calibration PR against the target, files, note."""
    state = "reused (same calibration)" if result.cached else "found"
    lines = [f"{result.label}: {result.knob}={result.value} {state}: calibration {NAMED[result.quantity].label} "
             f"{result.calibration_pr:.4f} "
             f"(target {result.target_pr:.4f}, {len(result.probes)} probes on {len(result.data['task_ids'])} tasks "
             f"of {result.data['root']}"
             + (f", {len(result.reused_probes)} more from calibrations to other targets" if result.reused_probes else "")
             + ")"]
    if result.note:
        lines.append(f"note: {result.note}")
    if result.written:
        *most, last = result.written
        lines.append(f"wrote {', '.join(most)} and {last}" if most else f"wrote {last}")
    else:
        lines.append(f"kept {result.yaml} and {result.log} (already this calibration's)")
    return lines


def execute(cfg: DictConfig) -> int:
    given = [q for q in (PR, BYTES) if OmegaConf.select(cfg, q.key) is not None]
    if len(given) != 1:
        raise ConfigError("target_pr is required, or target_bytes instead (one of them): python -m cmbench calibrate "
                          "method=<name> target_pr=0.85 (a pruning ratio) or target_bytes=0.15 (device KV bytes over "
                          "FullKV's)")
    quantity = given[0]
    target = quantity.check(OmegaConf.select(cfg, quantity.key), quantity.key)
    name = str(cfg.method.name)
    print(f"calibrating {name} to {quantity.label} {target:.4f} ({pr_tag(target, quantity)}) on calibration contexts; "
          f"writing into {Path(str(cfg.out_dir)) / CALIBRATION_DIR}")

    options = calibration_options(cfg)
    shown = progress(cfg, int(options["max_probes"]), quantity)
    result = calibrate_method(cfg, target, **options, on_probe=shown.probe, on_task=shown.task,  # type: ignore[arg-type]
                              quantity=quantity)
    if result.cached:
        for value, pr in result.probes:
            show_probe(value, pr, quantity)
    for line in describe(result):
        print(line)
    print(f"run it:\n  {run_line(result, setup_overrides())}")
    return 0
