"""From a laptop to a cluster with the same command: a Slurm array's tasks are shards, a sweep under any
Hydra launcher fails when a job fails and still ends with its board, a job with a process of its own ends
it with its exit status, and a host whose clock is behind cannot reorder a task's records."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from cmbench.cli.run import board_later
from cmbench.errors import ConfigError
from cmbench.runs.records import RecordWriter, latest_records, read_task_records
from cmbench.spec import shard_from_env
from test_run_command import REPO, cmbench, setup  # noqa: F401  (setup: a fixture)
from test_runner_units import Scripted, _run, _task

ARRAY = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP",
         "SLURM_ARRAY_JOB_ID", "WORLD_SIZE", "RANK")


def plugin(name: str):
    """Skip without the launcher's Hydra plugin (the ``test`` and ``slurm`` extras install both)."""
    return pytest.mark.skipif(importlib.util.find_spec(f"hydra_plugins.{name}") is None,
                              reason=f"{name} is not installed (pip install -e '.[test]')")


@pytest.fixture
def env(monkeypatch):
    """Set launcher variables (all start unset)."""
    for name in ARRAY:
        monkeypatch.delenv(name, raising=False)

    def set_env(**values: int) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, str(value))

    return set_env


def test_a_slurm_array_task_is_a_shard_as_a_torchrun_rank_is(env):
    env(SLURM_ARRAY_TASK_ID=3, SLURM_ARRAY_TASK_COUNT=8, SLURM_ARRAY_TASK_MIN=0)
    assert shard_from_env(1, 0) == (8, 3)
    env(SLURM_ARRAY_TASK_ID=5, SLURM_ARRAY_TASK_COUNT=4, SLURM_ARRAY_TASK_MIN=2)  # --array=2-5
    assert shard_from_env(1, 0) == (4, 3)
    env(SLURM_ARRAY_TASK_ID=14, SLURM_ARRAY_TASK_COUNT=8, SLURM_ARRAY_TASK_MIN=0, SLURM_ARRAY_TASK_STEP=2)
    assert shard_from_env(1, 0) == (8, 7)  # --array=0-14:2
    assert shard_from_env(1, 0, array=False) == (1, 0)  # an array of seeds, not shards
    env(WORLD_SIZE=4, RANK=3)  # each array task a torchrun job of 2 models of 2 ranks: 16 shards
    assert shard_from_env(1, 0, sequence=2) == (16, 15)


def test_a_configured_shard_and_an_array_both_sharding_or_an_id_off_the_range_is_one_line(env):
    env(SLURM_ARRAY_TASK_ID=1, SLURM_ARRAY_TASK_COUNT=2)
    with pytest.raises(ConfigError, match=r"^shard.count=3 and the Slurm array's 2 tasks \(SLURM_ARRAY_TASK_COUNT\) "
                                          r"both shard the tasks: set one of them; an array that runs other settings"):
        shard_from_env(3, 0)
    env(SLURM_ARRAY_TASK_ID=8, SLURM_ARRAY_TASK_COUNT=3, SLURM_ARRAY_TASK_MIN=1)  # --array=1,3,8: listed ids
    with pytest.raises(ConfigError, match=r"^Slurm array task 8 is not on the array's range \(3 tasks from 1"):
        shard_from_env(1, 0)
    env(SLURM_ARRAY_TASK_ID="x")
    with pytest.raises(ConfigError, match="Slurm array variables"):
        shard_from_env(1, 0)


def test_an_array_task_names_the_command_that_builds_the_board_later(env):
    cfg = OmegaConf.create({"data": {"name": "cmbench"}, "out_dir": "/shared/runs", "shard": {"count": 1}})
    assert board_later(cfg, 4) is None  # not in an array: whoever sharded it waits for it
    env(SLURM_ARRAY_TASK_ID=0, SLURM_ARRAY_TASK_COUNT=4, SLURM_ARRAY_JOB_ID=777)
    line = board_later(cfg, 4)
    assert line == ("board: once every task of Slurm array 777 has ended: python -m cmbench leaderboard data=cmbench "
                    "out_dir=/shared/runs (or submit it to run then: sbatch --dependency=afterany:777 --wrap "
                    "'python -m cmbench leaderboard data=cmbench out_dir=/shared/runs')")
    assert board_later(cfg, 1) is None
    cfg.shard.slurm_array = False
    assert board_later(cfg, 4) is None


def test_a_retry_on_a_host_whose_clock_is_behind_still_wins(tmp_path):
    """Shard 0 of 2 ran on a host whose clock was an hour ahead and failed task a; the retry (one process)
    runs on a host with the right time: its record must still be a's latest."""
    ahead = time.time_ns() + 3600 * 10**9
    writer = RecordWriter(tmp_path / "records.shard-0-of-2.jsonl", after_ns=ahead)
    writer.write({"task_id": "a", "status": "failed", "code_hash": None})
    assert read_task_records(tmp_path)[0].recorded_ns > ahead
    _run([_task("a", "ca")], Scripted(), tmp_path)
    latest = latest_records(read_task_records(tmp_path))
    assert latest["a"].status == "ok"


