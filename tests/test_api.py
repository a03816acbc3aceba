"""``cmbench.evaluate``: the command line's run from Python, sharing its run directory, resume and records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

import cmbench
from cmbench.api import compose_config
from cmbench.spec import run_dir_for
from cmbench.methods.decoprune import DeCoPrune
from test_run_command import SMALL_SUITE
from test_tiny_backbone import random_model

pytestmark = pytest.mark.slow  # runs the command line in a subprocess too


@dataclass
class KeepsAll(DeCoPrune):
    """A user's method defined outside any package (here: in the test module)."""

    name = ""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    weights = tmp / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    overrides = [f"data.root={tmp / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}"]
    return tmp, overrides


PACKAGE_PARENT = str(Path(cmbench.__file__).resolve().parents[1])  # the command runs the cmbench under test


def test_python_and_the_command_line_share_runs(setup, tmp_path, monkeypatch):
    tmp, overrides = setup
    monkeypatch.chdir(tmp_path)  # works from any working directory
    out = tmp_path / "runs"
    cli = subprocess.run([sys.executable, "-m", "cmbench", "run", "method=decoprune", "limit=2", f"out_dir={out}",
                          "progress=false", *overrides], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": PACKAGE_PARENT})
    assert cli.returncode == 0, cli.stderr
    result = cmbench.evaluate(method="decoprune", limit=2, out_dir=out, overrides=overrides)
    assert isinstance(result.records, pd.DataFrame) and len(result.records) == 2
    assert result.summary["tasks_ok"] == 2 and result.run_dir.parent == out / "miniworld"
    cli_records = [json.loads(line) for line in (result.run_dir / "records.jsonl").read_text().splitlines()]
    assert len(cli_records) == 2  # resumed: nothing was run twice
    by_id = {r["task_id"]: r for r in cli_records}
    for row in result.records.itertuples():
        assert row.score == by_id[row.task_id]["score"] and row.pr == by_id[row.task_id]["pr"]


def test_a_method_as_config_or_instance_is_the_same_run(setup, tmp_path):
    _, overrides = setup
    by_config = compose_config({"name": "decoprune", "gamma": 0.2}, overrides)
    by_instance = compose_config(DeCoPrune(gamma=0.2), overrides)
    by_override = compose_config("decoprune", [*overrides, "method.gamma=0.2"])

    assert run_dir_for(by_config) == run_dir_for(by_instance) == run_dir_for(by_override)
    plugin = compose_config(KeepsAll(gamma=0.5), overrides)
    assert plugin.method["_target_"] == f"{__name__}.KeepsAll" and plugin.method.name == "keepsall"
    result = cmbench.evaluate(method=KeepsAll(gamma=0.5), limit=1, out_dir=tmp_path, overrides=overrides)
    assert len(result.records) == 1 and result.records.loc[0, "method"] == "keepsall"
    assert Path(result.run_dir).name.startswith("keepsall__")


def test_evaluate_defaults_to_the_command_lines_seed(monkeypatch, tmp_path):
    """Without ``seed=``, evaluate runs the configured seed, so its run is the command line's run."""
    from omegaconf import OmegaConf

    from cmbench.config_paths import CONFIG_DIR
    from cmbench.runs import experiment

    seen = {}

    def stop(spec):
        seen["spec"] = spec
        raise RuntimeError("composed")

    monkeypatch.setattr(experiment, "run_experiment", stop)
    with pytest.raises(RuntimeError, match="composed"):
        cmbench.evaluate(method="decoprune", limit=2, out_dir=tmp_path)
    configured = OmegaConf.load(CONFIG_DIR / "config.yaml").seed
    assert seen["spec"].selection.seed == configured
    command_line = compose_config("decoprune", [f"out_dir={tmp_path}", "limit=2"])
    assert seen["spec"].run_dir == run_dir_for(command_line)
    with pytest.raises(RuntimeError, match="composed"):
        cmbench.evaluate(method="decoprune", limit=2, out_dir=tmp_path, seed=configured + 1)
    assert seen["spec"].selection.seed == configured + 1
