#!/usr/bin/env bash
# Mutation testing of CMBench's result-deciding modules with mutmut (the `dev` extra): each module listed in
# scripts/mutation_targets.txt is mutated in a copy of the repository under a scratch folder (mutmut rewrites
# the files it mutates; the checkout is never touched), and every mutant runs only the tests of that module's
# own test files that execute the mutated function. Prints one line per module (mutants, killed, survived,
# equivalent, score) and the diff of every surviving mutant that is not listed as equivalent in
# results/mutation/equivalent.txt. See docs/testing.md.
#
# Usage:
#   bash scripts/mutation_test.sh                       the modules changed since main (code or their tests)
#   bash scripts/mutation_test.sh --since REF           the modules changed since REF
#   bash scripts/mutation_test.sh --all                 every module in scripts/mutation_targets.txt
#   bash scripts/mutation_test.sh cmbench/cache/ledger.py cmbench/runs/records.py    these modules
# Options:
#   --jobs N        mutants run at once (default 1: mutation runs are CPU-hungry)
#   --csv FILE      append one row per module to FILE (results/mutation/baseline.csv is made this way)
#   --workdir DIR   scratch folder for the copies (default ${TMPDIR:-/tmp}/cmbench-mutation)
#   --keep          keep each module's copy (then `cd DIR/<module> && mutmut browse` explores the mutants)
#   --rerun         in a kept copy, run again only the mutants that were not killed (nor listed as equivalent),
#                   against the repository's current tests, which mutmut maps to the functions they execute
#                   afresh (after adding tests; a change to the module itself needs a full run)
#   --sample N      run N of each module's mutants, drawn uniformly (the copy's sample.txt), instead of all: the
#                   score is the sample's, printed with its 95% interval (for a module too slow to run whole);
#                   a later --rerun stays within the sample
#   --seed S        the sample's seed (default 0)
# Environment: PYTHON (default: .venv/bin/python of the repository, else python3) must have mutmut and the
# `test` extra installed.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py="$repo/.venv/bin/python"; else py="$(command -v python3)"; fi
fi
since="" all=0 jobs=1 csv="" keep=0 rerun=0 sample=0 seed=0 modules=()
workdir="${TMPDIR:-/tmp}/cmbench-mutation"
while [ $# -gt 0 ]; do
  case "$1" in
    --since) since="$2"; shift 2 ;;
    --all) all=1; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    --csv) csv="$(realpath -m "$2")"; shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --rerun) rerun=1; keep=1; shift ;;
    --sample) sample="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "mutation_test.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) modules+=("$1"); shift ;;
  esac
done
targets="$repo/scripts/mutation_targets.txt"
helper=("$py" "$repo/scripts/mutation_summary.py")
"$py" -c "import mutmut" 2>/dev/null || { echo "mutation_test.sh: $py has no mutmut: pip install -e '.[dev]'" >&2; exit 2; }
if [ ${#modules[@]} -eq 0 ]; then
  if [ $all -eq 1 ]; then
    mapfile -t modules < <("${helper[@]}" select --targets "$targets" --all)
  else
    ref="${since:-main}"
    mapfile -t changed < <(git diff --name-only "$ref" -- cmbench tests; git ls-files -o --exclude-standard -- cmbench tests)
    mapfile -t modules < <("${helper[@]}" select --targets "$targets" "${changed[@]}")
    if [ ${#modules[@]} -eq 0 ]; then echo "no result-deciding module changed since $ref"; exit 0; fi
  fi
fi
mkdir -p "$workdir"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" HF_HUB_OFFLINE=1
status=0
for module in "${modules[@]}"; do
  mapfile -t tests < <("${helper[@]}" tests --targets "$targets" "$module")
  copy="$workdir/$(echo "${module%.py}" | tr '/' '.')"
  names=()
  if [ $rerun -eq 1 ]; then
    [ -d "$copy/mutants" ] || { echo "mutation_test.sh: no kept copy of $module in $copy (run with --keep first)" >&2; status=1; continue; }
    for dest in "$copy/tests" "$copy/mutants/tests"; do rm -rf "$dest" && cp -r "$repo/tests" "$dest"; done
    "${helper[@]}" configure "$copy/pyproject.toml" "$module" "${tests[@]}"
    cp "$copy/pyproject.toml" "$copy/mutants/pyproject.toml"
    mapfile -t names < <(cd "$copy" && "${helper[@]}" survivors "$copy" "$module" --equivalent "$repo/results/mutation/equivalent.txt" \
      | grep -v '^$' || true)
    # which tests execute each function is mutmut's record of the tests it saw; the tests changed, so it is taken again
    rm -f "$copy/mutants/mutmut-stats.json"
    meta="$copy/mutants/$module.meta"
    [ -f "$meta.before" ] || cp "$meta" "$meta.before"  # the full run's results, for the mutants not rerun
    if [ ${#names[@]} -eq 0 ]; then echo "== $module: no mutant left to rerun"; continue; fi
    echo "== $module: rerunning ${#names[@]} mutant(s) that were not killed (tests: ${tests[*]})"
  else
    rm -rf "$copy" && mkdir -p "$copy"
    git ls-files -co --exclude-standard -z | xargs -0 tar cf - | tar xf - -C "$copy"
    git rev-parse --short HEAD > "$copy/.commit"
    git diff --quiet HEAD -- cmbench tests || echo "+changes" >> "$copy/.commit"
    "${helper[@]}" configure "$copy/pyproject.toml" "$module" "${tests[@]}"
    if [ "$sample" -gt 0 ]; then
      # mutmut generates the mutants and times the tests, then stops: no mutant has this name
      (cd "$copy" && nice -n 10 "$py" -m mutmut run cmbench.no_such_mutant > mutmut.generate.log 2>&1) || true
      [ -f "$copy/mutants/$module.meta" ] \
        || { echo "mutmut made no mutants of $module, see $copy/mutmut.generate.log" >&2; status=1; continue; }
      (cd "$copy" && "${helper[@]}" sample "$copy" "$module" "$sample" --seed "$seed" > sample.txt)
      mapfile -t names < "$copy/sample.txt"
      echo "== $module: a sample of ${#names[@]} mutants, seed $seed (tests: ${tests[*]})"
    else
      echo "== $module (tests: ${tests[*]})"
    fi
  fi
  start=$(date +%s)
  # mutmut's exit status says nothing about survivors; its progress line goes to the log
  (cd "$copy" && nice -n 10 "$py" -m mutmut run --max-children "$jobs" "${names[@]}" > mutmut.log 2>&1) \
    || { echo "mutmut failed on $module, see $copy/mutmut.log" >&2; tail -5 "$copy/mutmut.log" >&2; status=1; continue; }
  "${helper[@]}" summarize "$copy" "$module" --seconds $(( $(date +%s) - start )) --commit "$(tr '\n' ' ' < "$copy/.commit")" \
    --equivalent "$repo/results/mutation/equivalent.txt" ${csv:+--csv "$csv"} --tests "${tests[@]}" || status=1
  [ $keep -eq 1 ] || rm -rf "$copy"
done
exit $status
