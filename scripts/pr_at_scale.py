"""Pruning ratio (Eq. 4) of every method at LingBot World v2's scale, on a CPU, beside the paper's Table 1.

    python scripts/pr_at_scale.py                      # all methods (about 4 minutes on one thread)
    python scripts/update_readme_results.py results/pr_at_scale.md --marker pr_at_scale

Runs the real cache runtime and every registered method over a one-minute context (241 latent frames
padded to 244) and a 16-frame continuation of 30 x 52-token frames, with a stand-in backbone instead
of the model (cmbench/benchmarks/pr_at_scale.py says what it stands in for and why the PR does not
depend on it where the method's rule fixes the count). Writes the CSV and a markdown table; prints
whether each of the four targets (Streaming, DummyForcing, ForcingKV, TempDiff) is within one point.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from cmbench.benchmarks.pr_at_scale import Scale, markdown, pr_table, write_csv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/pr_at_scale.csv"), help="CSV to write")
    parser.add_argument("--markdown", type=Path, default=Path("results/pr_at_scale.md"), help="table to write")
    parser.add_argument("--methods", default=None, help="comma-separated labels (default: every method)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    scale = Scale()
    methods = args.methods.split(",") if args.methods else None
    rows = pr_table(scale, methods, args.seed, progress=lambda line: print(line, flush=True))
    write_csv(rows, args.out)
    table = markdown(rows, scale)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(table + "\n")
    print(f"\n{table}\n\nwrote {args.out} and {args.markdown}")
    for row in rows:
        if row.target:
            verdict = "within 1 point" if row.within else "OUTSIDE 1 point"
            print(f"target {row.method}: {row.pr:.2f}% vs the paper's {row.paper_pr:.2f}% ({row.difference:+.2f}): "
                  f"{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
