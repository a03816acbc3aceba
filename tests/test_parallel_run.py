"""``torchrun --nproc_per_node=2 -m cmbench run ... parallel.sequence=2`` on the CPU (gloo) gives the
one-process run's records.

One MiniWorld context (two tasks of two continuation chunks) of the small suite on a small random tiny model (2 heads): FullKV and
DeCoPrune at a quota, the cross-rank mask checksum on. Every record field equals the one-process run's
(scores and similarities within fp32 tolerance; PR, kept tokens, peak KV and attention work identical)
except the timings; one rank writes (one records file, one set of videos). A run killed mid-way under
torchrun resumes to the same records; a group size that does not divide the heads or the processes,
or a split without torchrun, is a one-line error before any work.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cmbench.cli.main import main
from cmbench.runs.records import read_all_records
from test_run_command import REPO, SMALL_SUITE, TIMING, first_record, in_process, only_run_dir, stable
from test_tiny_backbone import random_model

pytestmark = pytest.mark.slow  # torchrun and the command line in subprocesses

ONE_CONTEXT = "task_ids=[syn_001_revisit_01,syn_001_reappear_01]"
SHORT = "generation.continuation_frames=8"  # two chunks per task
DECOPRUNE = ("method=decoprune", "method.quota_pr=0.5")
SPLIT = ("parallel.sequence=2", "parallel.check_masks=true")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("split")
    weights = tmp / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    # the suite is data here, built in this process (tests/test_run_command.py runs prepare in a real one)
    assert main(["prepare", "data=miniworld", f"data.root={tmp / 'suite'}", *SMALL_SUITE, "data.check_counts=false"]) == 0
    return tmp, weights


@pytest.fixture(scope="module")
def one_process(setup, tmp_path_factory):
    """The run directory of a method's one-process run (run once per module, in this process: the reference the
    torchrun runs are compared with; the subprocesses under test are torchrun's)."""
    tmp, weights = setup
    runs: dict[tuple[str, ...], Path] = {}

    def run(method: tuple[str, ...]) -> Path:
        if method not in runs:
            out = tmp_path_factory.mktemp("one")
            assert in_process(tmp, weights, out, ONE_CONTEXT, SHORT, *method) == 0
            runs[method] = only_run_dir(out)
        return runs[method]

    return run


