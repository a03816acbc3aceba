"""Optional experiment-tracker logging (``logging.wandb``): off by default (wandb never imported), each task
logged as it finishes with the run's table and summary at the end, refusals in one line before any task
runs. A stand-in ``wandb`` module records the calls; with wandb installed, a real offline run is checked too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cmbench.cli.main import main
from cmbench.errors import ConfigError
from cmbench.runs.records import read_all_records
from cmbench.runs.tracking import TABLE_COLUMNS, tracker_settings
from test_run_command import SMALL_SUITE

pytestmark = pytest.mark.slow  # real runs of the tiny model


@pytest.mark.parametrize("value, settings", [
    (None, None), ({"wandb": None}, None), ({"wandb": False}, None), ({"wandb": True}, {}),
    ({"wandb": "proj"}, {"project": "proj"}),
    ({"wandb": {"project": "p", "mode": "offline", "tags": ["a"]}}, {"project": "p", "mode": "offline", "tags": ["a"]}),
])
def test_settings(value, settings):
    assert tracker_settings(value) == settings


@pytest.mark.parametrize("value, message", [
    ({"mlflow": "x"}, "logging.mlflow: not a tracker"),
    ({"wandb": {"projet": "p"}}, "logging.wandb.projet: not a setting"),
    ({"wandb": {"mode": "sometimes"}}, "logging.wandb.mode='sometimes': expected one of online, offline, disabled"),
    ({"wandb": {"tags": "a"}}, "logging.wandb.tags='a': expected a list"),
    ({"wandb": 3}, "logging.wandb=3: expected a project name"),
])
def test_bad_settings_are_one_line(value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")) as err:
        tracker_settings(value)
    assert "\n" not in str(err.value)


class FakeWandb:
    """What a run asks of wandb: ``init``'s arguments, each ``log``, the summary, ``finish``'s exit code."""

    def __init__(self):
        self.inits: list[dict] = []
        self.logged: list[dict] = []
        self.summary: dict = {}
        self.finished: list[int] = []

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return SimpleNamespace(log=self.logged.append, summary=self.summary,
                               finish=lambda exit_code=0: self.finished.append(exit_code))

    @staticmethod
    def Table(columns, data):  # noqa: N802 (wandb's name)
        return SimpleNamespace(columns=columns, data=data)


@pytest.fixture(scope="module")
def suite_and_weights(tmp_path_factory):
    from test_tiny_backbone import random_model

    tmp = tmp_path_factory.mktemp("tracking")
    weights = tmp / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    assert main(["prepare", "data=miniworld", f"data.root={tmp / 'suite'}", *SMALL_SUITE,
                 "data.check_counts=false"]) == 0
    return tmp, weights


def run(capsys, setup, out: Path, *args: str) -> subprocess.CompletedProcess:
    tmp, weights = setup
    capsys.readouterr()
    code = main(["run", f"data.root={tmp / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}", f"out_dir={out}",
                 "progress=false", "method=streaming", "limit=2", *args])
    printed = capsys.readouterr()
    return subprocess.CompletedProcess([], code, printed.out, printed.err)


def test_off_by_default_wandb_is_never_imported(suite_and_weights, tmp_path, capsys, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    assert run(capsys, suite_and_weights, tmp_path / "runs").returncode == 0
    assert fake.inits == [] and fake.logged == []


def test_each_task_then_the_table_and_summary_are_logged(suite_and_weights, tmp_path, capsys, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    done = run(capsys, suite_and_weights, tmp_path / "runs", "logging.wandb=myproj", "label=mine")
    assert done.returncode == 0, done.stderr
    (run_dir,) = [p for p in (tmp_path / "runs" / "miniworld").iterdir() if p.is_dir()]
    records = read_all_records(run_dir)
    (init,) = fake.inits
    assert init["project"] == "myproj" and init["name"] == "mine" and init["group"] == records[0]["setup_hash"]
    assert init["config"]["method"]["name"] == "streaming"
    per_task = [entry for entry in fake.logged if "task/score" in entry]
    assert [e["task/index"] for e in per_task] == [0, 1]
    assert sorted(e["task/pr"] for e in per_task) == sorted(r["pr"] for r in records)
    (table,) = [entry["tasks"] for entry in fake.logged if "tasks" in entry]
    assert table.columns == list(TABLE_COLUMNS)
    assert sorted(row[0] for row in table.data) == sorted(r["task_id"] for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert fake.summary["score"] == summary["score"] and fake.summary["pr"] == summary["pr"]
    assert fake.summary["tasks_ok"] == 2 and fake.finished == [0]
    again = run(capsys, suite_and_weights, tmp_path / "runs", "logging.wandb=myproj", "label=mine")
    assert again.returncode == 0 and len(fake.inits) == 2
    assert fake.summary["tasks_ok"] == 2  # a resumed run: its tasks were kept, its summary still the run's


def test_wandb_missing_is_one_line_before_any_task(suite_and_weights, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    done = run(capsys, suite_and_weights, tmp_path / "runs", "logging.wandb=true")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "wandb is not installed" in lines[0] and "cmbench[tracking]" in lines[0], done.stderr
    assert not list((tmp_path / "runs").rglob("records*.jsonl"))


def test_a_real_offline_run(suite_and_weights, tmp_path, capsys, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    done = run(capsys, suite_and_weights, tmp_path / "runs", f"logging.wandb={{project: p, dir: '{tmp_path}'}}")
    assert done.returncode == 0, done.stderr
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    (table,) = offline.glob("files/media/table/tasks_*.table.json")
    rows = json.loads(table.read_text())
    assert rows["columns"] == list(TABLE_COLUMNS) and len(rows["data"]) == 2
