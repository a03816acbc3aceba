# shellcheck shell=bash
# Sourced by the scripts that build a committed board (families_bytes.sh, kvpress_board.sh, retrieval_comparison.sh):
# `run OVERRIDE...` runs one `python -m cmbench run` with the caller's $py, its "${common[@]}" and "${extra[@]}"
# overrides before OVERRIDE..., niced, its output on stderr, and prints its run folder (the last field of run's last
# line); a failed run prints what it said and returns 1.
run() {
  local said
  echo "=== $*" >&2
  said=$(nice -n 10 "$py" -m cmbench run "${common[@]}" "${extra[@]}" "$@") \
    || { printf '%s\n' "$said" >&2; echo "$(basename "$0"): the run above failed: $*" >&2; return 1; }
  printf '%s\n' "$said" >&2
  printf '%s\n' "$said" | tail -n 1 | sed 's/.*; //'
}
