#!/usr/bin/env bash
# The families-of-KV-compression comparison at matched device bytes (results/miniworld/families_bytes.*):
# every family and composition of results/miniworld/families_bytes.md, on the 32 tasks of miniworld_contexts32
# (one task of each of 32 contexts: scripts/families_subset.py), with the KV cache in bfloat16 (`cache.dtype`,
# what every Wan-family backbone's cache holds: bytes relative to FullKV in bfloat16), at the given seeds, then
# the leaderboard over every run in runs/families (seeds merged per entry), the figure and the README's
# paragraph (scripts/update_readme_results.py). WorldKV at 0.25 runs twice: its store in host memory (the
# board's host-store and moved-bytes columns) and on the device (`method.bank_on_device`, as its authors'
# script runs it; the same rows attend, its store's bytes counted as device bytes).
#
# A bytes target is calibrated once, at the first seed (`method.target_bytes`, on 2 calibration tasks); the other
# seeds run the knob value it found, under the same label, so that every seed runs one setup and the leaderboard
# merges them (a calibration at each seed finds a slightly different value: three setups of one seed each).
#
# Usage: bash scripts/families_bytes.sh [SEED ...]        (default: 2; the first seed calibrates)
# Environment: PYTHON (default .venv/bin/python), OUT (default runs/families), BOARD_ONLY=1 (only the board, the
# figure and the README paragraph, from the runs already there), ONLY=PATTERN (run only the entries whose label
# matches this shell pattern, e.g. ONLY='*kivi*'), BOARD=0 (runs only: lanes run side by side, the board after them),
# EXTRA='OVERRIDE ...' (added to every run: EXTRA='shard.count=2 shard.index=0' runs every other context of the
# subset, dealt round-robin, the other half later into the same run folders).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
out="${OUT:-runs/families}"
seeds=("$@")
read -ra extra <<< "${EXTRA:-}"
[ ${#seeds[@]} -gt 0 ] || seeds=(2)

common=("out_dir=$out" subset=miniworld_contexts32 cache.dtype=bfloat16 calibration.tasks=2 progress=false)
# shellcheck source=scripts/board_runs.sh
source scripts/board_runs.sh  # run OVERRIDE...: one run; prints its run folder

every_seed() {  # every_seed OVERRIDE...: a setup without a bytes target, at every seed
  for seed in "${seeds[@]}"; do run "seed=$seed" "$@" > /dev/null; done
}

calibrated() {  # calibrated KNOB LABEL TARGET OVERRIDE...: calibrated at the first seed, its value at the others;
  local knob=$1 label=$2 target=$3; shift 3  # prints the value
  local folder value
  folder=$(run "seed=${seeds[0]}" "$@" "method.target_bytes=$target") || return 1
  value=$("$py" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["method"][sys.argv[2]])' \
    "$folder/config.yaml" "$knob")
  for seed in "${seeds[@]:1}"; do run "seed=$seed" "$@" "method.$knob=$value" "label=$label" > /dev/null; done
  echo "$value"
}

bank_on_device() {  # bank_on_device LABEL: WorldKV at worldkv@bytes25's retrieval budget, its store on the device
  local value
  value=$(calibrated retrieval_frames worldkv@bytes25 0.25 method=worldkv) || return 1
  every_seed method=worldkv "method.retrieval_frames=$value" method.bank_on_device=true "label=$1"
}

entry() {  # entry LABEL COMMAND...: run COMMAND for the entry LABEL unless ONLY leaves it out
  local label=$1; shift
  # shellcheck disable=SC2053  # ONLY is a pattern
  if [ -n "${ONLY:-}" ] && [[ "$label" != $ONLY ]]; then return 0; fi
  "$@"
}

if [ "${BOARD_ONLY:-0}" != 1 ]; then
  kivi2=(storage=kivi storage.bits=2) kivi4=(storage=kivi storage.bits=4)
  entry fullkv every_seed method=fullkv
  entry fullkv+kivi2-g32-r128 every_seed method=fullkv "${kivi2[@]}"
  entry fullkv+kivi4-g32-r128 every_seed method=fullkv "${kivi4[@]}"
  entry fullkv+qvg2x1k16-g32-r0 every_seed method=fullkv storage=qvg  # Quant VideoGen at its 2-bit point
  entry fullkv+lowrank16-r0 every_seed method=fullkv storage=lowrank storage.rank=16
  entry fullkv+lowrank24-r0 every_seed method=fullkv storage=lowrank storage.rank=24
  # TempCache's threshold, over all of [-1, 1], reaches 0.155-0.266 of FullKV's bytes on the calibration tasks
  # (its correspondence search merges only what it finds): 0.15 and 0.08 are out of its reach, and calibrating
  # there is refused
  for bytes in 0.25 0.15 0.08; do
    pct=$("$py" -c "print(round(100 * $bytes))")
    for arm in decoprune:gamma streaming:recent_chunks tempcache:threshold; do
      if [ "${arm%:*}" = tempcache ] && [ "$bytes" != 0.25 ]; then continue; fi
      entry "${arm%:*}@bytes$pct" calibrated "${arm#*:}" "${arm%:*}@bytes$pct" "$bytes" "method=${arm%:*}"
    done
  done
  entry worldkv@bytes25 calibrated retrieval_frames worldkv@bytes25 0.25 method=worldkv
  entry worldkv-on-device@bytes25 bank_on_device worldkv-on-device@bytes25
  # Out of reach (results/miniworld/families_bytes.md): every KIVI-4 composition at 0.25 (FullKV in KIVI-4 stores
  # about 0.32 of a bfloat16 FullKV's bytes). The compositions run at the targets they ran at in float32, so that
  # each has a before and after (Streaming + KIVI-2 at 0.15 and WorldKV + KIVI-4 at 0.15, out of reach in float32,
  # are not run)
  for bytes in 0.15 0.08; do
    pct=$("$py" -c "print(round(100 * $bytes))")
    entry "decoprune@bytes$pct+kivi4-g32-r128" \
      calibrated gamma "decoprune@bytes$pct+kivi4-g32-r128" "$bytes" method=decoprune "${kivi4[@]}"
  done
  entry worldkv@bytes8+kivi4-g32-r128 \
    calibrated retrieval_frames worldkv@bytes8+kivi4-g32-r128 0.08 method=worldkv "${kivi4[@]}"
  entry streaming@bytes8+kivi2-g32-r128 \
    calibrated recent_chunks streaming@bytes8+kivi2-g32-r128 0.08 method=streaming "${kivi2[@]}"
  entry decoprune@bytes15+lowrank24-r0 \
    calibrated gamma decoprune@bytes15+lowrank24-r0 0.15 method=decoprune storage=lowrank storage.rank=24
fi
[ "${BOARD:-1}" != 0 ] || exit 0
# every pair once (leaderboard.focus=all): the board's claims compare each entry with FullKV and each target's
# top entry with its runner-up, whichever they turn out to be (cmbench/report/board_claims.py)
"$py" -m cmbench leaderboard "out_dir=$out" leaderboard.focus=all "leaderboard.out=$out/board"
cp "$out/board/leaderboard.csv" results/miniworld/families_bytes.csv
cp "$out/board/comparisons.csv" results/miniworld/families_bytes_comparisons.csv
"$py" scripts/board_verdicts.py families results/miniworld/families_bytes.csv \
  results/miniworld/families_bytes_comparisons.csv results/miniworld/families_bytes_verdicts.csv
# the board with where each entry lands and its total memory (host store, bytes moved), and its figure
"$py" scripts/families_figure.py "$out/board/leaderboard.csv" results/miniworld/families_bytes.png \
  --table results/miniworld/families_bytes.csv
# the records behind the board, so that it recomputes from the repository: BOARD_ONLY=1 OUT=results/miniworld/families_runs
if [ "$out" != results/miniworld/families_runs ]; then
  "$py" scripts/paper_findings.py --copy-evidence "$out/miniworld" results/miniworld/families_runs/miniworld
  # and the calibration logs behind each bytes target (value, calibration bytes, probes: families_bytes.md quotes them)
  rm -rf results/miniworld/families_runs/calibration && mkdir -p results/miniworld/families_runs/calibration
  cp "$out"/calibration/*.json results/miniworld/families_runs/calibration/
fi
"$py" scripts/update_readme_results.py
