"""``python -m cmbench verify RUN`` on a copied real run (tiny model, two tasks): an untouched copy verifies; a
forged score, a forged PR, forged bytes and a forged code identity are each caught, one line per problem,
with a nonzero exit."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cmbench.cli.main import main
from cmbench.hashing import json_digest
from test_run_command import SMALL_SUITE

pytestmark = pytest.mark.slow  # one real run of the tiny model


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> tuple[Path, Path]:
    """A decoprune run (quota 0.8, two tasks) on a small MiniWorld suite, and the suite."""
    from test_tiny_backbone import random_model

    tmp = tmp_path_factory.mktemp("verify")
    weights = tmp / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    suite = tmp / "suite"
    assert main(["prepare", "data=miniworld", f"data.root={suite}", *SMALL_SUITE, "data.check_counts=false"]) == 0
    assert main(["run", f"data.root={suite}", *SMALL_SUITE, f"backbone.path={weights}", f"out_dir={tmp / 'runs'}",
                 "progress=false", "method=decoprune", "method.quota_pr=0.8", "limit=2"]) == 0
    (run_dir,) = [p for p in (tmp / "runs" / "miniworld").iterdir() if p.is_dir()]
    return run_dir, suite


def received(real_run, tmp_path: Path, forge=None) -> Path:
    """A copy of the run as someone would send it, its first record changed by ``forge`` (a dict edit)."""
    copy = tmp_path / "received" / real_run[0].name
    shutil.copytree(real_run[0], copy)
    if forge is not None:
        path = copy / "records.jsonl"
        lines = path.read_text().splitlines()
        first = json.loads(lines[0])
        forge(first)
        path.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    return copy


def verify(capsys, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    capsys.readouterr()
    code = main(["verify", str(run_dir), *args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess([], code, out.out, out.err)


def problem_lines(done: subprocess.CompletedProcess, run_dir: Path) -> list[str]:
    return [line.removeprefix(f"{run_dir}: ") for line in done.stdout.splitlines() if line.startswith(f"{run_dir}: ")]


def first_task(run_dir: Path) -> str:
    return json.loads((run_dir / "records.jsonl").read_text().splitlines()[0])["task_id"]


def test_an_untouched_run_verifies(real_run, tmp_path, capsys):
    run_dir = received(real_run, tmp_path)
    done = verify(capsys, run_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert problem_lines(done, run_dir) == [] and "nothing differs" in done.stdout


def test_a_forged_score_is_caught(real_run, tmp_path, capsys):
    def forge(r):
        r["score"] = round(r["score"] + 0.25, 4)

    run_dir = received(real_run, tmp_path, forge)
    done = verify(capsys, run_dir)
    assert done.returncode == 1
    (line,) = problem_lines(done, run_dir)
    assert line.startswith(f"task {first_task(run_dir)}: score: recorded ") and "its video scores" in line


def test_a_forged_pr_and_forged_bytes_are_caught(real_run, tmp_path, capsys):
    """Forged consistently with each other (the bytes ratio is the mean bytes over FullKV's, ``1 - pr`` for
    full-precision storage), so the record reads; its ledger still says otherwise."""
    truth = {}

    def forge(r):
        truth.update(r)
        r["pr"] = 0.9
        r["kv_bytes_ratio"] = 0.1
        r["mean_kv_bytes"] = 0.1 * r["fullkv_kv_bytes"]

    run_dir = received(real_run, tmp_path, forge)
    done = verify(capsys, run_dir)
    assert done.returncode == 1, done.stderr
    lines = problem_lines(done, run_dir)
    task = first_task(run_dir)
    assert lines == [f"task {task}: kv_bytes_ratio: recorded 0.1, its ledger gives {truth['kv_bytes_ratio']}",
                     f"task {task}: mean_kv_bytes: recorded {0.1 * truth['fullkv_kv_bytes']}, its ledger gives "
                     f"{truth['mean_kv_bytes']}",
                     f"task {task}: pr: recorded 0.9, its ledger gives {truth['pr']}"]


def test_a_forged_ledger_that_hides_its_pr_is_still_a_forged_pr(real_run, tmp_path, capsys):
    """A forger who edits the PR but keeps the ledger is caught; one who rewrites the ledger to match changes
    the record's bytes too (FullKV's per chunk are the geometry's), caught the same way."""
    def forge(r):
        r["ledger"] = [[row[0] // 2, row[1], row[2], row[3]] for row in r["ledger"]]

    run_dir = received(real_run, tmp_path, forge)
    lines = problem_lines(verify(capsys, run_dir), run_dir)
    assert [line.split(":")[1].strip() for line in lines] == ["pr"]


@pytest.mark.parametrize("edit, problem", [
    (lambda rows: rows[0].__setitem__(0, rows[0][1] + 1), "ledger: chunk 0: {} visible tokens, more than FullKV's"),
    (lambda rows: rows[1].__setitem__(3, rows[1][3] * 2), "ledger: FullKV's bytes per token differ between chunks"),
    (lambda rows: rows.reverse(), "ledger: FullKV's history shrinks between chunks"),
])
def test_a_ledger_no_run_could_write_is_caught(real_run, tmp_path, capsys, edit, problem):
    def forge(r):
        edit(r["ledger"])

    run_dir = received(real_run, tmp_path, forge)
    lines = problem_lines(verify(capsys, run_dir), run_dir)
    first = json.loads((run_dir / "records.jsonl").read_text().splitlines()[0])["ledger"][0]
    assert any(problem.format(first[0]) in line for line in lines), lines


@pytest.mark.parametrize("part", ["cmbench", "manifest", "scorer"])
def test_a_forged_code_identity_is_caught(real_run, tmp_path, capsys, part):
    def forge(r):
        r["code"][part] = "0" * 16
        r["code_hash"] = json_digest(r["code"])[:12]  # a careful forger keeps the hash consistent

    run_dir = received(real_run, tmp_path, forge)
    done = verify(capsys, run_dir)
    assert done.returncode == 1
    (line,) = problem_lines(done, run_dir)
    assert line.startswith(f"task {first_task(run_dir)}: code.{part}: recorded {'0' * 16}, this checkout's is ")


def test_a_code_hash_that_does_not_match_its_parts_is_caught(real_run, tmp_path, capsys):
    def forge(r):
        r["code_hash"] = "abcdefabcdef"

    run_dir = received(real_run, tmp_path, forge)
    (line,) = problem_lines(verify(capsys, run_dir), run_dir)
    assert "code_hash: recorded abcdefabcdef, its code parts hash to" in line


def test_a_plugin_adapter_named_by_a_received_run_is_not_imported(real_run, tmp_path, capsys):
    run_dir = received(real_run, tmp_path)
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("adapter: miniworld", "adapter: os:system"))
    done = verify(capsys, run_dir)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "'os:system' is not built in" in done.stderr and "Traceback" not in done.stderr


def test_not_a_run_folder_is_one_line(tmp_path, capsys):
    done = verify(capsys, tmp_path)
    assert done.returncode == 1 and "not a run folder" in done.stderr and len(done.stderr.strip().splitlines()) == 1
