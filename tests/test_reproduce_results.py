"""scripts/reproduce_results.sh: --help prints its usage and runs nothing; an unknown argument is refused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def script(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the script with PYTHON standing in for the interpreter: it only leaves a mark when called."""
    mark = tmp_path / "python_was_called"
    fake = tmp_path / "fake_python"
    fake.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "reproduce_results.sh"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    return done, mark


def test_help_prints_usage_and_runs_nothing(tmp_path):
    for flag in ("--help", "-h"):
        done, mark = script(tmp_path, flag)
        assert done.returncode == 0 and done.stdout.startswith("Usage: bash scripts/reproduce_results.sh")
        assert "EXTRA" in done.stdout and "SEEDS" in done.stdout and done.stderr == ""
        assert not mark.exists() and not (tmp_path / "out").exists()


def test_unknown_arguments_are_refused_before_anything_runs(tmp_path):
    for arg in ("--bogus", "limit=8"):
        done, mark = script(tmp_path, arg)
        assert done.returncode == 2, (arg, done.stdout, done.stderr)
        assert f"reproduce_results.sh: unknown argument {arg}" in done.stderr
        assert "--help" in done.stderr and not mark.exists()
