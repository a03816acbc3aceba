"""Print the memory table of docs/real_backbones.md: LingBot World v2 14B / 1.3B x FullKV / DeCoPrune (its
own rule, and quota mode at 85% PR) over a one-minute context, against one H200, 4xH200 and an 80 GB GPU
(no GPU and no weights needed). Each row holds what its ``python -m cmbench plan`` command prints
(tests/test_memory_table.py runs them and compares).

    python scripts/memory_table.py            # the markdown table
    python scripts/memory_table.py --details  # and every plan, phase by phase
"""

from __future__ import annotations

import argparse

from cmbench.backbones.memory.targets import documented_shapes, fit_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--details", action="store_true", help="also print each plan phase by phase")
    args = parser.parse_args()
    shapes = documented_shapes()
    print(fit_table(shapes))
    if args.details:
        from cmbench.backbones.memory.plan import build_plan

        for shape in shapes:
            print()
            print(build_plan(shape).describe())


if __name__ == "__main__":
    main()
