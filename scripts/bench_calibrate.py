"""Wall time and probes of ``python -m cmbench calibrate`` now against an earlier revision, in one run.

Both calibrations run one after the other on this machine, each in a fresh process with the same
arguments, the same calibration data (built once, before the clock starts) and its own ``out_dir``
(so nothing is reused): the earlier revision from a ``git archive`` of it in a temporary folder, the
current one from this checkout. Each line of the table: the revision, the wall time, the probes
measured, the found knob value and its calibration PR against the target and tolerance.

    python scripts/bench_calibrate.py --before <commit> [--method decoprune] [--target 0.85] [--tasks 1]

Writes ``results/bench_calibrate.csv`` (``--out``) and prints the table and the speed-up.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ["revision", "method", "target_pr", "tasks", "tolerance", "seconds", "probes", "knob", "value",
           "calibration_pr", "within_tolerance"]


def export(revision: str, folder: Path) -> Path:
    """The tree of ``revision`` unpacked into ``folder`` (a plain copy: no checkout, no branch switch)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def calibrate(tree: Path, out_dir: Path, args: argparse.Namespace) -> dict[str, object]:
    """Run ``calibrate`` from ``tree`` and read what it wrote; the wall time of the whole command."""
    command = [sys.executable, "-m", "cmbench", "calibrate", f"method={args.method}", f"target_pr={args.target}",
               f"calibration.tasks={args.tasks}", f"calibration.tolerance={args.tolerance}", f"data.root={args.data}",
               f"out_dir={out_dir}", "threads=1"]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    began = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"calibrate failed in {tree}:\n{done.stdout}\n{done.stderr}")
    (log_path,) = (out_dir / "calibration").glob(f"{args.method}_pr*.json")
    log = json.loads(log_path.read_text())
    return {"method": args.method, "target_pr": args.target, "tasks": args.tasks, "tolerance": args.tolerance,
            "seconds": round(seconds, 1), "probes": len(log["probes"]), "knob": log["knob"], "value": log["value"],
            "calibration_pr": round(log["calibration_pr"], 4), "within_tolerance": log["within_tolerance"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the earlier revision (a commit)")
    parser.add_argument("--method", default="decoprune")
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--tasks", type=int, default=1, help="calibration tasks (calibration.tasks)")
    parser.add_argument("--tolerance", type=float, default=0.005)
    parser.add_argument("--data", default=str(REPO / "data" / "miniworld"), help="MiniWorld's root (data.root)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_calibrate.csv"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_calibrate_") as tmp:
        work = Path(tmp)
        before = export(args.before, work / "before")
        for extra in ([f"data.root={args.data}"],  # the suite and its calibration world, outside the clock
                      [f"data.root={args.data}_calibration", "data.world_seed=1", "data.check_counts=false"]):
            subprocess.run([sys.executable, "-m", "cmbench", "prepare", "data=miniworld", *extra], cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True)
        rows = []
        for name, tree in ((args.before[:10], before), ("current", REPO)):
            row = {"revision": name, **calibrate(tree, work / name, args)}
            print(", ".join(f"{k}={row[k]}" for k in COLUMNS), flush=True)
            rows.append(row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(f".{out.name}.tmp")
    with tmp_out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp_out, out)
    print(f"calibrate: {rows[0]['seconds']} s, {rows[0]['probes']} probes before; {rows[1]['seconds']} s, "
          f"{rows[1]['probes']} probes now ({float(rows[0]['seconds']) / float(rows[1]['seconds']):.1f}x); wrote {out}")


if __name__ == "__main__":
    main()
