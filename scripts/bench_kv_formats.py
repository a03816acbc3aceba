"""KV storage formats against full precision, in one run (cmbench/benchmarks/kv_formats.py holds the code):

- attention error: the committed tiny model's K/V of one MiniWorld context (``--context`` latent frames,
  FullKV, re-indexed), written into a cache of each format; the next chunk's first denoising call's
  queries attend over each; relative error of the outputs over every layer, of the stored K/V, and stored
  bytes vs fp;
- attention time: one layer's attention call of a chunk (256 queries) over ``--frames`` latent frames of
  history in the tiny model's geometry, each format against fp in interleaved rounds (medians).

    python scripts/bench_kv_formats.py --threads 1 --out results/bench_kv_formats.md
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

from cmbench.benchmarks.kv_formats import attention_errors, attention_times
from cmbench.provenance import cpu_name, git_commit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=48, help="latent frames of the error context (default 48)")
    parser.add_argument("--frames", type=int, default=768, help="latent frames of history for the timing (default 768)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = [f"# KV storage formats vs full precision (tiny model geometry; {cpu_name() or platform.machine()}, "
             f"{args.threads} thread(s), commit {git_commit() or 'unknown'})", "",
             f"Attention error on the tiny model's K/V of one {args.context}-frame context "
             "(relative L2 of every layer's output vs fp; K/V error: of every layer's stored keys and values):", "",
             "| format | rel. error | K/V error | stored bytes | fp bytes | bytes / fp |", "|---|---|---|---|---|---|"]
    for e in attention_errors(args.context):
        lines.append(f"| {e.name} | {e.rel_error:.4f} | {e.kv_error:.4f} | {e.stored_bytes} | {e.fp_bytes} | "
                     f"{e.stored_bytes / e.fp_bytes:.3f} |")
    lines += ["", f"Attention time of one layer's call (256 queries) over {args.frames} latent frames of history "
              f"(medians of {args.rounds} interleaved rounds):", "",
              "| format | history tokens | seconds | fp seconds | time / fp |", "|---|---|---|---|---|"]
    for t in attention_times(args.frames, args.rounds):
        lines.append(f"| {t.name} | {t.tokens} | {t.seconds:.4f} | {t.fp_seconds:.4f} | {t.seconds / t.fp_seconds:.2f} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
