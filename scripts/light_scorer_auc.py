"""ROC AUC of a scorer at telling a MiniWorld object from its same-category twin.

For every object of ``--scenes`` MiniWorld scenes per source, a reference frame (ground-truth box) is
paired with a frame of the same object (positive) and a frame of its twin (negative), both from other
camera offsets and frame indices; each test frame is scored with the task protocol (detect, segment,
embed, cosine; 0 when not detected). Prints AUC per source and overall, and the AUC of the embedder
alone on ground-truth masks. ``--blur`` adds AUCs on Gaussian-blurred test frames, a proxy for the
softer frames a generator produces. Exit status 1 when the overall AUC is below ``--min-auc``.

    python scripts/light_scorer_auc.py                      # the light scorer, 25 scenes per source
    python scripts/light_scorer_auc.py --world static       # on the static world's scenes
    python scripts/light_scorer_auc.py --blur 0.7 1.0 --json auc.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import cv2
import numpy as np
from omegaconf import OmegaConf

from cmbench.config_paths import CONFIG_DIR
from cmbench.scoring import build_scorer
from cmbench.miniworld.scorer_pairs import build_pairs, descriptor_scores, pipeline_scores, roc_auc

ROOT = Path(__file__).resolve().parent.parent


def evaluate(scorer, pairs) -> dict:
    """AUCs and rates of one set of pairs, overall and per source."""
    scores, detected = pipeline_scores(scorer, pairs)
    gt_scores = descriptor_scores(scorer, pairs)
    same = np.array([p.same for p in pairs])
    source = np.array([p.source for p in pairs])
    out = {}
    for name in [*sorted(set(source)), "all"]:
        sel = np.ones(len(pairs), bool) if name == "all" else source == name
        out[name] = {
            "pairs": int(sel.sum()),
            "auc": roc_auc(scores[sel], same[sel]),
            "auc_embedder_on_ground_truth_masks": roc_auc(gt_scores[sel], same[sel]),
            "detection_rate_same": float(detected[sel & same].mean()),
            "detection_rate_twin": float(detected[sel & ~same].mean()),
            "mean_score_same": float(scores[sel & same].mean()),
            "mean_score_twin": float(scores[sel & ~same].mean()),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(CONFIG_DIR / "scorer" / "light.yaml"), help="scorer config yaml")
    parser.add_argument("--scenes", type=int, default=25, help="scenes per source (8 objects, 16 pairs each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world", choices=("dynamic", "static"), default="dynamic",
                        help="MiniWorld scenes: the default dynamic world or the static one")
    parser.add_argument("--blur", type=float, nargs="*", default=[], help="Gaussian sigmas (px) for extra blurred runs")
    parser.add_argument("--min-auc", type=float, default=0.95, help="exit 1 when the overall AUC is below this")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    scorer = build_scorer(OmegaConf.load(args.config), cache_dir="")  # no feature cache: every pair is fresh
    pairs = build_pairs(args.scenes, seed=args.seed, dynamic=args.world == "dynamic")
    start = time.perf_counter()
    runs = {"clean": evaluate(scorer, pairs)}
    seconds_per_pair = (time.perf_counter() - start) / len(pairs)
    for sigma in args.blur:
        blurred = [dataclasses.replace(p, frame=cv2.GaussianBlur(p.frame, (0, 0), sigma)) for p in pairs]
        runs[f"blur_{sigma:g}"] = evaluate(scorer, blurred)

    print(f"scorer {scorer.name} ({scorer.config_hash}), {args.scenes} {args.world} scenes per source, seed {args.seed}")
    columns = ("frames", "source", "pairs", "AUC", "AUC(GT masks)", "det same", "det twin", "score same", "score twin")
    print("{:<10} {:<10} {:>5} {:>7} {:>14} {:>9} {:>9} {:>11} {:>11}".format(*columns))
    for run, table in runs.items():
        for name, row in table.items():
            print(
                f"{run:<10} {name:<10} {row['pairs']:>5} {row['auc']:>7.4f} "
                f"{row['auc_embedder_on_ground_truth_masks']:>14.4f} {row['detection_rate_same']:>9.2f} "
                f"{row['detection_rate_twin']:>9.2f} {row['mean_score_same']:>11.3f} {row['mean_score_twin']:>11.3f}"
            )
    print(f"{1000 * seconds_per_pair:.2f} ms per pair (detect + 2 segmentations + 2 embeddings)")
    if args.json:
        results = {
            "config": args.config, "scorer": scorer.name, "scorer_config_hash": scorer.config_hash,
            "scenes_per_source": args.scenes, "world": args.world, "seed": args.seed, "seconds_per_pair_clean": seconds_per_pair,
            "runs": runs,
        }
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    overall = runs["clean"]["all"]["auc"]
    if overall < args.min_auc:
        print(f"FAIL: overall AUC {overall:.4f} < {args.min_auc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
