"""docs/architecture.md names every top-level folder and every package module (its Layout block)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cmbench"


def layout_entries(text: str) -> tuple[set[str], dict[str, str]]:
    """(top-level folders named, package entry -> its text) from the Layout section's code block.

    A package entry is a line indented two spaces under ``cmbench/`` whose first token is a folder
    (``runs/``, ``backbones/wan/``) or a module (``api.py``); its text runs to the next entry.
    """
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    top: set[str] = set()
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line and not line.startswith(" "):
            top.update(t.rstrip("/") for t in line.split() if t.endswith("/"))
            current = None
        elif re.match(r"^  \S", line):
            token, _, rest = line.strip().partition(" ")
            current = token
            entries[current] = rest
        elif current is not None:
            entries[current] += " " + line.strip()
    return top, entries


def missing_names() -> list[str]:
    top, entries = layout_entries((ROOT / "docs" / "architecture.md").read_text())
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folders = {p.split("/", 1)[0] for p in tracked if "/" in p}
    missing = [f"top-level folder {f}/" for f in sorted(folders - top)]
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if "__pycache__" in rel.parts or (rel.name == "__init__.py" and len(rel.parts) > 1):
            continue
        if len(rel.parts) == 1:
            named = rel.name in entries
        else:
            folder = "/".join(rel.parts[:-1]) + "/"
            named = bool(re.search(rf"(?<![\w/]){re.escape(rel.name)}", entries.get(folder, "")))
        if not named:
            missing.append(f"module cmbench/{rel.as_posix()}")
    return missing


def test_architecture_page_names_every_top_level_folder_and_package_module():
    missing = missing_names()
    assert not missing, "docs/architecture.md's Layout does not name: " + ", ".join(missing)


def test_the_check_sees_a_module_the_page_does_not_name(tmp_path):
    """The parser finds entries and their modules; a module absent from its folder's entry is missing."""
    text = "## Layout\n```\ncmbench/\n  runs/  experiment.py, runner.py\n           evaluator.py\n  api.py  x\n```\n"
    top, entries = layout_entries(text)
    assert top == {"cmbench"}
    assert set(entries) == {"runs/", "api.py"} and "evaluator.py" in entries["runs/"]
    assert not re.search(r"(?<![\w/])records\.py", entries["runs/"])


def scripts_imported_by_path(test_files: list[Path]) -> list[str]:
    """Test files that load a module from scripts/ by its path (what a test checks belongs in the package; a
    script is run as a command)."""
    found = []
    for path in test_files:
        text = path.read_text()
        if re.search(r"spec_from_file_location\([^)]*(scripts|SCRIPT)", text) or re.search(r"run_path\([^)]*scripts", text):
            found.append(path.name)
    return found


def test_no_test_imports_a_script_by_its_path(tmp_path):
    tests = [p for p in sorted((ROOT / "tests").glob("test_*.py")) if p.name != Path(__file__).name]  # not this check
    assert scripts_imported_by_path(tests) == []
    planted = tmp_path / "test_planted.py"
    planted.write_text('SCRIPT = ROOT / "scripts" / "x.py"\nspec = importlib.util.spec_from_file_location("x", SCRIPT)\n')
    assert scripts_imported_by_path([planted]) == ["test_planted.py"]
