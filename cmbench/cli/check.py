"""``python -m cmbench check method=<name>``: check a method against the method contract in seconds.

Runs :func:`cmbench.method_check.check_method` on the configured method (built-in or plug-in, with its
overrides, e.g. ``method.gamma=0.2``) and prints one line per check; exit 1 when any check fails.
``check.context_chunks`` / ``check.continuation_chunks`` / ``check.seed`` size the run.
"""

from __future__ import annotations

from omegaconf import DictConfig

from cmbench.config_paths import to_dict

from cmbench.spec import generation_settings
from cmbench.method_check import check_method, format_results


def execute(cfg: DictConfig) -> int:
    knobs = cfg.get("check") or {}
    method_cfg = to_dict(cfg.method)
    results = check_method(method_cfg, seed=int(knobs.get("seed", 0)),
                           context_chunks=int(knobs.get("context_chunks", 6)),
                           continuation_chunks=int(knobs.get("continuation_chunks", 4)),
                           settings=generation_settings(cfg.generation))
    print(f"method {cfg.method.get('name') or cfg.method.get('_target_')}: contract checks on a random tiny model")
    print(format_results(results))
    failed = [r.name for r in results if not r.passed]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
