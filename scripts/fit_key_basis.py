"""Fit the key basis of the ``lowrank`` storage format on calibration contexts (never the test suite) and write
it beside the backbone's weights (cmbench/calibration/key_basis.py, docs/kv_formats.md).

Usage (anything after the script's own options is a Hydra override of configs/config.yaml)::

    python scripts/fit_key_basis.py --tasks 8 backbone=tiny data=miniworld

The calibration tasks are those a knob calibration reads (MiniWorld's held-out world; for another dataset
``calibration.root=<folder of calibration contexts>``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from cmbench.api import compose_config
from cmbench.calibration.key_basis import fit_key_basis
from cmbench.errors import CMBenchError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8, help="calibration tasks (their distinct contexts are read; default 8)")
    parser.add_argument("--out", type=Path, help="where to write the basis (default: beside the backbone's weights)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args, overrides = parser.parse_known_args(argv)
    torch.set_num_threads(args.threads)
    try:
        path = fit_key_basis(compose_config("fullkv", overrides), args.tasks, args.out)
    except CMBenchError as err:
        print(f"fit_key_basis: {err}", file=sys.stderr)
        return 2
    print(f"key basis written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
