#!/usr/bin/env bash
# The retrieval comparison (results/miniworld/retrieval_comparison*.csv, their verdict CSVs, the README's retrieval
# block): every point of the committed comparison run again on the 16 tasks of miniworld_quick16 (seed 2, light
# scorer) at the knob value its calibration found (the CSVs' knob_value: calibrated to each target device PR on the
# calibration world by `python -m cmbench curves`, see scripts/retrieval_comparison.py), and FullKV; then both tables
# with their claims decided by the verdict rule, the records behind them (results/miniworld/retrieval_runs) and the
# README's block.
#
# Usage: bash scripts/retrieval_comparison.sh
# Environment: PYTHON (default .venv/bin/python), OUT (default runs/retrieval), BOARD=0 (runs only), BOARD_ONLY=1
# (only the tables and what follows them, from the runs already there: BOARD_ONLY=1 OUT=results/miniworld/retrieval_runs
# recomputes the committed tables), EXTRA='OVERRIDE ...' (added to every run, e.g. 'shard.count=2 shard.index=0').
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
out="${OUT:-runs/retrieval}"
read -ra extra <<< "${EXTRA:-}"
tables=(results/miniworld/retrieval_comparison.csv results/miniworld/retrieval_comparison_worldkv_rules.csv)
points="$out/points.csv"  # method, target_pr, knob, knob_value, run_dir: what scripts/retrieval_comparison.py reads

common=("out_dir=$out" subset=miniworld_quick16 seed=2 progress=false)
# shellcheck source=scripts/board_runs.sh
source scripts/board_runs.sh  # run OVERRIDE...: one run; prints its run folder

if [ "${BOARD_ONLY:-0}" != 1 ]; then
  mkdir -p "$out"
  fullkv=$(run method=fullkv)
  echo "method,target_pr,knob,knob_value,run_dir,note" > "$points.tmp"
  # every (method, target) point of both committed tables once, with the knob value it ran at
  while IFS=, read -r method target knob value; do
    folder=$(run "method=$method" "method.$knob=$value" "label=$method@$target")
    echo "$method,$target,$knob,$value,$folder," >> "$points.tmp"
  done < <("$py" -c 'import sys, pandas as pd
rows = pd.concat([pd.read_csv(p) for p in sys.argv[1:]]).drop_duplicates(["method", "target_pr"])
for r in rows[rows["method"] != "fullkv"].itertuples():
    value = int(r.knob_value) if float(r.knob_value).is_integer() and r.knob != "gamma" else repr(float(r.knob_value))
    print(f"{r.method},{r.target_pr:g},{r.knob},{value}")' "${tables[@]}")
  echo "fullkv,0,,,$fullkv," >> "$points.tmp"
  mv "$points.tmp" "$points"
fi
[ "${BOARD:-1}" != 0 ] || exit 0
if [ "$out" != results/miniworld/retrieval_runs ]; then  # the records behind the tables, and where each point's are
  "$py" scripts/paper_findings.py --copy-evidence "$out/miniworld" results/miniworld/retrieval_runs/miniworld
  sed "s#,$out/miniworld/#,results/miniworld/retrieval_runs/miniworld/#" "$points" > results/miniworld/retrieval_runs/points.csv
  points=results/miniworld/retrieval_runs/points.csv
fi
fullkv=$(awk -F, '$1 == "fullkv" {print $5}' "$points")
"$py" scripts/retrieval_comparison.py "$points" "$fullkv" \
  --methods worldkv_fixed_window,key_retrieval,decoprune,random,streaming \
  --out results/miniworld/retrieval_comparison.csv --verdicts results/miniworld/retrieval_comparison_verdicts.csv
"$py" scripts/retrieval_comparison.py "$points" "$fullkv" --methods worldkv,worldkv_fixed_window \
  --out results/miniworld/retrieval_comparison_worldkv_rules.csv \
  --verdicts results/miniworld/retrieval_comparison_worldkv_rules_verdicts.csv
"$py" scripts/update_readme_results.py
