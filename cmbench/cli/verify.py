"""``python -m cmbench verify RUN [data.root=DIR] [tolerance=T]``: recheck a received run folder.

Scores its videos again, recomputes its PR and bytes from its records' ledgers and compares its code
identities with this checkout's (:mod:`cmbench.report.verify`); prints one line per difference. Exit status
0 when nothing differs, 1 when something does, 2 on a usage error.
"""

from __future__ import annotations

import math
import sys

from cmbench.errors import CMBenchError


def _options(args: list[str]) -> tuple[str | None, dict[str, str]]:
    """The run folder and the ``key=value`` options of the command line."""
    folders = [a for a in args if "=" not in a]
    options = dict(a.split("=", 1) for a in args if "=" in a)
    return (folders[0] if len(folders) == 1 else None), options


def execute(args: list[str]) -> int:
    from cmbench.report.verify import verify_run

    run, options = _options(args)
    unknown = sorted(set(options) - {"data.root", "tolerance"})
    if run is None or unknown:
        print("cmbench verify: usage: python -m cmbench verify RUN [data.root=DIR] [tolerance=T]"
              + (f" (unknown: {', '.join(unknown)})" if unknown else ""), file=sys.stderr)
        return 2
    try:
        tolerance = float(options.get("tolerance", "1e-6"))
    except ValueError:
        tolerance = math.nan
    if not (math.isfinite(tolerance) and tolerance >= 0):
        print(f"cmbench verify: tolerance={options['tolerance']}: expected a number >= 0", file=sys.stderr)
        return 2
    try:
        problems = verify_run(run, options.get("data.root"), tolerance)
    except CMBenchError as err:
        print(f"cmbench verify: {run}: {err}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"{run}: {problem}")
    print(f"verify: {run}: {len(problems)} difference(s)" if problems else f"verify: {run}: nothing differs "
          f"(scores, PR and bytes, code identities)")
    return 1 if problems else 0
