#!/usr/bin/env python
"""Does the backbone use its memory? Ground-truth similarity in the target's region, per method.

For a fixed, seeded sample of MiniWorld tasks (stratified by source and task type, as ``limit=N``
picks them), every method prefills each context once and generates each task's continuation
exactly as ``python -m cmbench run`` does (same seeds, same generation settings). The generated
frames are compared with the true continuation that MiniWorld renders along the task's camera plan.

Measure (target-region similarity, 0..1): in every continuation frame that shows the whole target,
the SSIM between the generated and the true RGB pixels of the target's bounding box padded by 2 px
(``skimage.metrics.structural_similarity``, 7x7 window, data range 255, negative values clipped to
0); a task's value is the mean over those frames (MiniWorld guarantees at least 4). It needs no
detector or embedder, so it checks the model, not the scorer: the target reappears with its true
pattern and colours only if the model retrieves it from the cache (no sink, no recent window holds
it, by construction of the suite).

Printed: FullKV, Streaming (sink 1 + recent 2 chunks), No context (sink only) and DeCoPrune at its
defaults; then DeCoPrune (the paper's online procedure, quota mode), Random (DeCoPrune's per-chunk
keep counts of the same task) and Reverse (quota mode) at PR 0.80 / 0.85 / 0.90, with paired
per-task win counts and the paired 95% interval of DeCoPrune - Random. With ``--rope-ablation``:
FullKV, Streaming, DeCoPrune and Random (DeCoPrune's counts) at ``--ablation-pr``, each with and
without the temporal RoPE re-index (``generation.rope_reindex``), and the paired drop of each.
Required: FullKV - Streaming >= 0.2, and No context below FullKV and DeCoPrune
and not above Streaming by more than 2 paired standard errors (neither holds any of the target, so
their order is noise); the exit code is 1 if either fails.

Usage (arguments after the script's own are Hydra overrides of configs/config.yaml)::

    python scripts/check_memory.py --tasks 30 --json runs/check_memory.json backbone.path=/my/weights.safetensors
    python scripts/check_memory.py --data miniworld_static backbone=tiny_static   # the static world and weights
    python scripts/check_memory.py --tasks 12 --prs 0.85 --rope-ablation          # a smaller, cheaper run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cmbench.backbones.loading import build_backbone  # noqa: E402
from cmbench.benchmarks.memory_check import (  # noqa: E402
    MemoryCheck,
    Outcome,
    check_configs,
    method_config,
    no_context_lowest,
    paired_difference,
    paired_interval,
    summary,
    wins,
)
from cmbench.data import load_manifest  # noqa: E402
from cmbench.errors import CMBenchError  # noqa: E402
from cmbench.runs.runner import select_tasks  # noqa: E402

PRS = (0.80, 0.85, 0.90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=30, help="size of the fixed, stratified task sample")
    parser.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True,
                        help="also run DeCoPrune / Random / Reverse at PR 0.80, 0.85, 0.90")
    parser.add_argument("--prs", type=float, nargs="+", default=list(PRS), help="pruning ratios of the sweep")
    parser.add_argument("--rope-ablation", action="store_true",
                        help="also run FullKV, Streaming, DeCoPrune and Random without the RoPE re-index")
    parser.add_argument("--ablation-pr", type=float, default=0.85, help="DeCoPrune / Random PR of the ablation")
    parser.add_argument("--data", default="miniworld", help="the MiniWorld data config (built beforehand by prepare)")
    parser.add_argument("--json", type=Path, help="write every per-task number here")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 is fastest for 256-token chunks, and on a shared machine)")
    args, overrides = parser.parse_known_args(argv)
    torch.set_num_threads(args.threads)
    try:
        cfg, settings, no_reindex = check_configs(args.data, overrides)
        backbone = build_backbone(cfg.backbone)
        tasks = select_tasks(load_manifest(str(cfg.data.root), str(cfg.data.manifest)), limit=args.tasks,
                             seed=int(cfg.sample_seed))
        check = MemoryCheck(backbone, settings, tasks, int(cfg.seed))
    except CMBenchError as err:
        print(f"check_memory: error: {err}", file=sys.stderr)
        return 2
    print(f"{len(tasks)} tasks over {len(check.contexts)} contexts; backbone {cfg.backbone.name}; "
          f"measure: target-region SSIM (0..1)", flush=True)

    results: dict[str, dict[str, Outcome]] = {}

    def run(label: str, method_cfg: dict, counts=None, settings=None) -> None:
        start = time.perf_counter()
        results[label] = check.run(method_cfg, counts, settings)
        mean, se, pr = summary(results[label])
        print(f"  {label:<22} similarity {mean:.3f} +- {se:.3f}   PR {100 * pr:5.1f}%   "
              f"({time.perf_counter() - start:.0f} s)", flush=True)

    run("FullKV", method_config("fullkv"))
    run("Streaming", method_config("streaming"))
    run("No context (sink)", method_config("streaming", recent_chunks=0))
    run("DeCoPrune (default)", method_config("decoprune"))
    prs = args.prs if args.sweep else []
    for pr in prs:
        run(f"DeCoPrune @ {pr:.2f}", method_config("decoprune", quota_pr=pr))
        counts = {k: o.kept_tokens for k, o in results[f"DeCoPrune @ {pr:.2f}"].items()}
        run(f"Random @ {pr:.2f}", method_config("random"), counts)
        run(f"Reverse @ {pr:.2f}", method_config("decoprune_reverse", quota_pr=pr))
    ablation: dict[str, tuple[str, str]] = {}
    if args.rope_ablation:
        pr = args.ablation_pr
        on = {"FullKV": "FullKV", "Streaming": "Streaming", "DeCoPrune": f"DeCoPrune @ {pr:.2f}",
              "Random": f"Random @ {pr:.2f}"}
        if on["DeCoPrune"] not in results:
            run(on["DeCoPrune"], method_config("decoprune", quota_pr=pr))
            counts = {k: o.kept_tokens for k, o in results[on["DeCoPrune"]].items()}
            run(on["Random"], method_config("random"), counts)
        run("FullKV (no re-index)", method_config("fullkv"), settings=no_reindex)
        run("Streaming (no re-index)", method_config("streaming"), settings=no_reindex)
        run(f"DeCoPrune @ {pr:.2f} (no re-index)", method_config("decoprune", quota_pr=pr), settings=no_reindex)
        counts = {k: o.kept_tokens for k, o in results[f"DeCoPrune @ {pr:.2f} (no re-index)"].items()}
        run(f"Random @ {pr:.2f} (no re-index)", method_config("random"), counts, settings=no_reindex)
        ablation = {name: (label, f"{label} (no re-index)") for name, label in on.items()}

    print("\n| method | target-region similarity | +- s.e. | PR |\n|---|---|---|---|")
    for label, res in results.items():
        mean, se, pr = summary(res)
        print(f"| {label} | {mean:.3f} | {se:.3f} | {100 * pr:.1f}% |")
    print("\npaired per-task wins (first / tie / second):")
    print(f"  FullKV vs Streaming: {wins(results['FullKV'], results['Streaming'])}")
    print(f"  DeCoPrune (default) vs FullKV: {wins(results['DeCoPrune (default)'], results['FullKV'])}")
    for pr in prs:
        d, r = results[f"DeCoPrune @ {pr:.2f}"], results[f"Random @ {pr:.2f}"]
        mean, low, high = paired_interval(d, r)
        print(f"  PR {pr:.2f}: DeCoPrune vs Random {wins(d, r)} (DeCoPrune - Random {mean:+.3f}, "
              f"95% CI {low:+.3f}..{high:+.3f}), DeCoPrune vs Reverse {wins(d, results[f'Reverse @ {pr:.2f}'])}")
    if ablation:
        print("\nRoPE re-index ablation (with - without; paired over tasks):")
        for name, (with_label, without_label) in ablation.items():
            mean, low, high = paired_interval(results[with_label], results[without_label])
            print(f"  {name:<10} {summary(results[with_label])[0]:.3f} -> {summary(results[without_label])[0]:.3f}  "
                  f"drop {mean:+.3f} (95% CI {low:+.3f}..{high:+.3f})")

    full, stream = (summary(results[k])[0] for k in ("FullKV", "Streaming"))
    above, se = paired_difference(results["No context (sink)"], results["Streaming"])
    print(f"  No context - Streaming: {above:+.3f} +- {se:.3f} (paired s.e.)")
    checks = {
        "FullKV - Streaming >= 0.2": full - stream >= 0.2,
        "No context lowest (Streaming within 2 paired s.e.)": no_context_lowest(results),
    }
    goal = summary(results["DeCoPrune (default)"])[0] >= full - 0.05
    verdicts = "; ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in checks.items())
    print(f"\nrequired: {verdicts}")
    print(f"goal (not required): DeCoPrune default within 0.05 of FullKV: {'yes' if goal else 'no'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "tasks": [t.task_id for t in tasks],
            "measure": "target-region SSIM",
            "overrides": overrides,
            "results": {label: {k: {"similarity": o.similarity, "pr": o.pr} for k, o in res.items()}
                        for label, res in results.items()},
            "checks": checks,
        }, indent=1) + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
