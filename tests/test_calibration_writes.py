"""What ``calibrate`` (and ``method.target_pr``) writes, and where: ``<out_dir>/calibration`` only when it is
empty or CMBench's (its marker lists the logs, ``method/`` and ``keyed/``), never through a link planted
in it (a symbolic or hard link at a log, at a temporary file's name, or a sub-folder that is a link).

Calibrations run with the fakes of tests/test_matched_pr_units.py (no model)."""

from __future__ import annotations

import json
import os

import pytest

from cmbench.calibration.matched_pr import keep_probe, shared_probes
from cmbench.runs.output_folder import MARKER, OutputFolderError
from test_link_safe_writes import VICTIM, victim  # noqa: F401  (a file outside the folder: the fixture)
from test_matched_pr_units import SHARE, lab  # noqa: F401  (the fixture)


def test_a_calibration_folder_lists_what_it_wrote(lab):  # noqa: F811
    lab.run(SHARE, 0.25)
    listed = json.loads((lab.folder / MARKER).read_text())
    assert listed["kind"] == "calibration" and listed["files"] == ["keyed", "method", "share_pr25.json"]
    assert lab.run(SHARE, 0.25).cached  # a second calibration into its own folder is no refusal


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_linked_log_outside_the_folder_stays_unchanged(lab, victim, link):  # noqa: F811
    lab.run(SHARE, 0.25)
    log = lab.folder / "share_pr25.json"
    log.unlink()
    (os.symlink if link == "symlink" else os.link)(victim, log)
    lab.run(SHARE, 0.25)  # reused from keyed/, published again over the link
    assert victim.read_bytes() == VICTIM
    assert not log.is_symlink() and json.loads(log.read_text())["value"] == pytest.approx(0.25)


def plant(target, path, link):
    """A symbolic or hard link to ``target`` at the temporary name a writer of ``path`` would use if it named
    it after its process id (``.<name>.<pid>.tmp``)."""
    (os.symlink if link == "symlink" else os.link)(target, path.with_name(f".{path.name}.{os.getpid()}.tmp"))


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_link_at_a_temporary_name_is_never_written_through(lab, victim, link):  # noqa: F811
    """Every file a calibration writes: the probe cache, the log and the yaml named after the target, the
    log under its key."""
    lab.run(SHARE, 0.3)
    keyed = lab.folder / "keyed"
    plant(victim, keyed / "share_probes_k.json", link)
    keep_probe(lab.folder, "share", "k", 0.5, 0.5)
    plant(victim, lab.folder / "share_pr25.json", link)
    plant(victim, lab.folder / "method" / "share_pr25.yaml", link)
    result = lab.run(SHARE, 0.25)
    keyed_log = keyed / f"share_pr25_{result.key}.json"
    keyed_log.unlink()
    plant(victim, keyed_log, link)
    assert lab.run(SHARE, 0.25).cached  # the log named after the target, kept again under its key
    assert victim.read_bytes() == VICTIM
    assert json.loads(keyed_log.read_text())["value"] == json.loads((lab.folder / "share_pr25.json").read_text())["value"]
    assert "share: 0.25" in (lab.folder / "method" / "share_pr25.yaml").read_text()
    assert shared_probes(lab.folder, "share", "k", logs=False) == {0.5: 0.5}


@pytest.mark.parametrize("sub", ["keyed", "method"])
def test_a_sub_folder_that_is_a_link_is_refused_before_any_work(lab, tmp_path, sub):  # noqa: F811
    lab.run(SHARE, 0.25)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    moved = lab.folder / sub
    moved.rename(outside / sub)
    moved.symlink_to(outside / sub)
    before = sorted(p.name for p in (outside / sub).iterdir())
    lab.measured.clear()
    with pytest.raises(OutputFolderError, match=f"calibration folder {lab.folder}: its {sub} is a link"):
        lab.run(SHARE, 0.3)
    assert not lab.measured and sorted(p.name for p in (outside / sub).iterdir()) == before


def test_a_folder_of_yours_is_refused_in_one_line_before_any_work(lab):  # noqa: F811
    lab.folder.mkdir(parents=True)
    (lab.folder / "notes.txt").write_text("mine")
    with pytest.raises(OutputFolderError) as refused:
        lab.run(SHARE, 0.25)
    assert str(refused.value) == (
        f"out_dir's calibration folder {lab.folder}: not empty and not written by CMBench (it holds notes.txt); "
        "choose an empty or new folder for out_dir's calibration folder, so nothing of yours is replaced")
    assert not lab.measured and sorted(p.name for p in lab.folder.iterdir()) == ["notes.txt"]


def test_a_folder_of_another_kind_is_refused(lab):  # noqa: F811
    lab.folder.mkdir(parents=True)
    (lab.folder / MARKER).write_text(json.dumps({"written_by": "cmbench", "kind": "run", "files": ["records.jsonl"]}))
    with pytest.raises(OutputFolderError, match="holds the records of a run, not calibrations"):
        lab.run(SHARE, 0.25)
    assert not lab.measured


def test_a_calibration_folder_from_before_markers_is_adopted(lab):  # noqa: F811
    lab.run(SHARE, 0.25)
    (lab.folder / MARKER).unlink()
    assert lab.run(SHARE, 0.25).cached
    assert json.loads((lab.folder / MARKER).read_text())["files"] == ["keyed", "method", "share_pr25.json"]
