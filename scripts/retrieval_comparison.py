"""Retrieval methods against eviction methods at a matched device budget, by task type, with the store beside.

    python -m cmbench curves "methods=[worldkv,worldkv_fixed_window,key_retrieval,decoprune,random,streaming]" \
        "target_prs=[0.85]" limit=4 calibration.tasks=2 out_dir=runs_cmp
    python scripts/retrieval_comparison.py runs_cmp/miniworld/leaderboard/curves.csv \
        runs_cmp/miniworld/<fullkv run> --out results/miniworld/retrieval_comparison.csv \
        --verdicts results/miniworld/retrieval_comparison_verdicts.csv

``scripts/retrieval_comparison.sh`` runs every point of the committed comparison again at the knob value its
calibration found, writes the points (the curves' columns: method, target_pr, knob, knob_value, run_dir) and both
tables with their verdicts (``--methods`` picks each table's methods), and commits the records behind them.

For each point of the curves (one method at one target device PR, its knob calibrated on the
calibration world) and for FullKV: the realised device PR, the mean score over all tasks and per task
type (Reappear, Revisit), the peak device KV, the peak host-store bytes and the bytes moved host <->
device per generated chunk (retrieval methods only: ``worldkv``, WorldKV's fixed device budget, beside
``worldkv_fixed_window``, CMBench's earlier fixed-window reading, and ``key_retrieval``), read from the
runs' records. Writes the CSV and
prints it as a markdown table, with the number of tasks: a small subset is a small subset.

With ``--verdicts``, the claims the comparison states are decided as one family by CMBench's verdict rule
(docs/verdicts.md) and written there: at each target, each retrieval method level with FullKV (an equivalence
claim) and ahead of DeCoPrune at the same target (a lead claim), paired by task and seed on the tasks both ran.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from cmbench.errors import CMBenchError
from cmbench.report import read_records, verdicts
from cmbench.report.board_claims import retrieval_verdicts

MB = 1e6
COLUMNS = ["method", "target_pr", "knob", "knob_value", "device_pr", "score", "score_reappear", "score_revisit",
           "n_tasks", "n_reappear", "n_revisit", "peak_kv_mb", "peak_store_mb", "moved_per_chunk_mb"]


def summarise(run_dir: str | Path) -> dict:
    """Mean score (all, per task type), device PR and memory columns of one run's successful records."""
    frame = read_records(run_dir).frame
    ok = frame[frame["status"] == "ok"]
    by_type = ok.groupby("task_type")["score"].agg(["mean", "size"])

    def of_type(kind: str, column: str) -> float:
        return float(by_type.loc[kind, column]) if kind in by_type.index else float("nan")

    def mean(name: str, scale: float = 1.0) -> float:
        return float(ok[name].mean()) / scale if name in ok and ok[name].notna().any() else float("nan")

    return {"device_pr": mean("pr"), "score": mean("score"), "score_reappear": of_type("reappear", "mean"),
            "score_revisit": of_type("revisit", "mean"), "n_tasks": len(ok), "n_reappear": of_type("reappear", "size"),
            "n_revisit": of_type("revisit", "size"),
            "peak_kv_mb": mean("peak_kv_bytes", MB), "peak_store_mb": mean("peak_store_bytes", MB),
            "moved_per_chunk_mb": mean("moved_bytes_per_chunk", MB)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("curves", help="curves.csv written by `python -m cmbench curves`")
    parser.add_argument("fullkv", help="the FullKV run folder of the same tasks")
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--verdicts", default=None, help="where to write the verdict CSV of its claims")
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods of the curves to compare (default: every method there)")
    args = parser.parse_args(argv)
    try:
        curves = pd.read_csv(args.curves)
        if args.methods:
            curves = curves[curves["method"].isin(args.methods.split(","))]
        rows = [{"method": "fullkv", "target_pr": 0.0, "knob": "", "knob_value": float("nan"),
                 **summarise(args.fullkv)}]
        ran = []
        for point in curves.itertuples():
            if not isinstance(point.run_dir, str):
                print(f"{point.method} @ {point.target_pr}: no run ({point.note})", file=sys.stderr)
                continue
            rows.append({"method": point.method, "target_pr": point.target_pr, "knob": point.knob,
                         "knob_value": point.knob_value, **summarise(point.run_dir)})
            ran.append((str(point.method), float(point.target_pr), point.run_dir))
        decided = retrieval_verdicts(ran, args.fullkv) if args.verdicts else []
    except (CMBenchError, OSError, KeyError) as err:
        print(f"retrieval_comparison: error: {err}", file=sys.stderr)
        return 1
    table = pd.DataFrame(rows, columns=COLUMNS)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g")
    if args.verdicts:
        verdicts.write(decided, Path(args.verdicts))
        print(f"{args.verdicts}: {len(decided)} claims, {verdicts.correction_text(decided)}")
        for d in decided:
            print(f"- {d.claim.a}: {verdicts.said(d.row(), d.claim.b)} ({d.claim.estimate:+.3f}, interval "
                  f"[{d.low:+.3f}, {d.high:+.3f}], {d.claim.n_pairs} pairs)")
    first = table.iloc[0]
    print(f"{len(table)} rows; {first.n_tasks} tasks per run ({first.n_reappear:g} Reappear, {first.n_revisit:g} Revisit): "
          f"a small subset, differences of a few hundredths are noise")
    print("| method | target PR | knob | device PR | score | Reappear | Revisit | peak KV (MB) | store (MB) | "
          "moved/chunk (MB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    def cell(value: float, form: str) -> str:
        return "—" if pd.isna(value) else form.format(value)

    for r in table.itertuples():
        knob = f"{r.knob}={r.knob_value:g}" if r.knob else "—"
        print(f"| {r.method} | {r.target_pr:.2f} | {knob} | {r.device_pr:.3f} | {r.score:.4f} | {r.score_reappear:.4f} | "
              f"{r.score_revisit:.4f} | {r.peak_kv_mb:.2f} | {cell(r.peak_store_mb, '{:.2f}')} | "
              f"{cell(r.moved_per_chunk_mb, '{:.3f}')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
