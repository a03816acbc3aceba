"""``python -m cmbench check method=<name>``: check a method against the method contract in seconds.

Runs :func:`cmbench.method_check.check_method` on the configured method (built-in or plug-in, with its
overrides, e.g. ``method.gamma=0.2``) and prints one line per check; exit 1 when any check fails.
``check.context_chunks`` / ``check.continuation_chunks`` / ``check.seed`` size the run. The config is
resolved as ``run`` resolves it (:func:`cmbench.spec.resolve_run`): a knob ``run`` refuses is refused
here in the same one line, and the method checked is the one ``run`` would build.
"""

from __future__ import annotations

from omegaconf import DictConfig

from cmbench.method_check import check_method, format_results
from cmbench.spec import resolve_run, whole


def execute(cfg: DictConfig) -> int:
    spec = resolve_run(cfg)  # every knob checked and the method built, as `run` does
    knobs = cfg.get("check") or {}
    sizes = {key: whole(knobs.get(key, default), f"check.{key}", minimum) or 0
             for key, default, minimum in (("seed", 0, 0), ("context_chunks", 6, 1), ("continuation_chunks", 4, 1))}
    results = check_method(spec.method, settings=spec.generation.settings, **sizes)
    print(f"method {spec.method_name}: contract checks on a random tiny model")
    print(format_results(results))
    failed = [r.name for r in results if not r.passed]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
