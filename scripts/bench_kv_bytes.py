#!/usr/bin/env python
"""Nominal KV bytes (the ledger's peak) against the measured peak memory of each continuation, both as
ratios to FullKV's on the same tasks in the same run (cmbench/benchmarks/kv_bytes.py holds the code;
docs/kv_bytes.md says how to read it).

Arms: fullkv, streaming, decoprune, worldkv and tempcache when registered, and FullKV in each quantized
storage format the cache knows (kivi 4- and 2-bit, qvg), each at its config's defaults, on the tiny
model and a seeded sample of MiniWorld tasks.

    .venv/bin/python scripts/bench_kv_bytes.py --tasks 2 --out results/bench_kv_bytes
"""

from __future__ import annotations

import argparse
import csv
import platform
import sys
from dataclasses import asdict
from itertools import groupby
from pathlib import Path

import torch

from cmbench.api import compose_config
from cmbench.benchmarks.kv_bytes import REFERENCE, Arm, measure_arm, summarise
from cmbench.cache.quantized import FORMATS
from cmbench.config_schema import CACHE_DTYPES
from cmbench.data import load_manifest
from cmbench.data.adapter import build_adapter
from cmbench.methods.registry import METHODS
from cmbench.provenance import cpu_name, git_commit
from cmbench.runs.runner import select_tasks
from cmbench.spec import resolve_run

WANTED = (REFERENCE, "streaming", "decoprune", "worldkv", "tempcache")
STORAGE = {"kivi": ({"bits": 4}, {"bits": 2}), "qvg": ({},)}  # FullKV in each format the cache knows


def arms(backbone: str, device: str, cache_dtype: str | None = None, formats: bool = True) -> list[Arm]:
    """The arms this checkout can run: the methods of :data:`WANTED` that are registered, then (``formats``) FullKV
    in each quantized format of :data:`STORAGE` the cache knows; every cache in ``cache_dtype`` (``cache.dtype``;
    ``None``: the model's own precision)."""
    base = [f"backbone={backbone}", f"backbone.device={device}", "save_videos=false", "progress=false",
            f"cache.dtype={cache_dtype or 'null'}"]
    wanted = [(m, []) for m in WANTED if m in METHODS]
    wanted += [(REFERENCE, [f"storage={fmt}", *(f"storage.{k}={v}" for k, v in knobs.items())])
               for fmt, options in STORAGE.items() if fmt in FORMATS and formats for knobs in options]
    out = []
    for method, extra in wanted:
        spec = resolve_run(compose_config(method, [*base, *extra]))
        out.append(Arm(spec.identity.label, spec))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2, help="MiniWorld tasks, a seeded stratified sample (default 2)")
    parser.add_argument("--backbone", default="tiny", help="backbone config (default tiny)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="backbone.device (default: cuda when present, else cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--cache-dtype", default=None, choices=CACHE_DTYPES,
                        help="the precision the KV cache stores its rows in (cache.dtype; default: the model's own)")
    parser.add_argument("--out", type=Path, help="write <out>.csv (one row per arm and task) and <out>.md")
    parser.add_argument("--no-formats", action="store_true",
                        help="the methods only, not FullKV in each storage format (on a CPU the profiler's record of "
                             "a quantized format's allocations can outgrow a 24 GiB machine: Quant VideoGen's did)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = arms(args.backbone, args.device, args.cache_dtype, formats=not args.no_formats)
    data = runs[0].spec.data
    build_adapter(data.config).ensure()
    tasks = select_tasks(load_manifest(str(data.root), data.manifest), limit=args.tasks,
                         seed=runs[0].spec.selection.sample_seed)
    contexts = [list(group) for _, group in groupby(tasks, key=lambda t: t.context_id)]
    rows = []
    for arm in runs:
        print(f"  {arm.label} ...", file=sys.stderr, flush=True)
        rows += measure_arm(arm, contexts)
    command = " ".join(["python scripts/bench_kv_bytes.py", *(argv if argv is not None else sys.argv[1:])])
    meter = "torch.cuda.max_memory_allocated" if args.device.startswith("cuda") else \
        "torch profiler, CPU allocator events"
    precision = args.cache_dtype or "the model's own precision"
    lines = [f"# Nominal vs measured KV bytes ({args.backbone} backbone, cache in {precision}, {args.device}: "
             f"{cpu_name() or platform.machine()}, {args.threads} thread(s), commit {git_commit() or 'unknown'})", "",
             f"Command: `{command}`", "",
             f"{len(tasks)} MiniWorld task(s): {', '.join(t.task_id for t in tasks)}. Nominal: the continuation "
             f"ledger's peak stored KV bytes. Measured: peak tensor memory held during the continuation, counted "
             f"from before the context's prefill ({meter}). Prefill: peak tensor memory held while the context was read, "
             f"encoded and prefilled (the temporal re-index included), from the same point. Ratios: per task "
             f"against {REFERENCE}'s, then the mean.",
             "", "| arm | PR | nominal MB | nominal / FullKV | measured MB | measured / FullKV | "
             "measured - nominal MB | held at start MB | host store MB | prefill MB | prefill / FullKV |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summarise(rows):
        lines.append(f"| {s.arm} | {s.pr:.3f} | {s.nominal_mb:.2f} | {s.nominal_ratio:.3f} | {s.measured_mb:.2f} | "
                     f"{s.measured_ratio:.3f} | {s.transient_mb:.2f} | {s.start_mb:.2f} | {s.store_mb:.2f} | "
                     f"{s.prefill_mb:.2f} | {s.prefill_ratio:.3f} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.with_suffix(".md").write_text(text)
        with args.out.with_suffix(".csv").open("w", newline="") as fh:
            fh.write(f"# {command}\n")
            writer = csv.DictWriter(fh, fieldnames=list(asdict(rows[0])))
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
