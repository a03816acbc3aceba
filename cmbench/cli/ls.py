"""``python -m cmbench ls [group ...]``: what each config group offers, one line per entry."""

from __future__ import annotations

import sys

from cmbench.config_paths import GROUPS, group_entries


def execute(args: list[str]) -> int:
    """Print the entries of the named groups (all groups when none is named)."""
    unknown = [g for g in args if g not in GROUPS]
    if unknown:
        print(f"cmbench ls: unknown group(s) {', '.join(unknown)}; groups are {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    for group in args or GROUPS:
        found = group_entries(group)
        print(f"{group}/ ({len(found)})")
        width = max((len(n) for n in found), default=0)
        for name, info in found.items():
            paper = f"  [{info['paper']}]" if info["paper"] else ""
            print(f"  {name.ljust(width)}  {info['description']}{paper}")
    return 0
