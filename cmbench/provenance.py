"""What a result was made with: package versions and the git commit, written into every record."""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("cmbench", "torch", "transformers", "diffusers", "numpy", "opencv-python-headless")
REPO = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """Installed versions of the packages that change numbers, plus Python's."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """HEAD of the CMBench checkout, with ``-dirty`` when tracked files changed; ``unknown`` for an installed
    wheel or outside git."""
    if not (REPO / ".git").exists() or not (REPO / "pyproject.toml").is_file():
        return "unknown"  # an installed wheel: never report the commit of whatever repository surrounds it
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if head.returncode:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