def record_job_exit(tmp_path, launcher: str, code: int) -> subprocess.CompletedProcess:
    """A job as a launcher runs it: its Hydra config, then ``record_job``; the process's exit status."""
    script = f"""
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict
from cmbench.cli.sweep import record_job
from cmbench.config_paths import CONFIG_DIR
with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
    cfg = compose("config", overrides=["hydra/launcher={launcher}"], return_hydra_config=True)
with open_dict(cfg):
    cfg.hydra.runtime.output_dir = {str(tmp_path)!r}
    cfg.hydra.job.num = 4
HydraConfig.instance().set_config(cfg)
record_job(OmegaConf.create({{"seed": 2}}), {code})
print("returned")
"""
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)


@plugin("hydra_submitit_launcher")
@plugin("hydra_joblib_launcher")
@pytest.mark.parametrize("launcher, code, status", [("submitit_local", 3, 3), ("submitit_local", 0, 0),
                                                     ("joblib", 3, 0), ("basic", 1, 0)])
def test_a_job_with_a_process_of_its_own_ends_it_with_its_status(tmp_path, launcher, code, status):
    """submitit: the job's process exits with the job's status once submitit has its result, so Slurm shows
    it FAILED; a worker that runs other jobs too (joblib) or the sweep's own process (basic) goes on."""
    done = record_job_exit(tmp_path, launcher, code)
    assert done.returncode == status, done.stderr
    assert done.stdout == "returned\n"
    outcome = json.loads((tmp_path / "cmbench-job.json").read_text())
    assert (outcome["job"], outcome["code"], outcome["config"]) == (4, code, {"seed": 2})


@pytest.mark.parametrize("launcher", [
    pytest.param(["hydra/launcher=submitit_local"], marks=plugin("hydra_submitit_launcher")),
    pytest.param(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], marks=plugin("hydra_joblib_launcher"))])
def test_a_sweep_under_a_launcher_fails_when_a_job_fails_and_ends_with_its_board(setup, tmp_path, launcher):  # noqa: F811
    tmp, weights = setup
    done = cmbench(tmp, weights, "-m", "method=fullkv", "seed=2,abc", "limit=1", f"out_dir={tmp_path / 'runs'}",
                   *launcher)
    assert done.returncode == 1, done.stderr
    assert "cmbench: sweep: 1 of 2 job(s) failed: job 1 (exit status 1)" in done.stderr
    assert "| fullkv |" in done.stdout  # the board of the job that ran
    board = tmp_path / "runs" / "miniworld" / "leaderboard"
    assert (board / "leaderboard.csv").is_file() and list((board / "sweeps").glob("fullkv__*/leaderboard.csv"))
    sweep, = (tmp_path / "runs" / "sweeps").iterdir()  # a folder of its own
    assert sorted(p.name for p in sweep.glob("*/cmbench-job.json")) == ["cmbench-job.json"] * 2


def test_a_run_in_a_slurm_array_writes_its_shard_and_names_the_board_command(setup, tmp_path, env):  # noqa: F811
    tmp, weights = setup
    env(SLURM_ARRAY_TASK_ID=2, SLURM_ARRAY_TASK_COUNT=2, SLURM_ARRAY_TASK_MIN=1, SLURM_ARRAY_JOB_ID=91)
    done = cmbench(tmp, weights, "method=fullkv", "limit=2", f"out_dir={tmp_path / 'runs'}")
    assert done.returncode == 0, done.stderr
    run, = (tmp_path / "runs" / "miniworld").iterdir()
    assert [p.name for p in run.glob("records*.jsonl")] == ["records.shard-1-of-2.jsonl"]
    assert (f"board: once every task of Slurm array 91 has ended: python -m cmbench leaderboard data=miniworld "
            f"out_dir={tmp_path / 'runs'}") in done.stdout


def test_a_sweep_gathers_its_own_jobs_and_counts_one_that_left_no_outcome_as_failed(tmp_path, capsys):
    from cmbench.cli.sweep import JOB_FILE, SweepFolder, gathered_jobs

    (tmp_path / "7").mkdir()  # an earlier sweep's job in a folder the user named twice
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / JOB_FILE).write_text(json.dumps({"job": 0, "code": 3, "config": {"seed": 9}}))  # stale
    SweepFolder().on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    (tmp_path / "0" / JOB_FILE).write_text(json.dumps({"job": 0, "code": 0, "config": {"seed": 2}}))
    (tmp_path / "1").mkdir()  # started, then killed: no outcome
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / JOB_FILE).write_text("{not json")
    jobs = gathered_jobs()
    assert [(n, code, None if cfg is None else OmegaConf.to_container(cfg)) for n, code, cfg in jobs] == [
        (0, 0, {"seed": 2}), (1, 1, None), (2, 1, None)]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"cmbench: sweep job 1 ({tmp_path / '1'}) failed: it wrote no outcome (killed?)"
    assert err[1].startswith(f"cmbench: sweep job 2 ({tmp_path / '2'}) failed: its outcome: ")
    assert err[2].startswith("cmbench: sweep: 2 of 3 job(s) failed: job 1 (exit status 1), 2 (exit status 1);")
    assert gathered_jobs() == []  # gathered once
