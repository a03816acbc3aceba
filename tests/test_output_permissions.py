"""Every output follows the umask, as ``records.jsonl`` does: teammates who share a group or a cluster read
a run's ``config.yaml``, ``run.json`` and ``summary.json`` when the umask lets them, and nobody does when
it does not (cmbench/runs/atomic.py creates its new files as ``open`` does, not ``mkstemp``'s 0600)."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from cmbench.api import compose_config
from cmbench.runs import atomic
from cmbench.spec import resolve_run
from fake_evaluator import FakeEvaluator
from official_fixture import official_row, write_context_video, write_manifest


@pytest.fixture
def umask():
    """Set the process umask for one test, restored after it."""
    saved = os.umask(0o022)
    yield os.umask
    os.umask(saved)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600)])
def test_a_runs_files_follow_the_umask(tmp_path, monkeypatch, umask, mask, expected):
    """A small real run (the model and scorer faked): its four files get ``0666 & ~umask`` (records.jsonl:
    ``0644 & ~umask``), the same for each."""
    from cmbench.runs import evaluator, experiment

    data = tmp_path / "data"
    write_context_video(data / "videos" / "synthetic" / "syn_001.mp4", seed=0)
    write_manifest(data, [official_row("syn_001_reappear_01", "videos/synthetic/syn_001.mp4")])
    spec = resolve_run(compose_config("fullkv", ["data=cmbench", f"data.root={data}", "data.check_counts=false",
                                                 f"out_dir={tmp_path / 'runs'}", "progress=false"]))
    fake = FakeEvaluator()
    fake.scorer_hash, fake.metric, fake.scorer = "fake", "dino", SimpleNamespace(models_hash="fake")
    monkeypatch.setattr(evaluator.ModelEvaluator, "from_spec", classmethod(lambda cls, spec, videos=None: fake))
    umask(mask)
    result = experiment.run_experiment(spec)

    assert result.summary["tasks_ok"] == 1
    run_dir = spec.outputs.run_dir
    modes = {name: oct(mode(run_dir / name)) for name in ("config.yaml", "run.json", "summary.json", "records.jsonl")}
    assert modes == dict.fromkeys(modes, oct(expected))


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_a_file_written_whole_gets_what_open_would_give_it(tmp_path, umask, mask, expected):
    """:func:`atomic.write_text`, and the hidden file :func:`atomic.new_sibling` makes, as ``open`` makes a
    new file; overwriting an existing output does not keep its old mode either."""
    umask(mask)
    (tmp_path / "old.txt").write_text("old")
    os.chmod(tmp_path / "old.txt", 0o600)
    atomic.write_text(tmp_path / "old.txt", "new")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    sibling = atomic.new_sibling(tmp_path / "partial.jsonl")
    assert (mode(tmp_path / "old.txt"), mode(sibling), mode(plain)) == (expected, expected, expected)
    assert sibling.name.startswith(".partial.jsonl.") and sibling.name.endswith(atomic.TMP_SUFFIX)
