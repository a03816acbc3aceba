#!/usr/bin/env bash
# CMBench installs as a package, not only as an editable checkout: build a wheel, install it into a fresh
# virtualenv outside the repository, and run `ls`, a 2-task MiniWorld run and its HTML report from another
# directory (configs/, data_manifests/, the tiny model's weights and the report's templates must all come from
# inside the wheel).
# Usage: bash scripts/check_wheel.sh        (about 2 minutes; CI runs it)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --no-compile "torch==${CMBENCH_TORCH_VERSION:-2.13.0}" ${CMBENCH_TORCH_INDEX:+--index-url "$CMBENCH_TORCH_INDEX"}
# build from a clean copy of the tracked files, so nothing untracked (data, runs, caches) can leak in
git -C "$repo" ls-files -z | (cd "$repo" && xargs -0 tar cf -) | (mkdir "$work/src" && cd "$work/src" && tar xf -)
"$py" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
# the wheel holds the product only: no development harness (the hostile pass, mutation bookkeeping: tests/devtools/),
# no tests or scripts
"$py" - "$work"/dist/cmbench-*.whl <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
harness = [n for n in names if any(w in n.lower() for w in ("hostile", "mutation", "devtools", "tests/", "scripts/"))]
assert not harness, f"the wheel ships development files: {harness}"
assert any(n.startswith("cmbench/paper/") for n in names), "the wheel lacks cmbench/paper/"
print(f"wheel: {len(names)} files, no development harness")
PY
"$py" -m pip install -q --no-compile "$work"/dist/cmbench-*.whl  # bytecode compiled on import (scripts/setup_venv.sh)
mkdir "$work/elsewhere" && cd "$work/elsewhere"
"$py" - <<'PY'
import pathlib, cmbench
where = pathlib.Path(cmbench.__file__).resolve()
assert "site-packages" in where.parts, f"cmbench imported from {where}, not from the installed wheel"
print(f"cmbench imported from {where.parent}")
PY
"$py" -m cmbench ls | tee "$work/ls.txt"
grep -q "decoprune" "$work/ls.txt" && grep -q "miniworld" "$work/ls.txt"
HF_HUB_OFFLINE=1 "$py" -m cmbench run limit=2 progress=false | tee "$work/run.txt"
grep -q "2/2 tasks ok" "$work/run.txt"
"$py" -m cmbench validate | tee "$work/validate.txt"  # the dataset spec and task subsets come from the wheel too
grep -q "miniworld: OK, 116 valid task" "$work/validate.txt"
"$py" -m cmbench report | tee "$work/report.txt"  # the report's templates come from the wheel too
grep -q "report: 1 method x 2 tasks" "$work/report.txt"
echo "check_wheel: OK (wheel installed into a fresh venv; ls, a 2-task run and its report from $PWD)"
