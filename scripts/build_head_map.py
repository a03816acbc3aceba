"""Build a static / dynamic head map (ForcingKV's JSON) for DeCoPrune-HS and ForcingKV.

Rule (paper, Appendix B, from ForcingKV): FullKV attention at the first continuation denoising call
of each calibration context; s(l, h) = mass on the last 4 context latent frames / mass on all context
frames except the first 4, pooled over the contexts as sum over sum; static iff s >= 0.8; layer 0 all
dynamic.

Usage (anything after the script's own options is a Hydra override of configs/config.yaml)::

    python scripts/build_head_map.py --out head_map.json --contexts 15 backbone=tiny data=miniworld

LingBot World v2 (a GPU; 15 calibration videos in the official layout, not the test set)::

    python scripts/build_head_map.py --out head_maps/lingbot_world_v2_14b.json --contexts 15 \
        backbone=lingbot_world_v2_14b data=cmbench data.root=<calibration videos> data.check_counts=false

The calibration contexts are the first ``--contexts`` context videos of the manifest in context-id
order. The JSON keeps the scores, threshold, calibration context ids and backbone name as metadata.
The last line printed compares the static count with the paper's LingBot map (232 of 1,600).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from cmbench.config_paths import CONFIG_DIR
from cmbench.data import load_manifest
from cmbench.errors import CMBenchError
from cmbench.runs.evaluator import ModelEvaluator, encode_context
from cmbench.spec import resolve_run
from cmbench.calibration.head_map import calibrate_head_scores, paper_check
from cmbench.methods.head_map import HeadMap
from cmbench.hashing import task_seed


def calibration_contexts(evaluator: ModelEvaluator, context: dict, tasks, count: int, seed: int):
    """Yield ``(latents, cond, seed)`` for the first ``count`` contexts (by context id), each read and
    encoded as ``run`` reads it, conditioned on its first task."""
    first_task = {}
    for task in sorted(tasks, key=lambda t: (t.context_id, t.task_id)):
        first_task.setdefault(task.context_id, task)
    chosen = sorted(first_task)[:count]
    for context_id in chosen:
        task = first_task[context_id]
        latents = encode_context(context, evaluator.adapter, evaluator.backbone, task)[1]
        yield latents, evaluator.backbone.condition(task), task_seed(seed, context_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="where to write the head-map JSON")
    parser.add_argument("--contexts", type=int, default=15, help="calibration contexts (paper: 15)")
    parser.add_argument("--threshold", type=float, default=0.8, help="static iff s >= threshold")
    parser.add_argument("--first", type=int, default=4, help="leading context frames left out of the denominator")
    parser.add_argument("--last", type=int, default=4, help="trailing context frames in the numerator")
    args, overrides = parser.parse_known_args(argv)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    try:
        spec = resolve_run(cfg)
        evaluator = ModelEvaluator(spec.method, spec.generation, spec.data, spec.backbone, spec.scorer,
                                   seed=spec.selection.seed)
        tasks = load_manifest(str(spec.data.root), spec.data.manifest)
        contexts = list(calibration_contexts(evaluator, spec.backbone["context"], tasks, args.contexts, spec.selection.seed))
        scores = calibrate_head_scores(evaluator.backbone, contexts, spec.generation.settings, args.first, args.last)
    except CMBenchError as err:
        print(f"build_head_map: error: {err}", file=sys.stderr)
        return 1
    ids = sorted({t.context_id for t in tasks})[: args.contexts]
    hmap = HeadMap.from_scores(scores, args.threshold, dynamic_layers=(0,), backbone=str(cfg.backbone.name),
                               calibration_contexts=ids, first=args.first, last=args.last,
                               head_scores=[[round(float(s), 6) for s in row] for row in scores])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    hmap.save(args.out)
    total = hmap.num_layers * hmap.num_heads
    print(f"{args.out}: {hmap.num_static} static / {total - hmap.num_static} dynamic layer-heads "
          f"from {len(contexts)} contexts (threshold {args.threshold})")
    print(paper_check(hmap.num_static, hmap.num_layers, hmap.num_heads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
