"""What storing the KV cache's full-precision rows in bfloat16 (the real backbones' serving precision) instead of
float32 (the tiny model's default) changes: FullKV and DeCoPrune on the whole MiniWorld suite at one seed, each in
both precisions, their scores paired by task, and "bfloat16 level with float32" decided for each method by the
verdict rule (docs/verdicts.md; the two claims one family).

    python scripts/cache_precision.py --out results/miniworld/cache_precision        # runs into runs/precision
    python scripts/cache_precision.py --runs-only                                    # the runs alone

Writes ``<out>.csv`` (per method: both means, the paired difference, its simultaneous interval and verdict, the
device KV bytes of each precision) and ``<out>.md``. The runs are resumable (``python -m cmbench run``); a board
never compares entries of different precisions, so the pairing here is the script's own, by task and seed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

from cmbench.report import read_records, verdicts
from cmbench.report.verdicts import EQUIVALENT, Claim

METHODS = ("fullkv", "decoprune")
DTYPES = ("float32", "bfloat16")


def run(python: str, out_dir: Path, method: str, dtype: str, seed: int, extra: list[str]) -> Path:
    """One resumable run; its folder (the last field of ``run``'s last line)."""
    command = [python, "-m", "cmbench", "run", f"method={method}", f"cache.dtype={dtype}", f"seed={seed}",
               f"out_dir={out_dir}", "progress=false", f"label={method}-{dtype}", *extra]
    print("+", " ".join(command), file=sys.stderr, flush=True)
    said = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    print(said[-1], file=sys.stderr, flush=True)
    return Path(said[-1].rsplit("; ", 1)[-1])


def compare(folders: dict[tuple[str, str], Path]) -> pd.DataFrame:
    """Per method: each precision's mean score and device KV bytes ratio, and bfloat16 minus float32 paired by
    (task, seed), decided as one family of equivalence claims."""
    frames = {key: read_records(folder).frame.query("status == 'ok'") for key, folder in folders.items()}
    claims, rows = [], []
    for method in METHODS:
        full, half = frames[(method, "float32")], frames[(method, "bfloat16")]
        paired = full.merge(half, on=["task_id", "run_seed"], suffixes=("_f", "_h"))
        claims.append(Claim.of_differences(f"{method} in bfloat16 level with float32", EQUIVALENT,
                                           paired["score_h"] - paired["score_f"], paired["context_id_f"],
                                           a=f"{method}-bfloat16", b=f"{method}-float32"))
        rows.append({"method": method, "score_float32": full["score"].mean(), "score_bfloat16": half["score"].mean(),
                     "kv_bytes_ratio_float32": _mean(full, "kv_bytes_ratio"),
                     "kv_bytes_ratio_bfloat16": _mean(half, "kv_bytes_ratio"),
                     "peak_kv_mb_float32": _mean(full, "peak_kv_bytes") / 1e6,
                     "peak_kv_mb_bfloat16": _mean(half, "peak_kv_bytes") / 1e6})
    table = pd.DataFrame(rows)
    decided = verdicts.decide(claims)
    for column, values in (("delta", [d.claim.estimate for d in decided]), ("low", [d.low for d in decided]),
                           ("high", [d.high for d in decided]), ("level", [d.level for d in decided]),
                           ("verdict", [d.verdict for d in decided]), ("n_pairs", [d.claim.n_pairs for d in decided]),
                           ("contexts", [d.claim.contexts for d in decided])):
        table[column] = values
    return table


def _mean(frame: pd.DataFrame, column: str) -> float:
    return float(frame[column].mean()) if column in frame and frame[column].notna().any() else float("nan")


def markdown(table: pd.DataFrame) -> str:
    lines = ["| method | float32 | bfloat16 | bfloat16 − float32 [interval] | verdict (level within ±0.05) | "
             "peak KV MB float32 / bfloat16 | pairs |", "|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.method} | {r.score_float32:.4f} | {r.score_bfloat16:.4f} | {r.delta:+.4f} [{r.low:+.4f}, "
                     f"{r.high:+.4f}] | {r.verdict} | {r.peak_kv_mb_float32:.2f} / {r.peak_kv_mb_bfloat16:.2f} | "
                     f"{r.n_pairs} ({r.contexts} contexts) |")
    level = float(table["level"].iloc[0])
    return "\n".join([*lines, "", f"Intervals at level {level:.2%} (Bonferroni over the {len(table)} claims)."])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/miniworld/cache_precision"))
    parser.add_argument("--runs", type=Path, default=Path("runs/precision"), help="where the runs go")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs-only", action="store_true")
    parser.add_argument("extra", nargs="*", help="overrides added to every run (limit=8 for a quick look)")
    args = parser.parse_args(argv)
    folders = {(m, d): run(args.python, args.runs, m, d, args.seed, args.extra) for m in METHODS for d in DTYPES}
    if args.runs_only:
        return 0
    table = compare(folders)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.6g")
    text = markdown(table)
    args.out.with_suffix(".md").write_text(
        f"# FullKV and DeCoPrune with the cache in bfloat16 and in float32\n\nCommand: `python scripts/cache_precision.py "
        f"--out {args.out}{' ' + ' '.join(args.extra) if args.extra else ''}` (seed {args.seed}).\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
