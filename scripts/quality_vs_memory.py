"""Quality beside memory from finished run directories: the files ``python -m cmbench curves`` writes
(``curves.csv`` with the quality columns, ``curves_reference.csv``, ``quality_vs_memory.png`` and
``quality_vs_memory.csv``), for runs made without its knob calibration (e.g. DeCoPrune and Random in
budget mode, ``method.target_pr=...``, and Streaming at fixed windows), when calibrating every point
costs more than the machine has.

Each run is one curve point (its leaderboard row, :func:`cmbench.report.curves.board_point`), the curve
named by the run's method; the FullKV run is the reference everything is normalised to.

    python scripts/quality_vs_memory.py --reference runs/quick16/miniworld/fullkv__* \\
        --runs runs/quick16/miniworld/decoprune__* runs/quick16/miniworld/random__* \\
        runs/quick16/miniworld/streaming__* --out results/quality_vs_memory_quick16 \\
        --title "MiniWorld, 16-task subset miniworld_quick16"
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cmbench.cli.curves import write_quality_vs_memory
from cmbench.report.curves import CURVES_FILE, board_point, curve_table
from cmbench.report.leaderboard import REFERENCE_METHOD, leaderboard, load_runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True, type=Path, help="the FullKV run directory")
    parser.add_argument("--runs", required=True, nargs="+", type=Path, help="run directories, one curve point each")
    parser.add_argument("--out", required=True, type=Path, help="folder for the four files")
    parser.add_argument("--title", default=None, help="the figure's title (say which tasks)")
    args = parser.parse_args()
    rows = []
    for run_dir in args.runs:
        (run,) = load_runs([run_dir])
        (row,) = leaderboard([run]).to_dict("records")
        frame = run.frame
        target = frame["target_pr"].dropna()
        rows.append({"method": str(frame["method"].dropna().iloc[0]), "target_pr": target.iloc[0] if len(target) else None,
                     **board_point(row), "label": run.label, "run_dir": str(run_dir),
                     "note": "fixed knob or budget mode (no calibration)"})
    (reference,) = leaderboard(load_runs([args.reference])).to_dict("records")
    curves = curve_table(rows).sort_values(["method", "test_pr"], kind="stable")
    args.out.mkdir(parents=True, exist_ok=True)
    curves.to_csv(args.out / CURVES_FILE, index=False, float_format="%.6g")
    print(curves.drop(columns=["run_dir", "note"]).to_string(index=False, float_format="%.4f"))
    written = write_quality_vs_memory(
        curves, {"method": REFERENCE_METHOD, **board_point(reference), "label": REFERENCE_METHOD,
                 "run_dir": str(args.reference)}, str(reference["metric"]), args.out, args.title)
    print(f"wrote {', '.join([CURVES_FILE, *written])} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
