"""``python -m cmbench validate``: check a manifest and its videos, listing every problem.

Each problem prints as ``file:line: field: what is wrong``; the official counts (58 videos, 116 tasks)
are checked against the dataset spec unless ``data.check_counts=false``; the dataset's adapter adds
its own checks (MiniWorld: the npz files every row names, read as ``run`` reads them), and every
named task subset drawn from the dataset under the suite's settings (``data_manifests/subsets/``) must
name only its valid tasks. The summary counts only the rows without any problem, and says how many rows
had problems. Exit 0 when clean.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from cmbench.data.adapter import build_adapter
from cmbench.data.manifest import rows_with_problems, validate_manifest
from cmbench.data.spec import check_counts, counts, load_spec
from cmbench.data.subsets import check_subset, subsets_of


def execute(cfg: DictConfig) -> int:
    """Validate ``cfg.data``'s manifest and videos; print every problem. Exit 0 when clean."""
    data = cfg.data
    root = Path(str(data.root))
    open_files = bool(data.get("check_videos", True))
    tasks, problems = validate_manifest(root, str(data.manifest), check_videos=open_files)
    readable = not any(p.field == "<file>" for p in problems)
    problems += build_adapter(data).problems(tasks, open_files=open_files)
    if readable and data.get("spec") and data.get("check_counts", True):
        expected = load_spec(str(data.spec)).get("expected")
        if expected:
            problems += check_counts(str(root / str(data.manifest)), tasks, expected)
    if readable and data.get("check_counts", True):  # a complete manifest: every subset drawn from it must be in it
        known = {t.task_id for t in tasks}
        for subset in subsets_of(str(data.name)):
            if subset.mismatch(data) is None:
                problems += check_subset(subset, known)
    bad_rows = rows_with_problems(problems, root / str(data.manifest))
    got = counts([t for t in tasks if t.line not in bad_rows])
    summary = f"{got['tasks']} valid task(s) over {got['videos']} video(s) ({got['reappear']} reappear, {got['revisit']} revisit)"
    if problems:
        print(f"{data.name}: {len(problems)} problem(s) in {root / str(data.manifest)}", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        print(f"{data.name}: {summary}; {len(bad_rows)} row(s) with problems", file=sys.stderr)
        return 1
    by_source = ", ".join(f"{s}: {c['tasks']} tasks / {c['videos']} videos" for s, c in got["by_source"].items())
    print(f"{data.name}: OK, {summary}; {by_source}")
    return 0
