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


def test_check_refuses_what_run_refuses_in_the_same_one_line(recorded, capsys):
    """The config is resolved as ``run`` resolves it: a bad knob of any group (the method's, the loop's, the
    check's own sizes) is one line on stderr before anything is checked."""
    from cmbench.api import compose_config
    from cmbench.errors import ConfigError
    from cmbench.spec import resolve_run

    with pytest.raises(ConfigError) as refused:
        resolve_run(compose_config("decoprune", ["method.gamma=abc"]))
    for args, message in ((["method=decoprune", "method.gamma=abc"], str(refused.value)),
                          (["method=fullkv", "generation.timesteps=[0]"], "generation.timesteps=[0]: expected a list"),
                          (["method=fullkv", "check.context_chunks=0"], "check.context_chunks=0: expected a whole number >= 1")):
        assert main(["check", *args]) == 1
        out, err = capsys.readouterr()
        assert err.startswith(f"cmbench: error: {message}") and len(err.strip().splitlines()) == 1, err
        assert "builds" not in out and not recorded


def test_check_checks_the_method_run_would_build(recorded):
    from cmbench.methods.decoprune import DeCoPrune

    assert main(["check", "method=decoprune", "method.gamma=0.2", "generation.rope_reindex=false",
                 "check.context_chunks=8"]) == 0
    assert type(recorded["method"]) is DeCoPrune and recorded["method"].gamma == 0.2
    assert recorded["settings"].reindex is False and recorded["context_chunks"] == 8 and recorded["seed"] == 0
