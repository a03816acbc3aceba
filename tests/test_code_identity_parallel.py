"""The sequence-parallel split decides numbers: editing what ``cmbench/parallel`` does changes the code hash
every record carries (so a rerun recomputes its records), while an edit to the harness or to a parallel
module's docstrings and comments does not.

The hash is taken over a copy of part of the package's sources (``PACKAGE_ROOT`` pointed at it: the
``parallel`` and ``cli`` folders and ``hashing.py``, each in its place), edited there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cmbench.identity import code as identity

REAL_ROOT = identity.PACKAGE_ROOT


@pytest.fixture
def package(tmp_path, monkeypatch) -> Path:
    """A copy of the package's ``parallel`` and ``cli`` sources and ``hashing.py``, which the code hash reads
    instead of the installed package.

    Returns
    -------
    Path
        The copy's root (the counterpart of ``cmbench/``).
    """
    root = tmp_path / "cmbench"
    for folder in ("parallel", "cli"):
        shutil.copytree(REAL_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REAL_ROOT / "hashing.py", root / "hashing.py")
    monkeypatch.setattr(identity, "PACKAGE_ROOT", root)
    return root


def edit(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in ``path`` by ``new``.

    Parameters
    ----------
    path : Path
    old, new : str
    """
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} is not once in {path}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_every_parallel_module_is_result_code():
    """Each module of ``cmbench/parallel`` is declared result code, none harness."""
    modules = [m for m in identity.package_modules() if m.startswith("parallel/")]
    assert "parallel/sequence.py" in modules and "parallel/split.py" in modules
    assert {m: identity.code_role(m) for m in modules} == {m: "result" for m in modules}


def test_changing_how_the_sequence_split_gathers_changes_the_code_hash(package):
    """Gathering the shards along another axis is another computation: the code hash changes."""
    before = identity.cmbench_code_hash()
    edit(package / "parallel" / "sequence.py", "torch.stack(parts, 0)", "torch.stack(parts, 1)")
    assert identity.cmbench_code_hash() != before


@pytest.mark.parametrize("module", ["parallel/split.py", "parallel/cache.py", "parallel/__init__.py"])
def test_code_added_to_any_parallel_module_changes_the_code_hash(package, module):
    before = identity.cmbench_code_hash()
    with open(package / module, "a", encoding="utf-8") as handle:
        handle.write("\nSPLIT_CHANGED = 2\n")
    assert identity.cmbench_code_hash() != before


def test_a_parallel_docstring_or_comment_and_a_harness_edit_keep_the_code_hash(package):
    """A comment and a docstring in the split, and code in the command line, change no number: the hash
    stays."""
    before = identity.cmbench_code_hash()
    sequence = package / "parallel" / "sequence.py"
    edit(sequence, '"""Every rank\'s shard back in token order', '"""All the shards back in token order')
    with open(sequence, "a", encoding="utf-8") as handle:
        handle.write("\n# a note for readers\n")
    with open(package / "cli" / "run.py", "a", encoding="utf-8") as handle:
        handle.write("\nHARNESS_CHANGED = 1\n")
    assert identity.cmbench_code_hash() == before
