"""The official dataset pinned and verified: ``data.revision`` resolved to a commit and downloaded at it, the
commit and every context video's hash in the pin and in every record, a changed video refused in one line,
and the offline message naming the command huggingface_hub installs. The hub is never contacted: its
download and its revision lookup are replaced by fakes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
from huggingface_hub.errors import RevisionNotFoundError

from cmbench.cli.main import main
from cmbench.data import official
from cmbench.data.official import PIN_FILE, read_pin
from cmbench.data.task import Task
from cmbench.data.video_hashes import HashCache, check_against_records, context_hashes
from cmbench.errors import ConfigError
from cmbench.hashing import file_hash
from official_fixture import official_row, write_context_video, write_manifest

COMMIT = "0123456789abcdef0123456789abcdef01234567"
VIDEOS = ("videos/synthetic/syn_001.mp4", "videos/real/real_001.mp4")


@pytest.fixture
def hub(monkeypatch):
    """A fake hub: ``dataset_info`` resolves any revision but ``nope`` to :data:`COMMIT`; ``snapshot_download``
    writes a two-video dataset into ``local_dir`` and remembers what it was asked for."""
    asked: dict = {}

    def dataset_info(self, repo_id, revision=None, **kwargs):
        asked["resolved"] = revision
        if revision == "nope":
            raise RevisionNotFoundError("404 revision not found",
                                        response=SimpleNamespace(headers={}, request=None, status_code=404))
        return SimpleNamespace(sha=COMMIT)

    def snapshot_download(repo_id, repo_type=None, revision=None, local_dir=None, **kwargs):
        asked.update(repo_id=repo_id, repo_type=repo_type, revision=revision)
        root = Path(local_dir)
        for seed, video in enumerate(VIDEOS):
            write_context_video(root / video, seed)
        write_manifest(root, [official_row("syn_001_reappear_01", VIDEOS[0]),
                              official_row("real_001_reappear_01", VIDEOS[1], source="real")])
        return str(root)

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(official, "_hub_reachable", lambda endpoint: None)
    return asked


def prepare(capsys, root: Path, *args: str) -> subprocess.CompletedProcess:
    capsys.readouterr()
    code = main(["prepare", "data=cmbench", f"data.root={root}", "data.check_counts=false", *args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess([], code, out.out, out.err)


def test_prepare_downloads_the_resolved_commit_and_pins_every_video(hub, tmp_path, capsys):
    root = tmp_path / "cmbench"
    done = prepare(capsys, root, "data.revision=v1.0")
    assert done.returncode == 0, done.stderr
    assert hub["resolved"] == "v1.0"  # the revision asked for is resolved ...
    assert hub["revision"] == COMMIT  # ... and exactly that commit downloaded (a branch cannot move under it)
    assert hub["repo_id"] == "Aoraku/CMBench" and hub["repo_type"] == "dataset"
    pin = read_pin(root)
    assert pin is not None and (pin.repo_id, pin.revision, pin.commit) == ("Aoraku/CMBench", "v1.0", COMMIT)
    assert pin.videos == {v: file_hash(root / v) for v in VIDEOS}
    assert COMMIT in done.stdout


def test_a_revision_that_does_not_exist_is_one_line_and_downloads_nothing(hub, tmp_path, capsys):
    root = tmp_path / "cmbench"
    done = prepare(capsys, root, "data.revision=nope")
    assert done.returncode != 0
    assert "revision" not in hub  # no download started
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "data.revision=nope" in lines[0] and "Aoraku/CMBench" in lines[0]
    assert not (root / PIN_FILE).exists()


def test_offline_the_message_names_the_hf_command_with_the_revision(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    done = prepare(capsys, tmp_path / "cmbench", "data.revision=v1.0")
    assert done.returncode != 0
    assert "hf download Aoraku/CMBench --repo-type dataset --revision v1.0 --local-dir" in done.stderr
    assert "huggingface-cli" not in done.stderr  # huggingface_hub no longer installs it


def test_the_hf_command_the_message_names_exists():
    import shutil
    import sys

    hf = Path(sys.executable).parent / "hf"
    found = hf if hf.exists() else shutil.which("hf")
    assert found is not None, "huggingface_hub installs no `hf` command: the offline message names the wrong one"
    help_text = subprocess.run([str(found), "download", "--help"], capture_output=True, text=True, timeout=120).stdout
    assert "--revision" in help_text and "--local-dir" in help_text and "--repo-type" in help_text


def test_a_present_copy_pinned_to_another_commit_is_refused(hub, tmp_path, capsys):
    root = tmp_path / "cmbench"
    assert prepare(capsys, root).returncode == 0
    again = prepare(capsys, root, f"data.revision={'f' * 40}")
    assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1
    assert COMMIT in again.stderr and PIN_FILE in again.stderr
    assert prepare(capsys, root, f"data.revision={COMMIT}").returncode == 0  # the same commit: nothing to do


@pytest.mark.parametrize("content, field", [
    ("[1, 2]", "not a JSON object"),
    ('{"repo_id": "a", "revision": "main", "commit": 7, "videos": {}}', "commit"),
    ('{"repo_id": "a", "revision": "main", "commit": "c", "videos": [1]}', "videos"),
])
def test_a_malformed_pin_is_one_line_naming_its_field(tmp_path, content, field):
    (tmp_path / PIN_FILE).write_text(content)
    with pytest.raises(ConfigError, match=field) as err:
        read_pin(tmp_path)
    assert PIN_FILE in str(err.value) and "\n" not in str(err.value)


def test_a_copy_downloaded_by_hf_names_its_commit_without_a_pin(tmp_path):
    from cmbench.data.official import dataset_commit

    assert dataset_commit(tmp_path) is None
    noted = tmp_path / ".cache" / "huggingface" / "download" / "metadata.jsonl.metadata"
    noted.parent.mkdir(parents=True)
    noted.write_text(f"{COMMIT}\n\"etag\"\n1765000000.0\n")  # what hf download --local-dir leaves
    assert dataset_commit(tmp_path) == COMMIT
    noted.write_text("not a commit\n")
    assert dataset_commit(tmp_path) is None
    (tmp_path / PIN_FILE).write_text(json.dumps({"repo_id": "a", "revision": "main", "commit": "f" * 40, "videos": {}}))
    assert dataset_commit(tmp_path) == "f" * 40  # the pin first


def tasks_of(root: Path) -> list[Task]:
    return [Task(task_id=f"t{i}", source="synthetic", task_type="reappear", scene="s", video=v, context_clip_prompts=(),
                 continue_prompt="", target_label="x", target_aliases=(), references=(), root=root)
            for i, v in enumerate(VIDEOS)]


def test_hashes_are_cached_by_path_size_and_mtime(tmp_path):
    for seed, video in enumerate(VIDEOS):
        write_context_video(tmp_path / video, seed)
    cache_file = tmp_path / "cache" / "hashes.json"
    first = HashCache(cache_file)
    hashes = context_hashes(tasks_of(tmp_path), first)
    assert hashes == {"videos/synthetic/syn_001": file_hash(tmp_path / VIDEOS[0]),
                      "videos/real/real_001": file_hash(tmp_path / VIDEOS[1])}
    assert first.hashed == 2
    again = HashCache(cache_file)  # another process: nothing read again
    assert context_hashes(tasks_of(tmp_path), again) == hashes and again.hashed == 0
    with open(tmp_path / VIDEOS[0], "r+b") as f:  # one byte changed in place: same size, new mtime
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    changed = HashCache(cache_file)
    assert context_hashes(tasks_of(tmp_path), changed)["videos/synthetic/syn_001"] == file_hash(tmp_path / VIDEOS[0])
    assert changed.hashed == 1


def test_a_context_changed_since_a_runs_earlier_records_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="context video videos/real/real_001: changed since") as err:
        check_against_records({"videos/real/real_001": "b" * 64, "videos/synthetic/syn_001": "a" * 64},
                              {"videos/synthetic/syn_001": "a" * 64, "videos/real/real_001": "c" * 64}, tmp_path)
    assert "\n" not in str(err.value)
    check_against_records({"v": "a" * 64}, {"v": None, "w": "c" * 64}, tmp_path)  # before the field; not run now


@pytest.fixture(scope="module")
def suite_and_weights(tmp_path_factory):
    from test_run_command import SMALL_SUITE
    from test_tiny_backbone import random_model

    tmp = tmp_path_factory.mktemp("pinned")
    weights = tmp / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    assert main(["prepare", "data=miniworld", f"data.root={tmp / 'suite'}", *SMALL_SUITE,
                 "data.check_counts=false"]) == 0
    return tmp, weights


def run(capsys, tmp: Path, weights: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    from test_run_command import SMALL_SUITE

    capsys.readouterr()
    code = main(["run", f"data.root={tmp / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}", f"out_dir={out}",
                 "progress=false", "method=streaming", "limit=2", *args])
    printed = capsys.readouterr()
    return subprocess.CompletedProcess([], code, printed.out, printed.err)


def test_records_carry_the_commit_and_video_hashes_and_a_changed_video_is_refused(suite_and_weights, tmp_path,
                                                                                capsys, monkeypatch):
    from cmbench.runs.records import read_all_records

    tmp, weights = suite_and_weights
    monkeypatch.chdir(tmp_path)  # the hash cache lives under the working directory
    suite = tmp_path / "suite"
    import shutil

    shutil.copytree(tmp / "suite", suite)
    videos = sorted(p.relative_to(suite).as_posix() for p in (suite / "videos").rglob("*.mp4"))
    (suite / PIN_FILE).write_text(json.dumps({"repo_id": "Aoraku/CMBench", "revision": "main", "commit": COMMIT,
                                              "videos": {v: file_hash(suite / v) for v in videos}}))
    done = run(capsys, tmp_path, weights, tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    records = [r for d in (tmp_path / "runs" / "miniworld").iterdir() if d.is_dir() for r in read_all_records(d)]
    assert len(records) == 2
    for record in records:
        assert record["dataset_commit"] == COMMIT
        assert record["context_hash"] == file_hash(suite / (record["context_id"] + ".mp4"))
    used = records[0]["context_id"] + ".mp4"
    with open(suite / used, "ab") as f:
        f.write(b"\0")  # one byte appended: another video
    refused = run(capsys, tmp_path, weights, tmp_path / "runs")
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert str(suite / used) in lines[0] and "changed since it was downloaded" in lines[0] and COMMIT in lines[0]
    (suite / PIN_FILE).unlink()  # no pin: the run's own earlier records still catch it
    refused = run(capsys, tmp_path, weights, tmp_path / "runs")
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"context video {records[0]['context_id']}: changed since" in refused.stderr
