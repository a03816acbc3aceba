"""``score`` resolves its config once (:func:`cmbench.spec.resolve_scoring`): the data and scorer groups
are checked as ``run`` checks them, in one line, before any data, video or scorer is loaded."""

from __future__ import annotations

import pytest

from cmbench.cli import score as score_command
from cmbench.cli.main import main


@pytest.fixture
def nothing_loads(monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("score loaded data or a scorer before refusing")

    monkeypatch.setattr(score_command, "build_adapter", loaded)
    monkeypatch.setattr(score_command, "build_scorer", loaded)


@pytest.mark.parametrize("override, message", [
    ("data.fps=0", "data.fps=0: expected a finite number > 0"),
    ("data.height=abc", "data.height='abc': expected a whole number >= 1"),
    ("scorer.batch_size=0", "scorer.batch_size=0: expected a whole number >= 1"),
    ("scorer.reference_aggregation=median", "scorer.reference_aggregation='median': expected one of mean, max"),
    ("scorer.detector.score_threshold=inf", "scorer.detector.score_threshold=inf: expected a finite number"),
])
def test_a_bad_data_or_scorer_knob_is_one_line_before_anything_loads(tmp_path, capsys, nothing_loads, override,
                                                                     message):
    out = tmp_path / "out"
    assert main(["score", f"videos={tmp_path}", "data=cmbench", f"data.root={tmp_path / 'data'}", f"out={out}",
                 override]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"cmbench: error: {message}"
    assert not out.exists()


def test_score_needs_videos_and_a_scorer_in_one_line(tmp_path, capsys, nothing_loads):
    assert main(["score", "data=cmbench"]) == 1
    assert capsys.readouterr().err.strip() == ("cmbench: error: score needs videos=DIR, a folder of <task_id>.mkv / "
                                               "<task_id>.mp4 continuations")
    assert main(["score", f"videos={tmp_path / 'absent'}", "data=cmbench"]) == 1
    assert capsys.readouterr().err.strip() == f"cmbench: error: videos={tmp_path / 'absent'}: not a folder"


@pytest.mark.parametrize("override", ["videos=${oops}", "data.fps=${oops}", "scorer.batch_size=${oops}"])
def test_an_unresolvable_value_is_one_line(tmp_path, capsys, nothing_loads, override):
    args = [f"videos={tmp_path}"] if not override.startswith("videos") else []
    assert main(["score", *args, "data=cmbench", override]) == 1
    assert capsys.readouterr().err.strip() == "cmbench: error: the config does not resolve: Interpolation key 'oops' not found"


def test_the_resolved_score_spec_keeps_out_and_label_only_when_given(tmp_path, monkeypatch):
    """No ``out=``: the records go beside the videos (the command's default), not to a folder named "None"."""
    specs = []

    def resolved_then_stop(cfg):
        specs.append(score_command.resolve_scoring(cfg))
        raise score_command.ConfigError("stopped by the test")

    monkeypatch.setattr(score_command, "execute", resolved_then_stop)
    for extra in ([], [f"out={tmp_path / 'mine'}", "label=mine"]):
        assert main(["score", f"videos={tmp_path}", *extra]) == 1
    assert (specs[0].out, specs[0].label) == (None, None)
    assert (specs[1].out, specs[1].label) == (tmp_path / "mine", "mine")
