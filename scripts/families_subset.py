"""Write the task subset of the families comparison: one task from each of N contexts of the MiniWorld suite.

Paired comparisons cluster by context (two tasks of one context share its prefill and its scene), so an
equivalence margin is decided by the number of contexts, not of tasks or seeds: one task per context over many
contexts buys more than several seeds over a few (results/miniworld/families_bytes.md). The contexts are a
seeded sample stratified by source (synthetic, real: each its proportional share, largest remainders first, as
``limit=N`` stratifies tasks); each chosen context contributes one of its tasks, drawn with the same seed.

    python scripts/families_subset.py 32 --seed 2 > data_manifests/subsets/miniworld_contexts32.txt
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import numpy as np

from cmbench.data import load_manifest
from cmbench.errors import CMBenchError


def one_task_per_context(tasks, contexts: int, seed: int) -> list[str]:
    """Task ids: ``contexts`` contexts stratified by source, one task of each, in manifest order.

    Raises
    ------
    ValueError
        More contexts asked for than the suite has.
    """
    by_context: dict[str, list] = defaultdict(list)
    for task in tasks:
        by_context[task.context_id].append(task)
    if not 0 < contexts <= len(by_context):
        raise ValueError(f"{contexts} contexts asked for: the suite has {len(by_context)}")
    strata: dict[str, list[str]] = defaultdict(list)
    for context, held in by_context.items():
        strata[held[0].source].append(context)
    keys = sorted(strata)
    quotas = {k: contexts * len(strata[k]) / len(by_context) for k in keys}
    counts = {k: int(quotas[k]) for k in keys}
    for k in sorted(keys, key=lambda k: (-(quotas[k] - counts[k]), k))[: contexts - sum(counts.values())]:
        counts[k] += 1
    rng = np.random.default_rng(seed)
    chosen = [c for k in keys for c in rng.choice(sorted(strata[k]), size=counts[k], replace=False).tolist()]
    picked = {by_context[c][int(rng.integers(len(by_context[c])))].task_id for c in sorted(chosen)}
    return [t.task_id for t in tasks if t.task_id in picked]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contexts", type=int, help="contexts (one task of each)")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--root", default="data/miniworld", help="the suite (python -m cmbench prepare data=miniworld)")
    args = parser.parse_args(argv)
    try:
        tasks = load_manifest(args.root, "metadata.jsonl")
        ids = one_task_per_context(tasks, args.contexts, args.seed)
    except (OSError, ValueError, CMBenchError) as err:
        print(f"families_subset: {err}", file=sys.stderr)
        return 2
    print("# dataset: miniworld\n# data.world_seed: 0\n# data.dynamic: true")
    print(f"# The families comparison's tasks: one task from each of {args.contexts} contexts, stratified by source "
          f"(`python scripts/families_subset.py {args.contexts} --seed {args.seed}`).")
    print("\n".join(ids))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
