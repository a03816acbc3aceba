#!/usr/bin/env bash
# The kvpress presses at a matched 85% PR (results/miniworld/kvpress_*.csv, the README's kvpress block): every press
# that runs on the installed kvpress, beside DeCoPrune and Random at DeCoPrune's per-chunk counts (their gammas
# calibrated to PR 0.85 on this subset: results/miniworld/curves.csv) and FullKV, on the 16 tasks of
# miniworld_quick16 at the given seeds, light scorer. Then the leaderboard over every run in runs/kvpress (seeds
# merged per entry), compared with DeCoPrune and Random, its verdicts (scripts/board_verdicts.py), the records
# behind it (results/miniworld/kvpress_runs, so that the board recomputes from the repository) and the README's
# paragraph (scripts/update_readme_results.py).
#
# A press keeps the same count per chunk whatever it scores, so compression_ratio is calibrated once (KnormPress,
# first seed, 2 calibration tasks) and every press runs the value found.
#
# Usage: bash scripts/kvpress_board.sh [SEED ...]      (default: 2 3 4)
# Environment: PYTHON (default .venv/bin/python), OUT (default runs/kvpress), BOARD=0 (runs only), BOARD_ONLY=1
# (only the board and what follows it, from the runs already there: BOARD_ONLY=1 OUT=results/miniworld/kvpress_runs
# recomputes the committed board), EXTRA='OVERRIDE ...' (added to every run: EXTRA='shard.count=2 shard.index=0'
# runs every other context, the other half later or in a second lane into the same run folders).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
out="${OUT:-runs/kvpress}"
seeds=("$@")
read -ra extra <<< "${EXTRA:-}"
[ ${#seeds[@]} -gt 0 ] || seeds=(2 3 4)
DECOPRUNE_GAMMA=0.0449095  # results/miniworld/curves.csv: decoprune and random calibrated to PR 0.85
RANDOM_GAMMA=0.0414887

common=("out_dir=$out" subset=miniworld_quick16 progress=false)
# shellcheck source=scripts/board_runs.sh
source scripts/board_runs.sh  # run OVERRIDE...: one run; prints its run folder

if [ "${BOARD_ONLY:-0}" != 1 ]; then
  presses=$("$py" -c 'from cmbench.methods.kvpress_adapter import runnable_presses; print(" ".join(runnable_presses()[1]))')
  folder=$(run "seed=${seeds[0]}" method=kvpress method.press=KnormPress method.target_pr=0.85 calibration.tasks=2 \
    label=kvpress_KnormPress@pr85)
  ratio=$("$py" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["method"]["compression_ratio"])' \
    "$folder/config.yaml")
  echo "compression_ratio=$ratio (KnormPress calibrated to PR 0.85); presses: $presses" >&2
  for seed in "${seeds[@]}"; do
    run "seed=$seed" method=fullkv > /dev/null
    run "seed=$seed" method=decoprune "method.gamma=$DECOPRUNE_GAMMA" label=decoprune@pr85 > /dev/null
    run "seed=$seed" method=random "method.gamma=$RANDOM_GAMMA" label=random@pr85 > /dev/null
    for press in $presses; do
      run "seed=$seed" method=kvpress "method.press=$press" "method.compression_ratio=$ratio" "label=kvpress_$press@pr85" \
        > /dev/null
    done
  done
fi
[ "${BOARD:-1}" != 0 ] || exit 0
"$py" -m cmbench leaderboard "out_dir=$out" "leaderboard.focus=[decoprune@pr85,random@pr85]" "leaderboard.out=$out/board"
cp "$out/board/leaderboard.csv" results/miniworld/kvpress_leaderboard.csv
cp "$out/board/comparisons.csv" results/miniworld/kvpress_comparisons.csv
"$py" scripts/board_verdicts.py kvpress results/miniworld/kvpress_leaderboard.csv \
  results/miniworld/kvpress_comparisons.csv results/miniworld/kvpress_verdicts.csv
[ "$out" = results/miniworld/kvpress_runs ] \
  || "$py" scripts/paper_findings.py --copy-evidence "$out/miniworld" results/miniworld/kvpress_runs/miniworld
"$py" scripts/update_readme_results.py
