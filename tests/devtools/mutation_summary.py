"""The bookkeeping behind scripts/mutation_test.sh: which modules to mutate (and that every module the run
identity counts as result code is one, or is skipped for a stated reason), mutmut's configuration for one
module, and the score of a finished mutmut run (killed / (mutants - equivalent), with every survivor shown).

Usage (scripts/mutation_test.sh calls these; see docs/testing.md):
    python scripts/mutation_summary.py check --targets scripts/mutation_targets.txt   (every result module placed)
    python scripts/mutation_summary.py select --targets scripts/mutation_targets.txt (--all | CHANGED_FILE...)
    python scripts/mutation_summary.py tests --targets scripts/mutation_targets.txt MODULE
    python scripts/mutation_summary.py configure COPY/pyproject.toml MODULE TEST...
    python scripts/mutation_summary.py summarize COPY MODULE --equivalent FILE [--csv FILE] [--seconds S] [--tests T...]
    python scripts/mutation_summary.py survivors COPY MODULE [--equivalent FILE]   (not killed nor listed: --rerun)
    python scripts/mutation_summary.py sample COPY MODULE N [--seed S]       (N mutants drawn uniformly, for --sample)
    python scripts/mutation_summary.py table results/mutation/baseline.csv      (the markdown table of a CSV)
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

CSV_FIELDS = ["module", "tests", "mutants", "killed", "survived", "no_tests", "equivalent", "score", "seconds", "commit",
              "population"]
SAMPLE_FILE = "sample.txt"  # in a copy made with --sample: the mutants drawn, one name per line
KILLED = ("killed", "timeout", "caught by type check", "segfault")  # mutmut's statuses of a mutant the tests caught


ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/devtools/ is two folders down
SKIP = "skip:"  # "skip: <reason>" opens a group of modules not mutated, listed below it one per indented line
REEXPORTS = "re-exports only"  # a skip reason checked against the module's code (imports and __all__, nothing else)


def _parse_targets(path: Path) -> tuple[dict[str, list[str]], dict[str, str], list[str]]:
    """Read ``scripts/mutation_targets.txt``.

    Two kinds of entry: a target line ``<module> <test file>...`` and a skip group, a line
    ``skip: <reason>`` followed by the modules it excludes, one per indented line (the group ends at the
    next line that is not indented). ``#`` starts a comment; blank lines are ignored.

    Parameters
    ----------
    path : Path
        The targets file.

    Returns
    -------
    targets : dict
        Module -> its test files, in file order.
    skipped : dict
        Module -> the reason it is not mutated.
    problems : list of str
        ``file:line: ...`` for each malformed line and each module listed twice.
    """
    targets: dict[str, list[str]] = {}
    skipped: dict[str, str] = {}
    problems: list[str] = []
    seen: dict[str, int] = {}
    reason: str | None = None
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        words = line.split()
        if not words:
            continue
        where = f"{path}:{number}"
        if line[0].isspace():
            if reason is None:
                problems.append(f"{where}: {words[0]}: an indented line outside a skip group, expected "
                                f"'{SKIP} <reason>' above it")
                continue
            if len(words) > 1:
                problems.append(f"{where}: {' '.join(words)}: one module per line in a skip group")
                continue
        elif line.startswith(SKIP):
            reason = line[len(SKIP):].strip()
            if not reason:
                problems.append(f"{where}: a skip group without its reason, expected '{SKIP} <reason>'")
            continue
        else:
            reason = None
            if len(words) < 2:
                problems.append(f"{where}: module {words[0]}: no test file, expected '<module> <test file>...'")
                continue
        module = words[0]
        if module in seen:
            problems.append(f"{where}: {module}: listed again (first at line {seen[module]})")
        seen.setdefault(module, number)
        if reason is None:
            targets.setdefault(module, words[1:])
        else:
            skipped.setdefault(module, reason)
    return targets, skipped, problems


def read_targets(path: Path) -> dict[str, list[str]]:
    """``scripts/mutation_targets.txt``: module -> its test files, in file order (skipped modules left out)."""
    targets, _, problems = _parse_targets(path)
    if problems:
        sys.exit(problems[0])
    return targets


def read_skipped(path: Path) -> dict[str, str]:
    """``scripts/mutation_targets.txt``'s skip groups: module -> why it is not mutated."""
    return _parse_targets(path)[1]


