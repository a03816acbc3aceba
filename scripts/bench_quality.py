"""Scoring time per frame with and without the quality metrics, in one run on the same tasks.

The default MiniWorld scorer (``configs/scorer/light.yaml``) is built twice from the same config: with
its quality preset (``miniworld``: temporal flickering and the two ``*_light`` consistencies) and with
``quality: none``. Each task of the subset is scored by both, one right after the other in every round
(the order alternating), on the task's true continuation (MiniWorld's ground truth, 16 frames of 32x32)
and its lossless references, with no feature cache, so every round computes everything. Time is the
process's CPU time (robust to other jobs on a shared machine); each variant's per-task time is the
best of ``--rounds``, summed over tasks. The target: the quality metrics add at most 20% to a default
run's scoring time.

    python scripts/bench_quality.py --threads 1 --csv results/bench_quality.csv
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from cmbench.config_paths import to_dict
from cmbench.data import load_manifest
from cmbench.data.adapter import build_adapter
from cmbench.data.subsets import load_subset
from cmbench.miniworld.readers import load_ground_truth
from cmbench.scoring.registry import build_scorer
from cmbench.shipped import shipped_dir

TARGET = 1.20  # with / without


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subset", default="miniworld_quick16", help="the tasks (a named subset)")
    parser.add_argument("--data-root", default="data/miniworld", help="the MiniWorld suite (built if missing)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = OmegaConf.load(shipped_dir("configs") / "data" / "miniworld.yaml")
    data.root = args.data_root
    adapter = build_adapter(data)
    adapter.ensure()
    wanted = set(load_subset(args.subset).task_ids)
    tasks = [t for t in load_manifest(Path(str(data.root)), str(data.manifest)) if t.task_id in wanted]
    cfg = to_dict(OmegaConf.load(shipped_dir("configs") / "scorer" / "light.yaml"))
    scorers = {"with_quality": build_scorer({**cfg, "cache_dir": None}),
               "without_quality": build_scorer({**cfg, "cache_dir": None, "quality": "none"})}
    quality = scorers["with_quality"].quality
    assert quality is not None and not quality.unavailable
    inputs = [(t, load_ground_truth(t)["frames"], adapter.references(t)) for t in tasks]
    best = {name: np.full(len(inputs), np.inf) for name in scorers}
    quality_alone = np.full(len(inputs), np.inf)
    for round_ in range(args.rounds):
        order = list(scorers) if round_ % 2 == 0 else list(scorers)[::-1]
        for i, (task, frames, refs) in enumerate(inputs):
            for name in order:
                start = time.process_time()
                scorers[name].score_task(task, frames, refs)
                best[name][i] = min(best[name][i], time.process_time() - start)
            start = time.process_time()
            quality.score(iter([frames]))
            quality_alone[i] = min(quality_alone[i], time.process_time() - start)
    n_frames = sum(len(f) for _, f, _ in inputs)
    with_ms, without_ms = (1000 * best[n].sum() / n_frames for n in ("with_quality", "without_quality"))
    ratio = with_ms / without_ms
    rows = [
        {"variant": "light scorer, quality: none", "tasks": len(inputs), "frames": n_frames,
         "cpu_ms_per_frame": round(without_ms, 4), "ratio_to_without": 1.0},
        {"variant": f"light scorer, quality: miniworld ({', '.join(quality.names)})", "tasks": len(inputs),
         "frames": n_frames, "cpu_ms_per_frame": round(with_ms, 4), "ratio_to_without": round(ratio, 4)},
        {"variant": "quality metrics alone", "tasks": len(inputs), "frames": n_frames,
         "cpu_ms_per_frame": round(1000 * quality_alone.sum() / n_frames, 4),
         "ratio_to_without": round(1000 * quality_alone.sum() / n_frames / without_ms, 4)},
    ]
    for row in rows:
        print(f"{row['variant']:<110} {row['cpu_ms_per_frame']:8.3f} ms/frame  x{row['ratio_to_without']:.3f}")
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"scoring time with / without the quality metrics: {ratio:.3f} (target <= {TARGET:.2f}: {verdict}); "
          f"{len(inputs)} tasks, {n_frames} frames, best of {args.rounds} rounds, CPU time, {args.threads} thread(s)")
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.csv.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        tmp.replace(args.csv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
