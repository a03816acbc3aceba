"""The hostile pass: attack the real command line as a careless user or a hostile run folder would.

    python scripts/hostile_probes.py                   # every probe (a few minutes on 2 loaded cores)
    python scripts/hostile_probes.py --only validate   # the probes whose name contains "validate"
    python scripts/hostile_probes.py --list            # the probes' names
    python scripts/hostile_probes.py --keep            # keep the temporary folder to look at
    python scripts/hostile_probes.py --jobs 2 --markdown results/hostile_probes.md   # the committed record

Builds its inputs in a fresh temporary folder (a small MiniWorld suite and one real run on it, copied
for every probe that needs a run folder), runs each probe's ``python -m cmbench ...`` as a subprocess
and prints one line per probe, ``held`` or ``FAILED: <why>``, then the counts. Exit status 1 when a
probe failed. The probes: tests/devtools/hostile_probes.py; what they check: docs/testing.md.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the pass lives in tests/devtools/

from devtools.hostile import REPO, markdown, run_probes, select, summary_line  # noqa: E402
from devtools.hostile_pass import PROBES, new_workspace  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                        help="run the probes whose name contains it (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    parser.add_argument("--list", action="store_true", help="print the probes' names and exit")
    parser.add_argument("--jobs", type=int, default=1, help="probes run at once (each is a subprocess)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the results page here")
    args = parser.parse_args(argv)
    probes = select(PROBES, args.only)
    if args.list:
        print("\n".join(p.name for p in probes))
        return 0
    if not probes:
        print(f"no probe name contains {' or '.join(map(repr, args.only))} (--list shows them)", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="cmbench-hostile-"))
    start = time.monotonic()
    try:
        results = run_probes(probes, new_workspace(root), jobs=args.jobs,
                             report=lambda r: print(f"{r.line} ({r.seconds:.0f} s)", flush=True))
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    seconds = time.monotonic() - start
    print(f"{summary_line(results)} in {seconds:.0f} s")
    if args.markdown is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        command = "python scripts/hostile_probes.py " + " ".join(a for a in sys.argv[1:])
        args.markdown.write_text(markdown(results, command.strip(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                          commit.stdout.strip() + (" with uncommitted changes" if dirty else ""), seconds))
    return 1 if any(r.failure is not None for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
