"""Quality beside memory from finished run directories: the files ``python -m cmbench curves`` writes
(``curves.csv`` with the quality columns, ``curves_reference.csv``, ``quality_vs_memory.png`` and
``quality_vs_memory.csv``), for runs made without its knob calibration (e.g. DeCoPrune and Random in
budget mode, ``method.target_pr=...``, and Streaming at fixed windows), when calibrating every point
costs more than the machine has.

Each run is one curve point (its leaderboard row, :func:`cmbench.report.curves.board_point`), the curve
named by the run's method; the FullKV run is the reference everything is normalised to. Every run is
read on the same tasks: those every run (the reference included) finished, so the points are paired
(runs still going, or stopped early, contribute their common tasks; the script says how many).

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
from cmbench.report.leaderboard import REFERENCE_METHOD, leaderboard, read_records
from cmbench.runs.records import latest_records, read_task_records


def finished_tasks(run_dir: Path) -> set[str]:
    """The tasks whose latest record in ``run_dir`` succeeded."""
    return {t for t, r in latest_records(read_task_records(run_dir)).items() if r.status == "ok"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True, type=Path, help="the FullKV run directory")
    parser.add_argument("--runs", required=True, nargs="+", type=Path, help="run directories, one curve point each")
    parser.add_argument("--out", required=True, type=Path, help="folder for the four files")
    parser.add_argument("--title", default=None, help="the figure's title (say which tasks; {n}: their count)")
    args = parser.parse_args()
    common = set.intersection(*(finished_tasks(d) for d in [args.reference, *args.runs]))
    if not common:
        parser.error("the runs have no finished task in common")
    print(f"{len(common)} task(s) finished by every run: {', '.join(sorted(common))}")
    rows = []
    for run_dir in args.runs:
        run = read_records(run_dir, task_ids=common)
        (row,) = leaderboard([run]).to_dict("records")
        frame = run.frame
        target = frame["target_pr"].dropna()
        rows.append({"method": str(frame["method"].dropna().iloc[0]), "target_pr": target.iloc[0] if len(target) else None,
                     **board_point(row), "label": run.label, "run_dir": str(run_dir),
                     "note": "fixed knob or budget mode (no calibration)"})
    (reference,) = leaderboard([read_records(args.reference, task_ids=common)]).to_dict("records")
    curves = curve_table(rows).sort_values(["method", "test_pr"], kind="stable")
    args.out.mkdir(parents=True, exist_ok=True)
    curves.to_csv(args.out / CURVES_FILE, index=False, float_format="%.6g")
    print(curves.drop(columns=["run_dir", "note"]).to_string(index=False, float_format="%.4f"))
    written = write_quality_vs_memory(
        curves, {"method": REFERENCE_METHOD, **board_point(reference), "label": REFERENCE_METHOD,
                 "run_dir": str(args.reference)}, str(reference["metric"]), args.out,
        args.title.format(n=len(common)) if args.title else None)
    print(f"wrote {', '.join([CURVES_FILE, *written])} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
