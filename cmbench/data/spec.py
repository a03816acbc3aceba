"""Dataset specs (``data_manifests/<name>.yaml``): provenance, layout and expected counts.

A spec's ``expected`` block gives the counts a complete copy of the dataset must have::

    expected:
      videos: 58
      tasks: 116
      reappear: 77
      revisit: 39
      by_source:
        synthetic: {videos: 50, tasks: 102, reappear: 67, revisit: 35}
        real:      {videos: 8,  tasks: 14,  reappear: 10, revisit: 4}
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from cmbench.data.manifest import Problem
from cmbench.data.task import Task
from cmbench.errors import ConfigError
from cmbench.shipped import shipped_dir

SPEC_DIR = shipped_dir("data_manifests")
COUNT_KEYS = ("videos", "tasks", "reappear", "revisit")


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read a dataset spec: a built-in name (``cmbench``, ``miniworld``) or the path of a yaml file."""
    path = Path(path)
    if path.suffix == "" and path.name == str(path):
        path = SPEC_DIR / f"{path}.yaml"
    if not path.is_file():
        raise ConfigError(f"dataset spec not found: {path}")
    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a dataset spec must be a mapping")
    return {str(k): v for k, v in spec.items()}


def counts(tasks: list[Task]) -> dict[str, Any]:
    """Counts in the spec's shape: totals and ``by_source``."""

    def block(group: list[Task]) -> dict[str, int]:
        types = Counter(t.task_type for t in group)
        return {
            "videos": len({t.video for t in group}),
            "tasks": len(group),
            "reappear": types["reappear"],
            "revisit": types["revisit"],
        }

    out: dict[str, Any] = block(tasks)
    out["by_source"] = {src: block([t for t in tasks if t.source == src]) for src in sorted({t.source for t in tasks})}
    return out


def check_counts(manifest: str, tasks: list[Task], expected: dict[str, Any]) -> list[Problem]:
    """Compare actual counts with a spec's ``expected`` block; one problem per mismatch."""
    got = counts(tasks)
    problems = []

    def compare(prefix: str, want: dict[str, Any], have: dict[str, Any]) -> None:
        for key in COUNT_KEYS:
            if key in want and int(want[key]) != have.get(key, 0):
                problems.append(
                    Problem(manifest, None, f"<counts>{prefix}.{key}", f"is {have.get(key, 0)}, expected {want[key]}")
                )

    compare("", expected, got)
    for source, want in (expected.get("by_source") or {}).items():
        compare(f".{source}", want, got["by_source"].get(source, {}))
    return problems
