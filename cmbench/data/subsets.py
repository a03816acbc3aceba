"""Named task subsets (``data_manifests/subsets/<name>.txt``): plain lists of task ids that experiments run.

A subset file names its dataset in a header line, optionally the data settings its tasks were drawn
under (``# data.<key>: <value>``: a procedural dataset such as MiniWorld builds other tasks for another
``world_seed``), and then lists one task id per line::

    # dataset: miniworld
    # data.world_seed: 0
    # A quick 16-task sample.
    syn_001_revisit_01
    syn_005_reappear_01

Blank lines and other ``#`` lines are comments. ``subset=<name>`` (or a path to such a file) selects
exactly these tasks in ``run``, and is refused in one line on data whose settings differ from the
header's; ``validate`` checks every subset drawn from the suite's dataset and settings against its
manifest, naming the file and line of each id it does not hold.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmbench.data.manifest import SAFE_TASK_ID, Problem
from cmbench.errors import ConfigError
from cmbench.shipped import shipped_dir

SUBSET_DIR = shipped_dir("data_manifests") / "subsets"
_HEADER = re.compile(r"^#\s*dataset:\s*(\S+)\s*$")
_CONDITION = re.compile(r"^#\s*data\.([A-Za-z_][A-Za-z0-9_]*):\s*(\S+)\s*$")


def _setting_text(value: object) -> str:
    """A data setting as a header writes it (``true`` / ``false`` for booleans)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Subset:
    """A named task subset.

    Attributes
    ----------
    name : str
        The file's stem.
    dataset : str
        The ``data.name`` whose manifest the ids come from.
    task_ids : tuple of str
        In file order, without repeats.
    lines : tuple of int
        The 1-based line of each id in ``path``.
    path : Path
    conditions : tuple of (str, str)
        The data settings the ids were drawn under (``data.<key>`` header lines): key and value text.
    """

    name: str
    dataset: str
    task_ids: tuple[str, ...]
    lines: tuple[int, ...]
    path: Path
    conditions: tuple[tuple[str, str], ...] = ()

    def mismatch(self, data: Mapping[str, Any]) -> str | None:
        """The first of the subset's data settings that ``data`` (a data config) does not have, said as
        ``data.<key>=<value> (its tasks come from data.<key>=<header value>)``; None when all match."""
        for key, wanted in self.conditions:
            got = _setting_text(data.get(key))
            if got.lower() != wanted.lower():
                return f"data.{key}={got} (its tasks come from data.{key}={wanted})"
        return None


def subset_path(name_or_path: str) -> Path:
    """A built-in subset's file (``data_manifests/subsets/<name>.txt``) or the path given."""
    path = Path(name_or_path)
    if path.suffix == "" and path.name == name_or_path:
        path = SUBSET_DIR / f"{name_or_path}.txt"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SUBSET_DIR.glob("*.txt"))) or "none"
        raise ConfigError(f"task subset not found: {path} (built-in subsets: {known})")
    return path


def load_subset(name_or_path: str) -> Subset:
    """Read and check a subset file (header, one well-formed id per line, no repeats).

    Raises
    ------
    ConfigError
        One line naming the file, the line and what is wrong.
    """
    path = subset_path(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the task subset ({err})") from err
    dataset = None
    ids: list[str] = []
    lines: list[int] = []
    conditions: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        header = _HEADER.match(line)
        if header:
            if dataset is not None:
                raise ConfigError(f"{path}:{number}: dataset: named twice")
            dataset = header.group(1)
            continue
        condition = _CONDITION.match(line)
        if condition:
            key, value = condition.groups()
            if key in conditions:
                raise ConfigError(f"{path}:{number}: data.{key}: named twice")
            conditions[key] = value
            continue
        if not line or line.startswith("#"):
            continue
        if not SAFE_TASK_ID.match(line):
            raise ConfigError(f"{path}:{number}: task_id: {line[:80]!r} is not a task id (letters, digits, _ . -)")
        if line in ids:
            raise ConfigError(f"{path}:{number}: task_id: {line} repeats line {lines[ids.index(line)]}")
        ids.append(line)
        lines.append(number)
    if dataset is None:
        raise ConfigError(f"{path}:1: dataset: missing header line '# dataset: <data.name>'")
    if not ids:
        raise ConfigError(f"{path}: task_id: the subset lists no task")
    return Subset(name=path.stem, dataset=dataset, task_ids=tuple(ids), lines=tuple(lines), path=path,
                  conditions=tuple(conditions.items()))


def subsets_of(dataset: str) -> list[Subset]:
    """The built-in subsets whose header names ``dataset``, by name."""
    found = (load_subset(str(p)) for p in sorted(SUBSET_DIR.glob("*.txt")))
    return [s for s in found if s.dataset == dataset]


def check_subset(subset: Subset, known_task_ids: set[str]) -> list[Problem]:
    """One problem (file, line, field, reason) per id of ``subset`` that the manifest does not hold."""
    return [
        Problem(str(subset.path), line, "task_id", f"{task_id} is not in the {subset.dataset} manifest")
        for task_id, line in zip(subset.task_ids, subset.lines)
        if task_id not in known_task_ids
    ]
