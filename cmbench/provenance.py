"""What a result was made with: package versions, the git commit and the machine, written into every record."""

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


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows, else ``cpu``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def machine(device: str = "cpu") -> str:
    """Where a timing was measured: host, the CPU (or the GPU for a CUDA device) and torch's threads.

    Parameters
    ----------
    device : str
        The backbone's device (``cpu``, ``cuda``, ``cuda:1``).
    """
    import torch

    processor = f"{cpu_name()}, {torch.get_num_threads()} thread(s)"
    if str(device).startswith("cuda") and torch.cuda.is_available():
        processor = torch.cuda.get_device_name(torch.device(device))
    return f"{platform.node() or 'unknown host'} / {processor}"
