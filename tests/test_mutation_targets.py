"""The mutation target list (scripts/mutation_targets.txt) against the run identity's result code: every module
that decides a record's numbers is mutated or skipped for a stated reason, and the list names only what exists.
A planted gap (a line removed, a module in both places, a missing file) is caught on a copy of the list."""

from pathlib import Path

import pytest

from devtools import mutation_summary as summary

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "scripts" / "mutation_targets.txt"


@pytest.fixture(scope="module")
def result():
    """The modules ``cmbench/identity/code.py`` counts as result code."""
    return summary.result_modules()


def planted(tmp_path: Path, edit) -> Path:
    """A copy of the target list with its lines passed through ``edit`` (a list -> list function)."""
    copy = tmp_path / "mutation_targets.txt"
    copy.write_text("\n".join(edit(TARGETS.read_text().splitlines())) + "\n")
    return copy


def test_every_result_module_is_a_target_or_skipped_and_every_listed_file_exists(result):
    assert summary.check_targets(TARGETS, result, ROOT) == []
    assert "cmbench/cache/ledger.py" in result and "cmbench/report/leaderboard.py" not in result  # a harness module


def test_the_cli_check_passes_on_the_list(capsys):
    assert summary.main(["check", "--targets", str(TARGETS)]) == 0
    assert "every result module is a target or skipped" in capsys.readouterr().out


@pytest.mark.parametrize("module", ["cmbench/cache/store.py", "cmbench/scoring/pipeline.py"])
def test_a_removed_target_line_is_named(tmp_path, result, module):
    copy = planted(tmp_path, lambda lines: [line for line in lines if not line.startswith(module + " ")])
    problems = summary.check_targets(copy, result, ROOT)
    assert problems == [f"{copy}: {module}: result code (cmbench/identity/code.py RESULT_CODE) but neither a target "
                        "('<module> <test file>...') nor in a 'skip: <reason>' group"]
    assert summary.main(["check", "--targets", str(copy)]) == 1


def test_a_module_removed_from_its_skip_group_is_named(tmp_path, result):
    copy = planted(tmp_path, lambda lines: [line for line in lines if line.strip() != "cmbench/backbones/wan/vae.py"])
    (problem,) = summary.check_targets(copy, result, ROOT)
    assert problem.startswith(f"{copy}: cmbench/backbones/wan/vae.py: result code")


def test_a_new_result_module_must_be_placed(tmp_path):
    copy = planted(tmp_path, lambda lines: lines)
    (problem,) = summary.check_targets(copy, [*summary.result_modules(), "cmbench/cache/new_rule.py"], ROOT)
    assert problem.startswith(f"{copy}: cmbench/cache/new_rule.py: result code")


def test_a_missing_module_or_test_file_is_named(tmp_path, result):
    copy = planted(tmp_path, lambda lines: [*lines, "cmbench/cache/gone.py tests/test_cache.py tests/test_gone.py",
                                            "skip: a reason", "    cmbench/scoring/gone.py"])
    assert summary.check_targets(copy, result, ROOT) == [
        f"{copy}: cmbench/cache/gone.py: no such module", f"{copy}: cmbench/scoring/gone.py: no such module",
        f"{copy}: cmbench/cache/gone.py: no such test file tests/test_gone.py"]


def test_a_module_both_mutated_and_skipped_is_named(tmp_path, result):
    copy = planted(tmp_path, lambda lines: [*lines, "skip: planted", "    cmbench/cache/ledger.py"])
    number = len(TARGETS.read_text().splitlines()) + 2
    first = next(i for i, line in enumerate(TARGETS.read_text().splitlines(), 1)
                 if line.startswith("cmbench/cache/ledger.py "))
    assert summary.check_targets(copy, result, ROOT) == [
        f"{copy}:{number}: cmbench/cache/ledger.py: listed again (first at line {first})",
        f"{copy}: cmbench/cache/ledger.py: both a target and skipped (planted)"]


def test_re_exports_only_is_checked_against_the_code(tmp_path, result):
    copy = planted(tmp_path, lambda lines: [line for line in lines if line.strip() != "cmbench/backbones/base.py"
                                            and not line.startswith("cmbench/backbones/base.py ")]
                   + ["skip: re-exports only", "    cmbench/backbones/base.py"])
    assert summary.check_targets(copy, result, ROOT) == [
        f"{copy}: cmbench/backbones/base.py: skipped as 're-exports only' but has code beside its imports"]
    assert summary.only_reexports('"""Doc."""\nfrom a import b\n__all__ = ["b"]\n')
    assert not summary.only_reexports("from a import b\nc = b()\n")


def test_malformed_lines_are_named_with_their_line(tmp_path):
    path = tmp_path / "targets.txt"
    path.write_text("# comment\ncmbench/a.py tests/test_a.py\n    cmbench/b.py\nskip:   # no reason\n"
                    "    cmbench/c.py cmbench/d.py\ncmbench/e.py\n")
    targets, skipped, problems = summary._parse_targets(path)
    assert problems == [
        f"{path}:3: cmbench/b.py: an indented line outside a skip group, expected 'skip: <reason>' above it",
        f"{path}:4: a skip group without its reason, expected 'skip: <reason>'",
        f"{path}:5: cmbench/c.py cmbench/d.py: one module per line in a skip group",
        f"{path}:6: module cmbench/e.py: no test file, expected '<module> <test file>...'"]
    assert targets == {"cmbench/a.py": ["tests/test_a.py"]} and skipped == {}
    with pytest.raises(SystemExit, match="targets.txt:3: cmbench/b.py: an indented line"):
        summary.read_targets(path)


def test_selection_never_picks_a_skipped_module():
    targets, skipped = summary.read_targets(TARGETS), summary.read_skipped(TARGETS)
    assert skipped and not set(targets) & set(skipped)
    assert summary.select(targets, ["cmbench/backbones/wan/vae.py", "tests/test_wan_protocol.py"], False) == [
        "cmbench/backbones/base.py"]  # the target whose test file changed, not the skipped module
    assert set(summary.select(targets, [], True)) == set(targets)


def test_modules_skipped_for_having_no_function_make_no_mutant():
    file_mutation = pytest.importorskip("mutmut.mutation.file_mutation", reason="mutmut's generator (the dev extra)")
    listed = [m for m, why in summary.read_skipped(TARGETS).items() if why.startswith("no function to mutate")]
    assert listed
    for module in listed:
        _, mutations, _, _ = file_mutation.create_mutations(module, (ROOT / module).read_text())
        assert [m for m in mutations if m.contained_by_top_level_function is not None] == [], module
