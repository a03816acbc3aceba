"""Output files are written whole and never through a link (cmbench/runs/atomic.py), the run's own
files (``config.yaml``, ``run.json``, ``summary.json``) included."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from cmbench.api import compose_config
from cmbench.runs import atomic
from cmbench.spec import resolve_run
from fake_evaluator import FakeEvaluator
from official_fixture import official_row, write_context_video, write_manifest


def test_a_read_only_file_system_reports_the_first_error(tmp_path, monkeypatch):
    """Removing the temporary file fails on a read-only file system too: the write's error is the one told."""

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "write_text", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(atomic.OutputError, match=r"cannot write .*config.yaml: Read-only file system"):
        atomic.write_text(tmp_path / "config.yaml", "x")


def test_a_run_never_writes_its_files_through_a_link_in_its_folder(tmp_path, monkeypatch):
    """Links planted in a run directory CMBench made, at the files' names and at the temporary names a
    writer derived from its process id would use, are replaced or left alone, never written through."""
    from cmbench.runs import evaluator, experiment, output_folder

    data = tmp_path / "data"
    write_context_video(data / "videos" / "synthetic" / "syn_001.mp4", seed=0)
    write_manifest(data, [official_row("syn_001_reappear_01", "videos/synthetic/syn_001.mp4")])
    spec = resolve_run(compose_config("fullkv", ["data=cmbench", f"data.root={data}", "data.check_counts=false",
                                                 f"out_dir={tmp_path / 'runs'}", "progress=false"]))
    fake = FakeEvaluator()
    fake.scorer_hash, fake.metric, fake.scorer = "fake", "dino", SimpleNamespace(models_hash="fake")
    monkeypatch.setattr(evaluator.ModelEvaluator, "from_spec", classmethod(lambda cls, spec, videos=None: fake))

    run_dir = spec.outputs.run_dir
    # a run folder CMBench made (its marker lists the three files), then links planted in it: an
    # unmarked folder holding them is refused whole by the write guard (tests/test_write_guard.py)
    output_folder.claim(run_dir, "run", "the run directory").add("config.yaml", "run.json", "summary.json")
    victims = {}
    for name in ("config.yaml", "run.json", "summary.json"):
        for link in (run_dir / name, run_dir / f".{name}.{os.getpid()}.tmp"):
            victim = tmp_path / f"victim_{link.name}"
            victim.write_text("precious\n")
            link.symlink_to(victim)
            victims[link.name] = victim
    result = experiment.run_experiment(spec)

    assert result.summary["tasks_ok"] == 1
    for victim in victims.values():
        assert victim.read_text() == "precious\n", f"{victim.name} was written through its link"
    for name in ("config.yaml", "run.json", "summary.json"):
        assert (run_dir / name).is_file() and not (run_dir / name).is_symlink(), name
    assert json.loads((run_dir / "run.json").read_text())["label"] == result.label
    assert json.loads((run_dir / "summary.json").read_text())["tasks_ok"] == 1
