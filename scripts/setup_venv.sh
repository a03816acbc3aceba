#!/usr/bin/env bash
# Create the virtualenv .venv in the repository root (if missing) and install CMBench into it.
# Safe to run again. Usage: bash scripts/setup_venv.sh [EXTRAS]   e.g. `test`, `test,slurm`
#
# torch is installed FIRST, as a CPU build, so the project's torch range is already met and pip never
# pulls a multi-GB CUDA build on a CPU-only machine. On a GPU machine, install the torch you want
# into .venv before running this script (it then keeps it). CMBENCH_TORCH_VERSION and
# CMBENCH_TORCH_INDEX (e.g. PyTorch's CPU wheel index) choose another CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q "torch==${CMBENCH_TORCH_VERSION:-2.13.0}" ${CMBENCH_TORCH_INDEX:+--index-url "$CMBENCH_TORCH_INDEX"}
fi
.venv/bin/pip install -q -e ".${extras:+[$extras]}"
