"""This process's resident memory, from Linux's ``/proc/self`` (current, peak, peak reset)."""

from __future__ import annotations

from pathlib import Path


def _proc_status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process to its current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_mb() -> float:
    """Current resident set size (MiB)."""
    return _proc_status_kb("VmRSS") / 1024.0


def peak_rss_mb() -> float:
    """Peak resident set size since the process started (or since :func:`reset_peak_rss`), MiB.

    Unlike ``getrusage``'s ``ru_maxrss`` of a child, it starts at ``exec``: a child forked from a
    large parent does not inherit the parent's peak.
    """
    return _proc_status_kb("VmHWM") / 1024.0
