"""``python -m cmbench check method=<name>``: check a method against the method contract in seconds.

Runs :func:`cmbench.method_check.check_method` on the configured method (built-in or plug-in, with its
overrides, e.g. ``method.gamma=0.2``) and prints one line per check; exit 1 when any check fails.
``check.context_chunks`` / ``check.continuation_chunks`` / ``check.seed`` size the run. The config is
resolved as ``run`` resolves it (:func:`cmbench.spec.resolve_run`): a knob ``run`` refuses is refused
here in the same one line, and the method checked is the one ``run`` would build. The chunk counts are
at most :data:`MAX_CHECK_CHUNKS` each (a contract check runs in seconds; more would only fill memory).

With a quantized ``storage=`` (kivi, qvg) the method runs in that format, and the format itself is
checked first (:func:`cmbench.cache.format_check.check_format`, at the backbone's head dim when its
config declares one): its round trip within the format's error bound and its exact byte count.
"""

from __future__ import annotations

from omegaconf import DictConfig

from cmbench.cache.format_check import check_format
from cmbench.method_check import check_method, format_results
from cmbench.spec import MAX_SEED
from cmbench.spec import declared_head_dim, resolve_run, whole


MAX_CHECK_CHUNKS = 64
"""The most context or continuation chunks ``check`` builds (the defaults are 6 and 4)."""


def execute(cfg: DictConfig) -> int:
    spec = resolve_run(cfg)  # every knob checked and the method built, as `run` does
    knobs = cfg.get("check") or {}
    sizes = {key: whole(knobs.get(key, default), f"check.{key}", minimum, maximum=maximum) or 0
             for key, default, minimum, maximum in (("seed", 0, 0, MAX_SEED), ("context_chunks", 6, 1, MAX_CHECK_CHUNKS),
                                                    ("continuation_chunks", 4, 1, MAX_CHECK_CHUNKS))}
    storage = spec.generation.settings.storage
    format_failed = []
    if storage.quantized:
        checks = check_format(storage, declared_head_dim(spec.backbone) or 32, seed=sizes["seed"])
        knobs = (f"rank={storage.rank}" if storage.name == "lowrank" else
                 f"bits={storage.bits}, group_size={storage.group_size}, stages={storage.stages}")
        print(f"storage {storage.name} ({knobs}, residual={storage.residual}): format checks on random K/V")
        for c in checks:
            print(f"  {'PASS' if c.passed else 'FAIL'}  {c.name}: {c.detail}")
        format_failed = [f"storage {c.name}" for c in checks if not c.passed]
    results = check_method(spec.method, settings=spec.generation.settings, **sizes)
    print(f"method {spec.method_name}: contract checks on a random tiny model")
    print(format_results(results))
    failed = format_failed + [r.name for r in results if not r.passed]
    total = len(results) + (2 if storage.quantized else 0)
    print(f"{total - len(failed)} of {total} checks passed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
