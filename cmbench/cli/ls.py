"""``python -m cmbench ls [group ...]``: what each config group offers, one line per entry."""

from __future__ import annotations

import sys

from cmbench.config_paths import GROUPS, group_entries
from cmbench.errors import CMBenchError

PRESS_METHODS = ("kvpress", "kvpress_decoding")
"""The methods whose ``method.press`` names a kvpress press (DecodingPress's base press, for the second)."""


def entries(group: str) -> dict[str, dict[str, str]]:
    """The configs of ``group`` as ``ls`` lists them: methods document themselves in their class."""
    if group == "method":
        from cmbench.methods.registry import config_doc

        return group_entries(group, config_doc)
    return group_entries(group)


def press_listing() -> str:
    """The kvpress presses the ``kvpress`` method runs on the installed kvpress, or how to install it."""
    from cmbench.methods.kvpress_adapter import EXTRA, runnable_presses

    try:
        version, names = runnable_presses()
    except CMBenchError:
        return f"presses: kvpress is not installed ({EXTRA})"
    return f"presses that run on kvpress {version}: {', '.join(names)}"


def execute(args: list[str]) -> int:
    """Print the entries of the named groups (all groups when none is named); exit 1 when a config
    folder cannot be used or a yaml in it does not parse (each named on stderr, the rest still listed)."""
    unknown = [g for g in args if g not in GROUPS]
    if unknown:
        print(f"cmbench ls: unknown group(s) {', '.join(unknown)}; groups are {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    problems = []
    listing = None  # the presses, found once: kvpress and kvpress_decoding run the same ones
    for group in args or GROUPS:
        try:
            found = entries(group)
        except CMBenchError as err:
            print(f"cmbench ls: error: {err}", file=sys.stderr)
            return 1
        print(f"{group}/ ({len(found)})")
        width = max((len(n) for n in found), default=0)
        for name, info in found.items():
            paper = f"  [{info['paper']}]" if info["paper"] else ""
            print(f"  {name.ljust(width)}  {info['description']}{paper}")
            if group == "method" and name in PRESS_METHODS:
                listing = listing or press_listing()
                print(f"  {''.ljust(width)}  {listing}")
            if "error" in info:
                problems.append(info["error"])
    for problem in problems:
        print(f"cmbench ls: error: {problem}", file=sys.stderr)
    return 1 if problems else 0
