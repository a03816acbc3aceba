#!/usr/bin/env bash
# Create the virtualenv .venv in the repository root (if missing) and install CMBench into it.
# Safe to run again. Usage: bash scripts/setup_venv.sh [EXTRAS]   e.g. `test`, `test,slurm`
#
# torch is installed FIRST, as a CPU build, so the project's torch range is already met and pip never
# pulls a multi-GB CUDA build on a CPU-only machine. On a GPU machine, install the torch you want
# into .venv before running this script (it then keeps it). CMBENCH_TORCH_VERSION and
# CMBENCH_TORCH_INDEX (e.g. PyTorch's CPU wheel index) choose another CPU build.
# Each step is announced on a line starting "setup_venv:" and pip shows its own progress (minutes on a
# fresh machine: torch alone is a few hundred MB).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
say() { echo "setup_venv: $*"; }
if [ -x .venv/bin/python ]; then
  say "using the existing .venv"
else
  say "creating .venv with $(python3 --version)"
  python3 -m venv .venv
fi
torch="torch==${CMBENCH_TORCH_VERSION:-2.13.0}"
if version=$(.venv/bin/python -c "import torch; print(torch.__version__)" 2>/dev/null); then
  say "keeping torch $version (already in .venv)"
else
  say "installing $torch${CMBENCH_TORCH_INDEX:+ from $CMBENCH_TORCH_INDEX} (a few hundred MB)"
  .venv/bin/pip install "$torch" ${CMBENCH_TORCH_INDEX:+--index-url "$CMBENCH_TORCH_INDEX"}
fi
say "installing CMBench (editable, extras: ${extras:-none}) and its dependencies"
.venv/bin/pip install -e ".${extras:+[$extras]}"
if [[ ",$extras," == *",test,"* ]]; then
  # the kvpress adapter's tests need NVIDIA kvpress (README, "kvpress presses"): installed without its
  # dependencies, which keeps the venv's transformers (kvpress 0.5 caps it below 5.3; the presses' scores
  # need torch alone), then the packages importing kvpress needs, without pip's block about the
  # requirements of kvpress left unmet on purpose
  say "installing kvpress for the kvpress adapter's tests (without its transformers cap)"
  .venv/bin/pip install --no-deps "kvpress>=0.5.5,<0.6"
  .venv/bin/pip install --no-warn-conflicts "cachetools>=5.5.2,<6" "datasets>=2.21" "fire>=0.6,<0.7"
fi
say "done: .venv/bin/python -m cmbench --help lists the commands"