def result_modules() -> list[str]:
    """The modules the run identity counts as result code (:func:`cmbench.identity.code.code_role`), as
    repository paths (``cmbench/cache/store.py``), sorted."""
    from cmbench.identity.code import code_role, package_modules

    return [f"cmbench/{m}" for m in package_modules() if code_role(m) == "result"]


def only_reexports(source: str) -> bool:
    """Whether a module's code is imports, its docstring and ``__all__`` only."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and [ast.unparse(t) for t in getattr(
                node, "targets", [getattr(node, "target", None)])] == ["__all__"]:
            continue
        return False
    return True


def check_targets(path: Path, result: list[str], root: Path) -> list[str]:
    """What is wrong with a targets file: every ``result`` module must be a target or skipped (not both),
    every listed module and test file must exist under ``root``, and a module skipped as "re-exports only"
    must be one.

    Parameters
    ----------
    path : Path
        The targets file (``scripts/mutation_targets.txt`` or a copy).
    result : list of str
        The result-code modules (:func:`result_modules`).
    root : Path
        The repository root the file's paths are relative to.

    Returns
    -------
    list of str
        One line per problem; empty when the file is complete.
    """
    targets, skipped, problems = _parse_targets(path)
    for module in result:
        if module not in targets and module not in skipped:
            problems.append(f"{path}: {module}: result code (cmbench/identity/code.py RESULT_CODE) but neither a "
                            f"target ('<module> <test file>...') nor in a '{SKIP} <reason>' group")
    for module in sorted(set(targets) & set(skipped)):
        problems.append(f"{path}: {module}: both a target and skipped ({skipped[module]})")
    for module in [*targets, *skipped]:
        if not (root / module).is_file():
            problems.append(f"{path}: {module}: no such module")
        elif skipped.get(module, "").startswith(REEXPORTS) and not only_reexports((root / module).read_text()):
            problems.append(f"{path}: {module}: skipped as '{REEXPORTS}' but has code beside its imports")
    for module, tests in targets.items():
        problems.extend(f"{path}: {module}: no such test file {t}" for t in tests if not (root / t).is_file())
    return problems


def read_equivalent(path: Path) -> dict[str, str]:
    """``results/mutation/equivalent.txt``: mutant name -> why no test can tell it from the original."""
    found: dict[str, str] = {}
    if not path.is_file():
        return found
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, reason = line.strip().partition(" ")
        if not reason.strip():
            sys.exit(f"{path}:{number}: {name}: no reason given, expected '<mutant name> <why it is equivalent>'")
        found[name] = reason.strip()
    return found


def select(targets: dict[str, list[str]], changed: list[str], everything: bool) -> list[str]:
    """Modules whose code or own test files are among ``changed`` (all of them with ``everything``)."""
    if everything:
        return list(targets)
    changed_set = set(changed)
    return [m for m, tests in targets.items() if m in changed_set or changed_set & set(tests)]


def configure(pyproject: Path, module: str, tests: list[str]) -> None:
    """Point the ``[tool.mutmut]`` table of a copy's pyproject.toml at one module and its tests."""
    keys = ("only_mutate =", "pytest_add_cli_args_test_selection =")
    lines = [line for line in pyproject.read_text().splitlines() if not line.startswith(keys)]  # a rerun's new tests
    try:
        at = lines.index("[tool.mutmut]")
    except ValueError:
        sys.exit(f"{pyproject}: no [tool.mutmut] table, expected the repository's mutmut configuration")
    extra = [f"only_mutate = {json.dumps([module])}", f"pytest_add_cli_args_test_selection = {json.dumps(tests)}"]
    pyproject.write_text("\n".join(lines[: at + 1] + extra + lines[at + 1:]) + "\n")


def _mutant_names(copy: Path, module: str) -> list[str]:
    """Every mutant mutmut generated for ``module`` in ``copy``, sorted."""
    return sorted(json.loads((copy / "mutants" / f"{module}.meta").read_text())["exit_code_by_key"])


