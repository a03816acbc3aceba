"""Write the findings table: one row per finding of the paper, rebuilt from run records
(:mod:`cmbench.paper.findings`; each criterion from :mod:`cmbench.paper.criteria`).

    python scripts/paper_findings.py --out results/paper/world0 --second results/paper/world2 \\
        --results results/paper_findings.md            # the committed table, from the committed records
    python scripts/paper_findings.py --out runs/paper/world0 --results runs/paper/paper_findings.md \\
        --extra "limit=2" --note "subset run: ..."     # what scripts/reproduce_paper.sh writes
    python scripts/paper_findings.py --realised-pr runs/paper/world0/selection
                                                       # DeCoPrune's PR at its default threshold there
    python scripts/paper_findings.py --docs            # rewrite docs/findings.md's criteria from the code
    python scripts/paper_findings.py --copy-evidence runs/paper/world0 results/paper/world0
                                                       # the records behind the rows, without videos
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from cmbench.paper.findings import VERDICTS_NAME, criteria_section, entries, page, realised_pr, verdict_rows
from cmbench.report import verdicts
from cmbench.runs import atomic

EVIDENCE = ("records*.jsonl", "run.json", "config.yaml", "summary.json", "diagnose*.csv", "diagnose.md",
            "quality_vs_memory.csv", "curves.csv", "curves_reference.csv", "auc.csv", "leaderboard.csv",
            "comparisons.csv", "backbone_gate.csv")
"""The files a row is rebuilt from (records and summaries, the diagnosis, the curves' tables): no videos."""


def copy_evidence(source: Path, dest: Path) -> int:
    """Copy the :data:`EVIDENCE` files under ``source`` into ``dest``, keeping their paths; ``dest`` is replaced
    as a whole (built beside it, then renamed). Returns the number of files copied."""
    if not source.is_dir():
        raise SystemExit(f"--copy-evidence: {source} is not a folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    copied = 0
    for pattern in EVIDENCE:
        for file in sorted(source.rglob(pattern)):
            if file.is_file() and not file.is_symlink() and "videos" not in file.relative_to(source).parts:
                target = build / file.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(file, target)
                copied += 1
    if dest.exists():
        shutil.rmtree(dest)
    build.rename(dest)
    return copied


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/paper/world0"), help="the reference world's outputs")
    parser.add_argument("--second", type=Path, default=None, help="the second world's outputs (its verdict column)")
    parser.add_argument("--second-name", default="world_seed 2", help="how the table names the second world")
    parser.add_argument("--results", type=Path, default=None, help="where to write the table (required)")
    parser.add_argument("--setup", default="", help="overrides every command ran with (data, backbone, scorer)")
    parser.add_argument("--extra", default="", help="overrides for a quicker look (limit=..., calibration.tasks=...)")
    parser.add_argument("--extra-for", action="append", default=[], metavar="N=OVERRIDES",
                        help="overrides finding N ran with beyond --extra (repeatable)")
    parser.add_argument("--note", default="", help="a sentence on what this run is (e.g. a subset run)")
    parser.add_argument("--realised-pr", type=Path, default=None, metavar="FOLDER",
                        help="print DeCoPrune's realised PR at its default threshold in FOLDER's runs and exit")
    parser.add_argument("--docs", action="store_true", help="rewrite docs/findings.md's criteria section and exit")
    parser.add_argument("--copy-evidence", nargs=2, type=Path, metavar=("SOURCE", "DEST"),
                        help="copy the records behind the rows from SOURCE into DEST (replaced) and exit")
    args = parser.parse_args()
    if args.copy_evidence:
        source, dest = args.copy_evidence
        print(f"copied {copy_evidence(source, dest)} files from {source} into {dest}")
        return 0
    if args.docs:
        docs = Path(__file__).resolve().parents[1] / "docs" / "findings.md"
        head, rest = docs.read_text().split("<!-- criteria -->\n", 1)
        tail = rest.split("<!-- /criteria -->", 1)[1]
        docs.write_text(f"{head}<!-- criteria -->\n{criteria_section('###')}\n<!-- /criteria -->{tail}")
        print(f"wrote {docs}")
        return 0
    if args.realised_pr is not None:
        pr = realised_pr(entries(args.realised_pr), "decoprune")
        if pr is None:
            print(f"no DeCoPrune run at its default threshold under {args.realised_pr}", file=sys.stderr)
            return 1
        print(f"{pr:.4f}")
        return 0
    if args.results is None:
        parser.error("--results: where to write the table (results/paper_findings.md only when you mean to)")
    extra_for = {}
    for item in args.extra_for:
        number, _, overrides = item.partition("=")
        if not number.strip().isdigit():
            parser.error(f"--extra-for {item!r}: expected N=OVERRIDES with N the finding's number")
        extra_for[int(number)] = overrides
    text, findings, again = page(args.out, second=args.second, second_name=args.second_name, setup=args.setup,
                                 extra=args.extra, extra_for=extra_for, note=args.note)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_with(args.results, lambda tmp: tmp.write_text(text))
    verdicts.write(verdict_rows(findings, again or []), args.results.parent / VERDICTS_NAME)
    for f in findings:
        print(f"{f.number}. {f.criterion.name}: {f.verdict}", file=sys.stderr)
    print(f"wrote {args.results} and {args.results.parent / VERDICTS_NAME}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
