"""The README leads to the storage formats: its command table's ``ls`` row names every config group ``ls``
lists (``storage`` too), its run examples include a quantized format whose line composes and passes the
format's checks, and it links docs/kv_formats.md."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from cmbench.api import compose_config
from cmbench.config_paths import GROUPS
from cmbench.spec import storage_spec

README = Path(__file__).resolve().parent.parent / "README.md"


def run_examples() -> list[list[str]]:
    """The overrides of each single-run ``python -m cmbench run`` line of the README's "### Runs" block."""
    block = README.read_text().split("### Runs", 1)[1].split("```", 2)[1]
    lines = [line.split("#", 1)[0] for line in block.splitlines() if line.startswith("python -m cmbench run ")]
    return [args for args in (shlex.split(line)[4:] for line in lines) if "-m" not in args]


def test_the_ls_row_names_every_group():
    row = next(line for line in README.read_text().splitlines() if line.startswith("| `ls [group]` |"))
    assert [group for group in GROUPS if f"`{group}`" not in row] == []


def test_a_run_example_stores_the_history_in_a_quantized_format_and_composes():
    quantized = [args for args in run_examples() if any(a.startswith("storage=") and a != "storage=fp" for a in args)]
    assert quantized, "no README run example with storage="
    for args in quantized:
        cfg = compose_config(overrides=args)
        fmt = storage_spec(cfg.storage, cfg.backbone)
        assert fmt is not None and fmt.name == next(a for a in args if a.startswith("storage=")).split("=")[1]


def test_the_formats_page_is_linked():
    assert re.search(r"\]\(docs/kv_formats\.md\)", README.read_text())
