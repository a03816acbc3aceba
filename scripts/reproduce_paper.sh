#!/usr/bin/env bash
# Every finding of the DeCoPrune paper as its named experiment (configs/experiment/paper_*.yaml), on the
# default setup (MiniWorld, tiny backbone, light scorer), then one table: results/paper_findings.md
# (scripts/paper_findings.py: per finding the paper's number, CMBench's with its CI, the command, and
# holds / does not hold / cannot be tested, with the reason). Resumable: finished tasks, calibrations and
# diagnoses are kept.
#
#   bash scripts/reproduce_paper.sh                      # everything (hours on a CPU)
#   ONLY="diagnose rope gate" EXTRA="limit=2" NOTE="subset run: ..." bash scripts/reproduce_paper.sh
#                                                        # some findings, on a few tasks (say so in NOTE)
#   SETUP="data=cmbench backbone=lingbot_world_v2_14b scorer=owl_sam_dino" OUT=runs/paper_lingbot \
#     RESULTS=results/paper_findings_lingbot.md bash scripts/reproduce_paper.sh   # the GPU reproduction
#
# ONLY: the findings to run (default all: diagnose probe_step selection rope short gate quality); the table
# is written over every finding, those not run saying so. SETUP: overrides of every command (data, backbone,
# scorer); EXTRA: overrides for a quicker look (e.g. limit=2 calibration.tasks=2), written into the table.
# Outputs: <OUT>/<finding>/ (runs, leaderboards, curves; the diagnosis under <OUT>/<data>/diagnose/), and
# the diagnosis's CSV, summary, figure and verdict copied into results/paper_diagnose/ beside the table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/paper}
SETUP=${SETUP:-}
EXTRA=${EXTRA:-}
ONLY=${ONLY:-diagnose probe_step selection rope short gate quality}
RESULTS=${RESULTS:-results/paper_findings.md}
NOTE=${NOTE:-}
export OMP_NUM_THREADS=${THREADS:-1}
want() { [[ " $ONLY " == *" $1 "* ]]; }
# shellcheck disable=SC2086  # SETUP and EXTRA are lists of overrides
cmb() { $PY -m cmbench "$@" progress=false $SETUP $EXTRA; }

if want diagnose; then    # 1: the motivating observation
  cmb diagnose experiment=paper_diagnose out_dir="$OUT"
  mkdir -p "$(dirname "$RESULTS")/paper_diagnose"
  for f in "$OUT"/*/diagnose/decoprune/diagnose*; do cp "$f" "$(dirname "$RESULTS")/paper_diagnose/"; done
fi
if want probe_step; then  # 2: the probe-step ablation (9 calibrated runs)
  cmb run -m experiment=paper_probe_step out_dir="$OUT/probe_step"
fi
if want selection; then   # 3: the selection ablation
  cmb run -m experiment=paper_selection out_dir="$OUT/selection"
fi
if want rope; then        # 4: the RoPE re-index ablation
  cmb run -m experiment=paper_rope out_dir="$OUT/rope"
fi
if want short; then       # 5: the short-context check
  cmb run -m experiment=paper_short_context out_dir="$OUT/short"
fi
if want gate; then        # 6: the backbone gate (FullKV and the no-context control, then the leaderboard)
  cmb run experiment=paper_backbone_gate method=fullkv out_dir="$OUT/gate"
  cmb run experiment=paper_backbone_gate method=streaming method.recent_chunks=0 label=sink_only out_dir="$OUT/gate"
  cmb leaderboard out_dir="$OUT/gate"
fi
if want quality; then     # 7: quality vs memory (calibrated curves with the quality columns)
  cmb curves experiment=paper_quality_memory out_dir="$OUT/quality"
fi

$PY scripts/paper_findings.py --out "$OUT" --results "$RESULTS" --setup "$SETUP" --extra "$EXTRA" --note "$NOTE"
