"""No module of cmbench/ imports from a layer above its own (docs/architecture.md's Layers table).

Every import statement counts, at module level and inside functions alike (lazy imports are still
dependencies); ``if TYPE_CHECKING:`` blocks too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cmbench"

PENDING: dict[tuple[str, str], str] = {}
"""Known violations being removed, with the reason (none today); the test fails once one is gone, so the
entry is deleted with it."""


def layers() -> dict[str, int]:
    """``unit -> layer`` from the Layers table (1 is the top)."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in text.splitlines():
        row = re.match(r"^\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row:
            for unit in re.findall(r"`([^`]+)`", row.group(2)):
                out[unit] = int(row.group(1))
    return out


def unit_of(module: str) -> str:
    """``cmbench.runs.evaluator`` -> ``runs``; ``cmbench.spec`` -> ``spec``; ``cmbench`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``cmbench`` import in a file (relative imports resolved)."""
    own = module_name(path).split(".")
    package = own if path.name == "__init__.py" else own[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            name = ".".join(p for p in (base, node.module or "") if p)
            out.append((node.lineno, name))
            out += [(node.lineno, f"{name}.{a.name}") for a in node.names if node.module is None]
    return [(line, name) for line, name in out if name == "cmbench" or name.startswith("cmbench.")]


def upward_imports() -> tuple[list[str], set[tuple[str, str]]]:
    """(violations as ``file:line: a (layer i) imports b (layer j)``, the pending pairs seen)."""
    table = layers()
    problems, pending_seen = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(module_name(path))
        if source not in table:
            problems.append(f"{path.relative_to(ROOT)}: {source} is in no layer of docs/architecture.md")
            continue
        for line, name in imported(path):
            target = unit_of(name)
            if target == "__init__" or target == source:
                continue
            if target not in table:
                problems.append(f"{path.relative_to(ROOT)}:{line}: imports {name}, which is in no layer")
            elif table[target] < table[source]:
                if (source, target) in PENDING:
                    pending_seen.add((source, target))
                    continue
                problems.append(f"{path.relative_to(ROOT)}:{line}: {source} (layer {table[source]}) imports {name} "
                                f"(layer {table[target]})")
    return problems, pending_seen


def test_no_module_imports_from_a_higher_layer():
    problems, pending_seen = upward_imports()
    assert not problems, "upward imports:\n" + "\n".join(problems)
    gone = set(PENDING) - pending_seen
    assert not gone, f"no longer needed, delete from PENDING: {sorted(gone)}"


def test_every_package_and_top_level_module_has_a_layer():
    table = layers()
    units = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert units - set(table) == set(), f"not in docs/architecture.md's Layers table: {sorted(units - set(table))}"


def test_the_parser_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "cmbench" / "cache"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("def f():\n    from cmbench.runs import records\n    from ..methods import base\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert [n for _, n in imported(pkg / "x.py")] == ["cmbench.runs", "cmbench.methods"]


def module_graph(root: Path | None = None) -> dict[str, set[str]]:
    """``module -> the cmbench modules it imports`` (every import statement, lazy ones too). ``from a import b``
    points at module ``a.b`` when that is a module of the package, else at ``a``; a package's ``__init__`` is
    the package's own name."""
    root = ROOT if root is None else root
    package = root / "cmbench"
    modules = {".".join(p.relative_to(root).with_suffix("").parts[:-1] if p.name == "__init__.py"
                        else p.relative_to(root).with_suffix("").parts): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own = name.split(".")
        base_parts = own if path.name == "__init__.py" else own[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(base_parts[: len(base_parts) - node.level + 1]) if node.level else ""
                stem = ".".join(p for p in (base, node.module or "") if p)
                for alias in node.names:
                    targets.add(f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_chain_comes_back_to_where_it_started():
    found = cycles(module_graph())
    assert not found, "import cycles (a module reaches itself through these):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_sees_a_lazy_cycle_through_a_from_import(tmp_path):
    """A planted circle as the leaderboard and the backbone gate once had: one side imports the other lazily."""
    report = tmp_path / "cmbench" / "report"
    report.mkdir(parents=True)
    (tmp_path / "cmbench" / "__init__.py").write_text("")
    (report / "__init__.py").write_text("from cmbench.report.board import write\n")
    (report / "board.py").write_text("def write():\n    from cmbench.report import gate\n")
    (report / "gate.py").write_text("from cmbench.report.board import write\nfrom . import text\n")
    (report / "text.py").write_text("X = 1\n")
    graph = module_graph(tmp_path)
    assert graph["cmbench.report.gate"] == {"cmbench.report.board", "cmbench.report.text"}
    assert cycles(graph) == [["cmbench.report.board", "cmbench.report.gate"]]
    (report / "board.py").write_text("def write():\n    pass\n")
    assert cycles(module_graph(tmp_path)) == []
