"""Where the default ``runs/`` and ``data/`` go: relative to the working directory unless ``CMBENCH_HOME`` is set,
then under it from any folder (a plug-in folder, as the method guide works from, finds the same suite and
runs); a MiniWorld build says where it builds in one line, also under ``progress=false``."""

from __future__ import annotations

from pathlib import Path

from cmbench.api import compose_config
from cmbench.calibration.pruning_ratio import calibration_config
from cmbench.cli.main import main
from cmbench.miniworld.adapter import MiniWorldAdapter
from cmbench.spec import data_dir

SMALL = ["data.sources.synthetic.videos=1", "data.sources.synthetic.reappear=1", "data.sources.synthetic.revisit=0",
         "data.sources.real.videos=1", "data.sources.real.reappear=1", "data.sources.real.revisit=0",
         "data.check_counts=false"]


def test_without_a_home_the_defaults_are_as_they_were(monkeypatch):
    monkeypatch.delenv("CMBENCH_HOME", raising=False)
    cfg = compose_config("fullkv")
    assert cfg.out_dir == "runs" and cfg.data.root == "data/miniworld"  # run folders hash as before
    assert compose_config("fullkv", ["data=cmbench"]).data.root == "data/cmbench"


def test_a_home_anchors_runs_data_and_the_calibration_world_from_any_folder(tmp_path, monkeypatch):
    home, elsewhere = tmp_path / "home", tmp_path / "my_method"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("CMBENCH_HOME", str(home))
    cfg = compose_config("fullkv")
    assert Path(cfg.out_dir) == home / "runs" and Path(cfg.data.root) == home / "data" / "miniworld"
    assert data_dir(cfg) == home / "runs" / "miniworld"
    assert Path(str(calibration_config(cfg).data.root)) == home / "data" / "miniworld_calibration"
    assert Path(compose_config("fullkv", ["data=miniworld_short"]).data.root) == home / "data" / "miniworld_short"
    assert Path(compose_config("fullkv", ["out_dir=mine"]).out_dir) == Path("mine")  # an explicit value wins


def test_prepare_from_another_folder_builds_under_the_home(tmp_path, monkeypatch, capsys):
    home, elsewhere = tmp_path / "home", tmp_path / "my_method"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("CMBENCH_HOME", str(home))
    assert main(["prepare", "data=miniworld", *SMALL]) == 0
    out, err = capsys.readouterr()
    assert (home / "data" / "miniworld" / "metadata.jsonl").is_file() and list(elsewhere.iterdir()) == []
    assert f"building the suite at {home / 'data' / 'miniworld'} (once" in err


def test_a_build_under_the_working_directory_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CMBENCH_HOME", raising=False)
    data = compose_config("fullkv", ["data.root=data/mw", *SMALL]).data
    MiniWorldAdapter(data).ensure()
    err = capsys.readouterr().err
    assert "building the suite at data/mw, under the working directory (once" in err and "CMBENCH_HOME=DIR" in err
    MiniWorldAdapter(data).ensure()
    assert capsys.readouterr().err == ""  # built: nothing to say