def command(tmp: Path, weights: Path, out_dir: Path, *args: str, ranks: int = 1, background: bool = False):
    """``python -m cmbench run`` (``ranks > 1``: under torchrun) on one context of the small suite."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] \
        if ranks > 1 else [sys.executable]
    cmd = [*launch, "-m", "cmbench", "run", f"data.root={tmp / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}",
           f"out_dir={out_dir}", "progress=false", ONE_CONTEXT, SHORT, *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if background:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def assert_same_records(one: list[dict], split: list[dict]) -> None:
    """Same tasks, every field equal but the timings; floats within fp32 tolerance."""
    by_id = {r["task_id"]: r for r in split}
    assert sorted(by_id) == sorted(r["task_id"] for r in one)
    for a in one:
        b = by_id[a["task_id"]]
        assert a["status"] == "ok" and b["status"] == "ok"
        assert set(a) == set(b)
        for key in sorted(set(a) - TIMING):
            assert close(a[key], b[key]), (a["task_id"], key, a[key], b[key])


def close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.timeout(900)
@pytest.mark.parametrize("method", [("method=fullkv",), DECOPRUNE], ids=["fullkv", "decoprune"])
def test_torchrun_split_run_gives_the_one_process_records(setup, one_process, tmp_path, method):
    tmp, weights = setup
    two = command(tmp, weights, tmp_path / "two", *method, *SPLIT, ranks=2)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("2/2 tasks ok (2 run now, 0 cached)") == 1  # the writer's line only
    one_dir, two_dir = one_process(method), only_run_dir(tmp_path / "two")
    assert one_dir.name == two_dir.name  # the same run: parallel.sequence changes no record
    assert [p.name for p in two_dir.glob("records*.jsonl")] == ["records.jsonl"]  # one writer, one shard
    assert sorted(p.name for p in (two_dir / "videos").iterdir()) == sorted(p.name for p in (one_dir / "videos").iterdir())
    records = read_all_records(one_dir)
    assert_same_records(records, read_all_records(two_dir))
    assert all(r["peak_kv_bytes"] > 0 and r["attention_flops"] > 0 for r in records)
    if "method=decoprune" in method:
        assert all(0.3 < r["pr"] < 0.6 for r in records)  # the quota prunes: the masks decided matter


@pytest.mark.timeout(900)
def test_torchrun_run_killed_mid_way_resumes_to_the_same_records(setup, one_process, tmp_path):
    tmp, weights = setup
    proc = command(tmp, weights, tmp_path / "killed", *DECOPRUNE, *SPLIT, ranks=2, background=True)
    records_file = first_record(tmp_path / "killed", proc)
    for pid in [proc.pid, *children(proc.pid)]:  # torchrun and both ranks (which it starts in their own sessions)
        os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert records_file is not None, "the run finished no task before the deadline"
    assert len(read_all_records(records_file.parent)) == 1
    resumed = command(tmp, weights, tmp_path / "killed", *DECOPRUNE, *SPLIT, ranks=2)
    assert resumed.returncode == 0, resumed.stderr
    assert "(1 run now, 1 cached)" in resumed.stdout
    got = read_all_records(records_file.parent)
    assert stable(got) == stable(read_all_records(one_process(DECOPRUNE)))


@pytest.mark.parametrize(
    "env, args, message",
    [
        ({"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"}, ["parallel.sequence=3"],
         "parallel.sequence=3 does not divide the model's 2 attention heads"),
        ({"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"}, ["parallel.sequence=2"],
         "parallel.sequence=2 does not divide torchrun's 3 processes (WORLD_SIZE)"),
        ({}, ["parallel.sequence=2"], "parallel.sequence=2 splits a model over torchrun's ranks: launch with torchrun"),
        ({"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0"}, ["parallel.sequence=2", "shard.count=2"],
         "shard.count=2 and torchrun's 2 groups of parallel.sequence=2 ranks both shard the tasks"),
    ],
    ids=["heads", "processes", "no-torchrun", "two-shardings"],
)
def test_a_wrong_group_size_is_a_one_line_error_before_any_work(setup, tmp_path, capsys, monkeypatch, env, args,
                                                                message):
    import torch.distributed as dist

    tmp, weights = setup
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out_dir = tmp_path / "runs"
    assert in_process(tmp, weights, out_dir, ONE_CONTEXT, *args) == 1
    err = capsys.readouterr().err
    assert f"cmbench: error: {message}" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not out_dir.exists() and not dist.is_initialized()  # no folder, no process group joined


def test_a_split_run_plans_one_rank_before_loading(monkeypatch):
    """The evaluator's memory plan is one rank's (as ``plan ... parallel.sequence=P`` prints it): LingBot
    14B FullKV over a one-minute context needs its KV cache in host memory on one H200, and split over
    4 only its text encoder on the CPU; a group that does not divide the 40 heads is refused before
    anything loads."""
    from types import SimpleNamespace

    from cmbench.api import compose_config
    from cmbench.backbones.memory.run_plan import geometry_of
    from cmbench.errors import ConfigError
    from cmbench.runs import evaluator
    from cmbench.spec import resolve_run

    loaded = []
    monkeypatch.setattr(evaluator, "build_backbone", lambda cfg: loaded.append(cfg) or SimpleNamespace(
        geometry=geometry_of(cfg)))  # the geometry alone: no weights here
    monkeypatch.setenv("RANK", "0")

    def plan(sequence: int):
        monkeypatch.setenv("WORLD_SIZE", str(sequence))
        spec = resolve_run(compose_config("fullkv", [
            "backbone=lingbot_world_v2_14b", f"parallel.sequence={sequence}", "backbone.memory.device_gib=139",
            "backbone.memory.host_gib=2000", "backbone.memory.context_seconds=60"]))
        return evaluator.ModelEvaluator.from_spec(spec).memory

    one, split = plan(1), plan(4)
    assert one.plan.offloads == ("offload_kv",) and one.backbone_config["offload_kv"] is True
    assert split.plan.offloads == ("text_cpu",) and split.plan.shape.sequence == 4
    assert "offload_kv" not in split.backbone_config or not split.backbone_config["offload_kv"]
    assert len(loaded) == 2
    with pytest.raises(ConfigError, match="parallel.sequence=3 does not divide the model's 40 attention heads"):
        plan(3)
    assert len(loaded) == 2


@pytest.mark.parametrize("rank, writes", [(0, True), (1, False), (2, True), (3, False)])
def test_only_a_groups_writer_ends_a_sweep_with_the_leaderboard(monkeypatch, rank, writes):
    """Under torchrun a ``-m`` sweep's board is written by the ranks that wrote runs (each group's rank 0),
    never by a follower, which wrote nothing."""
    from omegaconf import OmegaConf

    import cmbench.cli.leaderboard as board
    from cmbench.cli import run

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", str(rank))
    calls = []
    monkeypatch.setattr(run, "resolve_target_pr", lambda cfg, verbose=False: calls.append("resolve") or 1 / 0)
    monkeypatch.setattr(board, "write_leaderboard", lambda *a, **k: calls.append("board"))
    config = OmegaConf.create({"parallel": {"sequence": 2}})
    if writes:
        with pytest.raises(ZeroDivisionError):  # went on to resolve the sweep's runs for the board
            run.after_sweep([config])
        assert calls == ["resolve"]
    else:
        assert run.after_sweep([config]) == 0 and calls == []
