"""``python -m cmbench check``: the contract check of the configured method, from the command line."""

from __future__ import annotations

import pytest
import torch

from cmbench.cli import check as check_command
from cmbench.cli.main import main
from cmbench.method_check import CheckResult


@pytest.fixture
def recorded(monkeypatch):
    """Replace the contract check by a recorder of what it was given (and the torch threads it ran on)."""
    seen: dict = {}

    def fake(method, **kwargs):
        seen.update(method=method, threads=torch.get_num_threads(), **kwargs)
        return [CheckResult("builds", True, "ok")]

    monkeypatch.setattr(check_command, "check_method", fake)
    return seen


def test_check_runs_on_the_threads_every_command_runs_on(recorded, capsys):
    """``threads`` is set once for every command (cli/base.py): null leaves torch's default, a number sets it."""
    torch.set_num_threads(2)
    assert main(["check", "method=fullkv", "threads=null"]) == 0
    assert recorded["threads"] == 2
    assert main(["check", "method=fullkv", "threads=3"]) == 0
    assert recorded["threads"] == 3
    assert "1 of 1 checks passed" in capsys.readouterr().out
