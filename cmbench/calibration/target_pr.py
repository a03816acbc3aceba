"""``method.target_pr=p``: the method's own rule at the knob value calibrated to PR ``p``.

The obvious way to compare methods at one pruning ratio, ``run -m method=decoprune,tempdiff
method.target_pr=0.85``, runs each method as its paper does (its own keep rule, decided once per
chunk) with its declared knob (:attr:`Method.knob`) set to the value that gives PR ``p`` on the
calibration contexts (:func:`cmbench.calibration.matched_pr.calibrate_method`: calibrated once, cached
in ``<out_dir>/calibration/``, reused by every later run). Entrances (``run``, ``cmbench.evaluate``)
call :func:`resolve_target_pr` before anything else reads the method: afterwards the config holds the
knob value and no ``target_pr``, so the run is the very run ``method.<knob>=<value>`` would make (same
run folder, same records), labelled ``<method>@pr<p>`` and with the target and the calibration PR in
its records.

``method.target_bytes=b`` does the same with the device bytes of the KV cache: the knob value whose
calibration runs store ``b`` of FullKV's bytes (``kv_bytes_ratio``, :mod:`cmbench.cache.ledger`), through
the same calibration (:mod:`cmbench.calibration.target_quantity`); the run is labelled
``<method>@bytes<b>`` and its records carry ``target_bytes`` and ``calibration_bytes``.

A per-chunk quota that replaces the method's rule is another thing, with its own names:
``method.quota_pr`` / ``method.quota_tokens`` (:class:`cmbench.methods.base.ScoredMethod`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, open_dict

from cmbench.calibration.matched_pr import Calibration, calibrate_method, calibration_options, method_knob, pr_tag
from cmbench.calibration.progress import CalibrationProgress
from cmbench.calibration.target_quantity import BYTES, PR, QUANTITIES, TargetQuantity, check_bytes_floor
from cmbench.config_paths import editable_copy, to_dict
from cmbench.errors import ConfigError
from cmbench.identity.labels import auto_label, storage_suffix

QUOTA_KEYS = ("quota_pr", "quota_tokens")


@dataclass(frozen=True)
class ResolvedTarget:
    """A root config with ``method.target_pr`` resolved.

    Attributes
    ----------
    cfg : DictConfig
        The config to run: unchanged when ``method.target_pr`` is not set; else a copy whose method holds
        the calibrated knob value instead of ``target_pr``, and whose ``label`` (unless one was given)
        is ``<method>@pr<p>``.
    calibration : Calibration or None
        The calibration used (``None`` when ``method.target_pr`` is not set).
    """

    cfg: DictConfig
    calibration: Calibration | None = None

    def record_fields(self) -> dict[str, Any]:
        """``target_pr`` and ``calibration_pr`` for every record of the run: the calibrated target and
        the knob's calibration PR, or a quota's ``quota_pr`` (no calibration PR), or nothing."""
        if self.calibration is not None and self.calibration.quantity == BYTES.name:
            return {"target_pr": None, "calibration_pr": None, "target_bytes": self.calibration.target_pr,
                    "calibration_bytes": self.calibration.calibration_pr}
        if self.calibration is not None:
            return {"target_pr": self.calibration.target_pr, "calibration_pr": self.calibration.calibration_pr}
        return {"target_pr": self.cfg.method.get("quota_pr"), "calibration_pr": None}


def _label(method_cfg: dict[str, Any], knob: str, target: float, quantity: TargetQuantity = PR) -> str:
    """``<method>@pr<t>``, after the other knobs that differ from the class (``decoprune@probe_step=2,pr85``)."""
    base = auto_label({k: v for k, v in method_cfg.items() if k != knob})
    return f"{base}{',' if '@' in base else '@'}{pr_tag(target, quantity)}"


def requested_target(cfg: DictConfig, quantity: TargetQuantity = PR) -> float | None:
    """``cfg.method.target_pr`` (``quantity``'s key), checked: a pruning ratio in [0, 1) (a bytes ratio in
    (0, 1]) with no quota and no other target beside it (None: not set).

    Raises
    ------
    ConfigError
        One line: a target outside its range, a target together with a quota or another target, a bytes
        target below what the method's sink and recent window alone store.
    """
    target = cfg.method.get(quantity.key)
    if target is None:
        return None
    target = quantity.check(target, f"method.{quantity.key}")
    name = str(cfg.method.get("name") or cfg.method.get("_target_"))
    quota = [k for k in QUOTA_KEYS if cfg.method.get(k) is not None]
    if quota:
        raise ConfigError(f"method {name}: method.{quantity.key} runs its own rule at a calibrated knob and "
                          f"method.{quota[0]} replaces that rule by a per-chunk quota: give one of them")
    other = [q.key for q in QUANTITIES if q is not quantity and cfg.method.get(q.key) is not None]
    if other:
        raise ConfigError(f"method {name}: method.{quantity.key} and method.{other[0]} both set the knob: give one of them")
    if quantity is BYTES:
        check_bytes_floor(cfg, target, f"method.{quantity.key}")
    return target


def without_target(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` without ``method.target_pr`` or ``method.target_bytes``."""
    out = editable_copy(cfg)
    with open_dict(out):
        for quantity in QUANTITIES:
            if quantity.key in out.method:
                del out.method[quantity.key]
    return out


def resolve_target_pr(cfg: DictConfig, verbose: bool = True) -> ResolvedTarget:
    """Resolve ``cfg.method.target_pr`` into the method's calibrated knob (calibrating it if not cached).

    Parameters
    ----------
    cfg : DictConfig
        The root config of a run (``method``, ``data``, ``backbone``, ``generation``, ``seed``,
        ``out_dir``, ``calibration``).
    verbose : bool
        Say on stderr what is calibrated or reused, and each probe of a new calibration.

    Returns
    -------
    ResolvedTarget

    Raises
    ------
    ConfigError
        One line: a target outside [0, 1), ``target_pr`` together with a quota, a method that declares no
        knob, a target its knob cannot reach on the calibration contexts, bad calibration options or data.
    """
    quantity, target = next(((q, t) for q in QUANTITIES if (t := requested_target(cfg, q)) is not None), (PR, None))
    if target is None:  # not set, or method.target_pr=null (e.g. a sweep's default arm): no target
        return ResolvedTarget(without_target(cfg) if any(q.key in cfg.method for q in QUANTITIES) else cfg)
    name = str(cfg.method.get("name") or cfg.method.get("_target_"))
    out = without_target(cfg)
    method_cfg = to_dict(out.method)
    knob = method_knob(method_cfg).name

    options = calibration_options(cfg)
    shown = CalibrationProgress(knob, int(options["max_probes"]), header=(  # no line before a refusal: one line
        f"{name}: method.{quantity.key}={target:g}: calibrating its {knob} on calibration contexts (once; later "
        f"runs reuse it)"), quantity=quantity)
    cal = calibrate_method(out, target, **options,  # type: ignore[arg-type]
                           on_probe=shown.probe if verbose else None, on_task=shown.task if verbose else None,
                           quantity=quantity)
    if verbose:
        print(f"{name}: {knob}={cal.value} ({'reused' if cal.cached else 'found'}): calibration {quantity.label} "
              f"{cal.calibration_pr:.4f}, target {cal.target_pr:.4f}" + (f"; note: {cal.note}" if cal.note else ""),
              file=sys.stderr, flush=True)
    with open_dict(out):
        out.method[knob] = cal.value
        if not out.get("label"):
            out.label = _label(method_cfg, knob, target, quantity) + storage_suffix(out.get("storage"))
    return ResolvedTarget(out, cal)
