#!/usr/bin/env bash
# The families-of-KV-compression comparison at matched device bytes (results/miniworld/families_bytes.*):
# every family and composition of results/miniworld/families_bytes.md, on the 8 tasks of miniworld_diagnostic8,
# at the given seeds, then the leaderboard over every run in runs/families (seeds merged per entry) and the
# figure. Knobs come from the bytes targets' calibrations in runs/families/calibration (made by the first seed's
# runs, reused by the others); DeCoPrune + KIVI-4 runs at its probes' values (its searches did not converge).
#
# Usage: bash scripts/families_bytes.sh [SEED ...]        (default: 2 3 4, the paper's seeds)
# Environment: PYTHON (default .venv/bin/python), OUT (default runs/families), BOARD_ONLY=1 (only the board
# and the figure, from the runs already there).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
out="${OUT:-runs/families}"
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(2 3 4)
if [ "${BOARD_ONLY:-0}" != 1 ]; then
  for seed in "${seeds[@]}"; do
    run() { echo "=== seed $seed: $*"; nice -n 10 "$py" -m cmbench run "out_dir=$out" subset=miniworld_diagnostic8 \
      "seed=$seed" calibration.tasks=2 "$@"; }
    run method=fullkv
    run method=fullkv storage=kivi storage.bits=2
    run method=fullkv storage=kivi storage.bits=4
    for bytes in 0.15 0.08; do
      run method=decoprune "method.target_bytes=$bytes"
      run method=streaming "method.target_bytes=$bytes"
      run method=tempcache "method.target_bytes=$bytes"
    done
    run method=streaming storage=kivi storage.bits=2 method.target_bytes=0.08
    run method=worldkv storage=kivi storage.bits=4 method.target_bytes=0.08
    run method=decoprune storage=kivi storage.bits=4 method.gamma=0.0020631355000659823 label=decoprune@bytes8+kivi4-g32-r128
    run method=decoprune storage=kivi storage.bits=4 method.gamma=0.0004040436906507238 label=decoprune@bytes15+kivi4-g32-r128
  done
fi
"$py" -m cmbench leaderboard "out_dir=$out" \
  "leaderboard.focus=[fullkv,decoprune@bytes15,decoprune@bytes8]" \
  "leaderboard.compare=[[decoprune@bytes8+kivi4-g32-r128,streaming@bytes8+kivi2-g32-r128],[decoprune@bytes15+kivi4-g32-r128,fullkv+kivi4-g32-r128]]" \
  "leaderboard.out=$out/board"
cp "$out/board/leaderboard.csv" results/miniworld/families_bytes.csv
cp "$out/board/comparisons.csv" results/miniworld/families_bytes_comparisons.csv
"$py" scripts/families_figure.py results/miniworld/families_bytes.csv results/miniworld/families_bytes.png
