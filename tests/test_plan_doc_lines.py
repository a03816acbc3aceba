"""docs/real_backbones.md's "Running" section: its first ``plan`` line is run with the memory table's settings,
so it prints the row the table beside it shows; a plan split over ranks names its single-GPU machines per
rank (a 4-rank run never "fits one H200": each of its ranks fits one)."""

from __future__ import annotations

import shlex

from test_memory_table import DOCS, shown, table

from cmbench.backbones.memory.targets import TARGETS
from cmbench.cli.main import main


def running_plan_lines() -> list[list[str]]:
    """The ``python -m cmbench plan`` commands of the "Running" section's code block, as argument lists."""
    section = DOCS.read_text().split("## Running", 1)[1].split("```", 2)[1].replace("\\\n", " ")
    return [shlex.split(line)[3:] for line in section.splitlines() if line.startswith("python -m cmbench plan ")]


def test_the_first_plan_line_prints_its_row_of_the_table(capsys):
    first = running_plan_lines()[0]
    main(first)
    plan = shown(capsys.readouterr().out)
    header, rows = table()
    assert plan["backbone + method"] in rows, plan["backbone + method"]
    assert dict(zip(header, rows[plan["backbone + method"]])) == plan


def test_a_split_plan_names_its_single_gpu_machines_per_rank(capsys):
    main(["plan", "scorer=owl_sam_dino", "backbone.memory.context_seconds=60", "backbone=lingbot_world_v2_14b",
          "method=decoprune", "parallel.sequence=4"])
    lines = capsys.readouterr().out.splitlines()
    machines = lines[next(i for i, line in enumerate(lines) if line.startswith("reference machines")) + 1:]
    for target in TARGETS:
        line = next(line for line in machines if line.startswith(f"  {target.name}"))
        if target.processes == 1:
            assert line.startswith(f"  {target.name} per rank: "), line
        else:
            assert line.startswith(f"  {target.name}: "), line


def test_an_unsplit_plan_names_the_machines_plainly(capsys):
    main(["plan", "backbone=lingbot_world_v2_14b", "method=decoprune"])
    out = capsys.readouterr().out
    assert all(f"\n  {target.name}: " in out for target in TARGETS) and " per rank" not in out
