"""``bash scripts/setup_venv.sh`` says what it installs before each step and lets pip show its progress;
run again, it keeps what is there. The script runs against a stand-in ``.venv`` whose ``python`` and
``pip`` only log their arguments (nothing is installed)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$(dirname "$0")/../../calls.log"
case "$*" in
  *"import torch"*) [ -f "$(dirname "$0")/../torch" ] || exit 1; echo 2.13.0 ;;
esac
"""
FAKE_PIP = """#!/usr/bin/env bash
echo "pip $*" >> "$(dirname "$0")/../../calls.log"
case "$*" in *torch==*) touch "$(dirname "$0")/../torch" ;; esac
echo "Collecting from pip itself"
"""


def checkout(tmp_path: Path) -> Path:
    """A folder with the script and a stand-in ``.venv`` (so ``python3 -m venv`` is not run)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup_venv.sh", tmp_path / "scripts")
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    for name, text in (("python", FAKE_PYTHON), ("pip", FAKE_PIP)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return tmp_path


def setup(folder: Path, *args: str) -> list[str]:
    done = subprocess.run(["bash", str(folder / "scripts" / "setup_venv.sh"), *args], capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout.splitlines()


def test_each_step_is_announced_and_pip_shows_its_progress(tmp_path):
    folder = checkout(tmp_path)
    out = setup(folder, "test")
    pip = [line for line in (folder / "calls.log").read_text().splitlines() if line.startswith("pip ")]
    assert len(pip) == 4 and not any(" -q" in call for call in pip)  # torch, CMBench, then kvpress for its tests
    assert "torch==2.13.0" in pip[0] and pip[1].endswith('install -e .[test]')
    assert pip[2] == "pip install --no-deps kvpress>=0.5.5,<0.6"  # keeps the venv's transformers
    assert pip[3].startswith("pip install --no-warn-conflicts cachetools")
    steps = [line for line in out if line.startswith("setup_venv: ")]
    assert out.index(steps[0]) < out.index("Collecting from pip itself")  # said before pip starts
    assert any("using the existing .venv" in s for s in steps)
    assert any("installing torch==2.13.0" in s for s in steps)
    assert any("installing CMBench (editable, extras: test)" in s for s in steps)
    assert any("installing kvpress for the kvpress adapter's tests" in s for s in steps)
    assert out[-1].startswith("setup_venv: done")


def test_the_main_command_installs_no_test_dependency(tmp_path):
    """README's first command (no extra): torch and CMBench only, no kvpress."""
    folder = checkout(tmp_path)
    setup(folder)
    pip = [line for line in (folder / "calls.log").read_text().splitlines() if line.startswith("pip ")]
    assert len(pip) == 2 and pip[1].endswith("install -e .") and not any("kvpress" in call for call in pip)


def test_a_second_run_keeps_torch_and_says_so(tmp_path):
    folder = checkout(tmp_path)
    setup(folder)
    out = setup(folder)
    pip = [line for line in (folder / "calls.log").read_text().splitlines() if line.startswith("pip ")]
    assert sum("torch==" in call for call in pip) == 1  # installed by the first run only
    assert any(line.startswith("setup_venv: keeping torch 2.13.0") for line in out)


def test_the_readmes_kvpress_path_is_the_scripts_and_prints_no_conflict_block(tmp_path):
    """The README's kvpress install for an existing venv is what ``setup_venv.sh test`` runs, and neither pip
    call ends with pip's "dependency conflicts" ERROR block: the first installs without dependencies, the
    second says ``--no-warn-conflicts`` (kvpress's declared transformers<5.3, pandas<3, accelerate and peft
    stay unmet on purpose: the presses CMBench runs need torch alone)."""
    folder = checkout(tmp_path)
    setup(folder, "test")
    script = [line.removeprefix("pip ") for line in (folder / "calls.log").read_text().splitlines()
              if line.startswith("pip ")][2:]
    text = " ".join((REPO / "README.md").read_text().split())
    readme = [shlex.split(call)[1:] for call in re.findall(r"`(\.venv/bin/pip install --no-deps 'kvpress[^`]*)`", text)
              [0].split(" && ")]
    assert [shlex.split(call) for call in script] == readme
    assert all("--no-deps" in call or "--no-warn-conflicts" in call for call in readme)
