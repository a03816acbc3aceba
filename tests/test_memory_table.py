"""docs/real_backbones.md's memory table says what ``python -m cmbench plan`` prints for each of its rows.

``scripts/memory_table.py`` writes the table; this test runs the ``plan`` command the docs give for every
row and compares what it prints with the row, so a table computed another way than ``plan`` (another
quantity under the same name, another method setting behind the same label) cannot stay in the docs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cmbench.backbones.memory.targets import DOCUMENTED, TARGETS
from cmbench.cli.main import main

DOCS = Path(__file__).resolve().parents[1] / "docs" / "real_backbones.md"
COMMAND = ("plan", "scorer=owl_sam_dino", "backbone.memory.context_seconds=60", "backbone.memory.offloads=off")


def table() -> tuple[list[str], dict[str, list[str]]]:
    """The memory table's header and its rows by their first cell."""
    text = DOCS.read_text()
    lines = text[text.index("| backbone + method |"):].split("\n\n")[0].splitlines()
    cells = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in lines]
    return cells[0], {row[0]: row for row in cells[2:]}


def shown(out: str) -> dict[str, str]:
    """What a row shows, from ``plan``'s output: weights, the continuation's prefilled and task KV, the peak
    phase, and each reference machine's line."""
    lines = out.splitlines()
    weights = re.search(r"DiT ([\d.]+) GiB .*; text encoder ([\d.]+) GiB", out)
    continuation = next(line for line in lines if line.startswith("  continuation "))
    peak = next(line for line in lines if line.endswith("<- peak")).split()
    prefilled, task = (re.search(rf"{part} ([\d.]+)", continuation) for part in ("prefilled KV", "task KV"))
    assert weights and prefilled and task, out
    found = {"backbone + method": lines[0].split(": ")[0], "DiT / text enc. (GiB)": f"{weights[1]} / {weights[2]}",
             "prefilled KV (GiB)": prefilled[1], "task KV (GiB)": task[1], "peak, as configured (GiB)":
             f"{peak[1]} ({peak[0]})"}
    for target in TARGETS:
        prefix = re.compile(rf"  {re.escape(target.name)}( per rank)?: ")  # a split plan's one-GPU machines: per rank
        found[target.name] = next(prefix.sub("", line, count=1) for line in lines if prefix.match(line))
    return found


@pytest.mark.parametrize("backbone, method", DOCUMENTED, ids=[" ".join((b, *m)) for b, m in DOCUMENTED])
def test_each_row_is_what_plan_prints(capsys, backbone, method):
    main([*COMMAND, f"backbone={backbone}", *method])
    plan = shown(capsys.readouterr().out)
    header, rows = table()
    assert plan["backbone + method"] in rows, f"docs/real_backbones.md has no row {plan['backbone + method']!r}"
    assert dict(zip(header, rows[plan["backbone + method"]])) == plan


def test_the_docs_give_the_command_of_every_row():
    assert f"`python -m cmbench {' '.join(COMMAND)} backbone=<backbone> <method and knobs>`" in DOCS.read_text()