def draw_sample(names: list[str], size: int, seed: int) -> list[str]:
    """``size`` of ``names`` drawn uniformly without replacement (all of them when there are no more), sorted:
    the same names and seed always draw the same sample."""
    if size < 1:
        sys.exit(f"mutation_summary.py: a sample needs at least one mutant, got {size}")
    return sorted(random.Random(seed).sample(sorted(names), min(size, len(names))))


def wilson_interval(killed: int, counted: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a kill rate measured on a sample of ``counted`` mutants."""
    if counted == 0:
        return 0.0, 1.0
    p = killed / counted
    centre = (p + z * z / (2 * counted)) / (1 + z * z / counted)
    half = z * math.sqrt(p * (1 - p) / counted + z * z / (4 * counted * counted)) / (1 + z * z / counted)
    return max(0.0, centre - half), min(1.0, centre + half)


def _statuses(copy: Path, module: str) -> dict[str, str]:
    """Each mutant's status (only the sampled ones in a copy made with ``--sample``); after a ``--rerun``, the
    mutants it did not run keep the status they had before it (mutmut resets them to "not checked" when the
    tests change)."""
    from mutmut.stats import status_by_exit_code

    meta = copy / "mutants" / f"{module}.meta"
    now = {n: status_by_exit_code[c] for n, c in json.loads(meta.read_text())["exit_code_by_key"].items()}
    sample_path = copy / SAMPLE_FILE
    if sample_path.is_file():
        drawn = set(sample_path.read_text().split())
        now = {n: s for n, s in now.items() if n in drawn}
    before_path = meta.with_name(meta.name + ".before")
    if not before_path.is_file():
        return now
    before = {n: status_by_exit_code[c] for n, c in json.loads(before_path.read_text())["exit_code_by_key"].items()}
    return {n: now[n] if now.get(n, "not checked") != "not checked" else before.get(n, "not checked") for n in now}


def summarize(copy: Path, module: str, equivalent: dict[str, str], out_csv: Path | None, seconds: int,
              tests: list[str], commit: str) -> int:
    """Print the score of one module's mutmut run and each unexplained survivor's diff; 1 if any survived, or if a
    mutant listed as equivalent was killed (mutmut numbers a function's mutants in order, so an edit above one
    moves its name onto another mutant, and the entry may now excuse a real survivor)."""
    statuses = _statuses(copy, module)
    killed = sum(s in KILLED for s in statuses.values())
    survivors = sorted(n for n, s in statuses.items() if s in ("survived", "no tests", "suspicious", "not checked"))
    listed = [n for n in survivors if n in equivalent]
    renumbered = sorted(n for n in equivalent if statuses.get(n) in KILLED)
    unexplained = [n for n in survivors if n not in equivalent]
    no_tests = sum(statuses[n] == "no tests" for n in survivors)
    counted = len(statuses) - len(listed)
    score = killed / counted if counted else 1.0
    population = len(_mutant_names(copy, module))
    sampled = ""
    if population > len(statuses):
        low, high = wilson_interval(killed, counted)
        sampled = f" (a uniform sample of {len(statuses)} of {population} mutants; 95% interval {low:.1%}-{high:.1%})"
    print(f"{module}: {len(statuses)} mutants, {killed} killed, {len(survivors)} survived ({no_tests} run by no test), "
          f"{len(listed)} equivalent: score {score:.1%}{sampled} in {seconds} s")
    for name in renumbered:
        print(f"  listed as equivalent but killed: {name} (is the entry in the equivalent list still this mutant?)")
    env = {**os.environ, "PYTHONPATH": ""}
    for name in unexplained:
        shown = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=copy, env=env,
                               capture_output=True, text=True)
        diff = [line for line in shown.stdout.splitlines() if line[:1] in "-+" and line[:3] not in ("---", "+++")]
        print(f"  survived ({statuses[name]}): {name}")
        for line in diff:
            print(f"      {line}")
    if out_csv is not None:
        new = not out_csv.exists()
        with out_csv.open("a", newline="") as f:
            writer = csv.DictWriter(f, CSV_FIELDS, lineterminator="\n")
            if new:
                writer.writeheader()
            writer.writerow({"module": module, "tests": " ".join(tests), "mutants": len(statuses), "killed": killed,
                             "survived": len(survivors) - len(listed), "no_tests": no_tests,
                             "equivalent": len(listed), "score": f"{score:.3f}", "seconds": seconds,
                             "commit": commit.strip(), "population": population})
    return 1 if unexplained or renumbered else 0


def table(path: Path) -> str:
    """The markdown table of a scores CSV, with a total row; a sampled module shows its sample's size out of all
    its mutants and the score's 95% interval."""
    rows = list(csv.DictReader(path.open()))
    out = ["| module | mutants | killed | survived | equivalent | score | seconds |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mutants, score = r["mutants"], f"{float(r['score']):.1%}"
        if r.get("population") and int(r["population"]) > int(r["mutants"]):
            low, high = wilson_interval(int(r["killed"]), int(r["mutants"]) - int(r["equivalent"]))
            mutants, score = f"{mutants} of {r['population']} (sample)", f"{score} ({low:.1%}-{high:.1%})"
        out.append(f"| {r['module']} | {mutants} | {r['killed']} | {r['survived']} | {r['equivalent']} | "
                   f"{score} | {r['seconds']} |")
    total = {k: sum(int(r[k]) for r in rows) for k in ("mutants", "killed", "survived", "equivalent", "seconds")}
    score = total["killed"] / max(total["mutants"] - total["equivalent"], 1)
    out.append(f"| **all measured** | {total['mutants']} | {total['killed']} | {total['survived']} | "
               f"{total['equivalent']} | {score:.1%} | {total['seconds']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check")
    p.add_argument("--targets", type=Path, required=True)
    p.add_argument("--root", type=Path, default=ROOT)
    p = sub.add_parser("select")
    p.add_argument("--targets", type=Path, required=True)
    p.add_argument("--all", action="store_true")
    p.add_argument("changed", nargs="*")
    p = sub.add_parser("tests")
    p.add_argument("--targets", type=Path, required=True)
    p.add_argument("module")
    p = sub.add_parser("configure")
    p.add_argument("pyproject", type=Path)
    p.add_argument("module")
    p.add_argument("tests", nargs="+")
    p = sub.add_parser("summarize")
    p.add_argument("copy", type=Path)
    p.add_argument("module")
    p.add_argument("--equivalent", type=Path, required=True)
    p.add_argument("--csv", type=Path)
    p.add_argument("--seconds", type=int, default=0)
    p.add_argument("--tests", nargs="*", default=[])
    p.add_argument("--commit", default="")
    p = sub.add_parser("survivors")
    p.add_argument("copy", type=Path)
    p.add_argument("module")
    p.add_argument("--equivalent", type=Path)
    p = sub.add_parser("sample")
    p.add_argument("copy", type=Path)
    p.add_argument("module")
    p.add_argument("size", type=int)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("table")
    p.add_argument("csv", type=Path)
    args = parser.parse_args(argv)
    if args.command == "check":
        problems = check_targets(args.targets, result_modules(), args.root)
        print("\n".join(problems) if problems else f"{args.targets}: every result module is a target or skipped")
        return 1 if problems else 0
    if args.command == "select":
        print("\n".join(select(read_targets(args.targets), args.changed, args.all)))
    elif args.command == "tests":
        targets = read_targets(args.targets)
        if args.module not in targets:
            sys.exit(f"{args.targets}: {args.module} is not listed, expected one of its modules (add a line for it)")
        print("\n".join(t for t in targets[args.module] if Path(t).is_file()))
    elif args.command == "configure":
        configure(args.pyproject, args.module, args.tests)
    elif args.command == "summarize":
        return summarize(args.copy, args.module, read_equivalent(args.equivalent), args.csv, args.seconds, args.tests,
                         args.commit)
    elif args.command == "survivors":
        statuses = _statuses(args.copy, args.module)
        listed = read_equivalent(args.equivalent) if args.equivalent else {}
        print("\n".join(n for n, s in statuses.items() if s not in KILLED and n not in listed))
    elif args.command == "sample":
        print("\n".join(draw_sample(_mutant_names(args.copy, args.module), args.size, args.seed)))
    else:
        print(table(args.csv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
