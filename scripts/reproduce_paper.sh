#!/usr/bin/env bash
# Every finding of the DeCoPrune paper as its named experiment (configs/experiment/paper_*.yaml), then the
# findings table (scripts/paper_findings.py; each finding's criterion: cmbench/paper/criteria.py).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
Usage: bash scripts/reproduce_paper.sh [options]

Runs the paper's findings (diagnose, probe_step, selection, rope, short, gate, quality) in the reference
MiniWorld world (world_seed 0) and in a second world (world_seed 2), then writes the findings table. It
prints each step's estimated time before starting it, and resumes: finished tasks, calibrations and
diagnoses are kept, so a second call continues where the first stopped.

Options:
  --out DIR        where runs go (default runs/paper): DIR/world0/<finding>/, DIR/world2/<finding>/
  --results FILE   where the table goes (default DIR/paper_findings.md). The committed table is rebuilt
                   from the committed records instead: python scripts/paper_findings.py --out
                   results/paper/world0 --second results/paper/world2 --results results/paper_findings.md
  --evidence DIR   also copy the records behind every row (records, summaries, run configs, the
                   diagnosis and the quality table; no videos) into DIR (e.g. results/paper), replacing
                   what that folder held for the worlds run
  --only "A B"     only these findings (default: all seven)
  --worlds "0 2"   the worlds to run (default both; 0 is the reference world, 2 the second-world column)
  --limit N        a quick look: every run on N tasks and calibrations on 2 tasks (the table says so)
  --setup "..."    overrides of every command (the GPU reproduction: --setup "data=cmbench
                   backbone=lingbot_world_v2_14b scorer=owl_sam_dino" --worlds 0)
  --note "..."     a sentence on what this run is, written above the table
  -h, --help       this text; nothing runs
Environment: PYTHON (default .venv/bin/python), THREADS (torch threads, default 1), SECONDS_PER_TASK (the
estimate's cost of one task on one core, default 6).
EOF
}

PY=${PYTHON:-.venv/bin/python}
OUT=runs/paper
RESULTS=""
EVIDENCE=""
ONLY="diagnose probe_step selection rope short gate quality"
WORLDS="0 2"
LIMIT=""
SETUP=""
NOTE=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out) OUT=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --evidence) EVIDENCE=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --worlds) WORLDS=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --setup) SETUP=$2; shift 2 ;;
    --note) NOTE=$2; shift 2 ;;
    *) echo "reproduce_paper.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
RESULTS=${RESULTS:-$OUT/paper_findings.md}
EXTRA=""
if [[ -n "$LIMIT" ]]; then
  [[ "$LIMIT" =~ ^[1-9][0-9]*$ ]] || { echo "reproduce_paper.sh: --limit needs a positive number of tasks, got $LIMIT" >&2; exit 2; }
  EXTRA="limit=$LIMIT calibration.tasks=2"
  NOTE=${NOTE:-"a quick look: every run on $LIMIT tasks, calibrations on 2 tasks"}
fi
export OMP_NUM_THREADS=${THREADS:-1}
SECONDS_PER_TASK=${SECONDS_PER_TASK:-6}
want() { [[ " $ONLY " == *" $1 "* ]]; }
tasks() { if [[ -n "$LIMIT" && "$LIMIT" -lt "$1" ]]; then echo "$LIMIT"; else echo "$1"; fi; }
# estimate STEP RUNS TASKS CALIBRATIONS: one line before a step starts (a calibration measures about 6 knob
# values on 4 calibration tasks)
estimate() {
  local n; n=$(tasks "$3")
  local work=$(( $2 * n + $4 * 6 * $(tasks 4) ))
  echo "== world $world: $1: $2 run(s) x $n task(s) + $4 calibration(s): about $work task runs," \
       "~$(( (work * SECONDS_PER_TASK + 59) / 60 )) min at ${SECONDS_PER_TASK} s a task (less where resumed)" >&2
}

for world in $WORLDS; do
  case "$world" in
    0) data=""; short_data="" ;;
    2) data="data=miniworld_w2"; short_data="data=miniworld_short_w2" ;;
    *) echo "reproduce_paper.sh: --worlds takes 0 and 2, got $world" >&2; exit 2 ;;
  esac
  [[ -n "$SETUP" && "$world" != 0 ]] && { echo "reproduce_paper.sh: --setup runs world 0 only (--worlds 0)" >&2; exit 2; }
  base="$OUT/world$world"
  # shellcheck disable=SC2086  # SETUP, EXTRA and the data override are lists of overrides
  cmb() { $PY -m cmbench "$@" progress=false $SETUP $EXTRA; }
  if want diagnose; then    # 1: the motivating observation
    estimate diagnose 1 8 0
    cmb diagnose experiment=paper_diagnose out_dir="$base" $data
  fi
  if want probe_step; then  # 2: the probe-step ablation (3 steps x 3 targets, each calibrated)
    estimate probe_step 9 16 9
    cmb run -m experiment=paper_probe_step out_dir="$base/probe_step" $data
  fi
  if want selection; then   # 3: the selection ablation, then Reverse at DeCoPrune's realised PR
    estimate selection 7 16 4
    cmb run -m experiment=paper_selection out_dir="$base/selection" $data
    pr=$($PY scripts/paper_findings.py --realised-pr "$base/selection")
    cmb run experiment=paper_selection method=decoprune_reverse method.target_pr="$pr" out_dir="$base/selection" $data
  fi
  if want rope; then        # 4: the RoPE re-index ablation (on the short-window backbone: the experiment's default)
    estimate rope 10 8 0
    cmb run -m experiment=paper_rope out_dir="$base/rope" $data
  fi
  if want short; then       # 5: the short-context check at the paper's PR, FullKV beside
    estimate short 6 18 5
    cmb run experiment=paper_short_context method=fullkv out_dir="$base/short" $short_data
    cmb run -m experiment=paper_short_context out_dir="$base/short" $short_data
  fi
  if want gate; then        # 6: the backbone gate (FullKV and the no-context control, then the leaderboard)
    estimate gate 2 8 0
    cmb run experiment=paper_backbone_gate method=fullkv out_dir="$base/gate" $data
    cmb run experiment=paper_backbone_gate method=streaming method.recent_chunks=0 label=sink_only out_dir="$base/gate" $data
    $PY -m cmbench leaderboard out_dir="$base/gate" progress=false $SETUP $data
  fi
  if want quality; then     # 7: quality vs memory (calibrated curves with the quality columns)
    estimate quality 13 16 12
    cmb curves experiment=paper_quality_memory out_dir="$base/quality" $data
  fi
done

second=()
[[ -d "$OUT/world2" ]] && second=(--second "$OUT/world2")
$PY scripts/paper_findings.py --out "$OUT/world0" "${second[@]}" --results "$RESULTS" --setup "$SETUP" \
  --extra "$EXTRA" --note "$NOTE"
if [[ -n "$EVIDENCE" ]]; then
  for world in $WORLDS; do
    $PY scripts/paper_findings.py --copy-evidence "$OUT/world$world" "$EVIDENCE/world$world"
  done
fi
