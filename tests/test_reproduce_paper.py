"""scripts/reproduce_paper.sh: --help runs nothing, and a run writes only under its --out unless told otherwise."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "results" / "paper_findings.md"


def script(*args: str, cwd: Path = ROOT, timeout: float = 1800) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(["bash", str(ROOT / "scripts" / "reproduce_paper.sh"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_help_prints_usage_and_runs_nothing(tmp_path):
    before = digest(COMMITTED)
    for flag in ("--help", "-h"):
        done = script(flag, "--out", str(tmp_path / "out"))
        assert done.returncode == 0 and done.stdout.startswith("Usage: bash scripts/reproduce_paper.sh")
        assert "--limit N" in done.stdout and "--results FILE" in done.stdout and done.stderr == ""
    assert not (tmp_path / "out").exists() and digest(COMMITTED) == before


def test_bad_options_are_refused_in_one_line(tmp_path):
    for args, message in ((["--bogus"], "unknown option --bogus"), (["--limit", "x"], "--limit needs a positive"),
                          (["--worlds", "5"], "--worlds takes 0 and 2")):
        done = script(*args, "--out", str(tmp_path / "out"), "--only", "gate")
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_quick_run_writes_its_table_under_its_out_folder(tmp_path):
    """The gate finding on one task in the reference world: the estimate is printed before the step, the table
    lands in <out>/paper_findings.md, the committed one is untouched, --evidence copies records, no videos."""
    before = digest(COMMITTED)
    out, evidence = tmp_path / "out", tmp_path / "evidence"
    done = script("--out", str(out), "--only", "gate", "--worlds", "0", "--limit", "1", "--evidence", str(evidence))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== world 0: gate: 2 run(s) x 1 task(s) + 0 calibration(s): about 2 task runs" in done.stderr
    table = (out / "paper_findings.md").read_text()
    assert "a quick look: every run on 1 tasks" in table and "| 6 | Backbone gate |" in table
    assert digest(COMMITTED) == before
    copied = sorted(p.relative_to(evidence).as_posix() for p in evidence.rglob("*") if p.is_file())
    assert any(p.endswith("records.jsonl") for p in copied) and not any("videos" in p for p in copied)
