"""``score``'s output folder is written as data: never through a link, never over a run, whole or not at all."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from cmbench.cli.main import INTERRUPTED
from cmbench.runs.records import RecordWriter
from test_scoring_cli import dataset, fresh_videos, score_in_process  # noqa: F401  (dataset: a fixture)


def records(folder):
    return [json.loads(x) for x in (folder / "records.jsonl").read_text().splitlines()]


def test_score_never_writes_through_a_link_placed_in_its_output_folder(dataset, tmp_path, capsys):  # noqa: F811
    root, videos = dataset
    videos = fresh_videos(videos, tmp_path / "videos")
    out = tmp_path / "out"
    assert score_in_process(root, videos, out, "scorer.cache_dir=null") == 1  # the corrupt video
    capsys.readouterr()
    victims = {}
    for name in ("records.jsonl", "config.yaml", "summary.json"):  # links to copies of what is there
        victim = tmp_path / f"victim_{name}"
        victim.write_bytes((out / name).read_bytes())
        (out / name).unlink()
        (out / name).symlink_to(victim)
        victims[name] = victim.read_bytes()
    (tmp_path / "victim_lock").write_text("precious\n")
    (out / ".records.jsonl.lock").symlink_to(tmp_path / "victim_lock")
    assert score_in_process(root, videos, out, "scorer.cache_dir=null") == 1
    assert "records.jsonl.lock: it is a link" in capsys.readouterr().err  # refused, not written through
    (out / ".records.jsonl.lock").unlink()
    assert score_in_process(root, videos, out, "scorer.cache_dir=null") == 1  # the corrupt video
    assert "error" not in capsys.readouterr().err
    for name, content in victims.items():
        assert (tmp_path / f"victim_{name}").read_bytes() == content, f"{name} was written through its link"
        assert (out / name).is_file() and not (out / name).is_symlink()
    assert (tmp_path / "victim_lock").read_text() == "precious\n"
    assert len(records(out)) == 3
    # links to files that are not scores: the folder is refused before anything is written
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "victim_text").write_text("precious\n")
    (other / "records.jsonl").symlink_to(tmp_path / "victim_text")
    assert score_in_process(root, videos, other, "scorer.cache_dir=null") == 1
    assert f"cmbench: error: out={other}: holds unreadable records" in capsys.readouterr().err
    assert (tmp_path / "victim_text").read_text() == "precious\n"


def test_score_refuses_an_output_folder_that_holds_a_run(dataset, tmp_path, capsys):  # noqa: F811
    root, videos = dataset
    run = tmp_path / "run"
    videos = fresh_videos(videos, run / "videos")
    line = json.dumps({"task_id": "syn_001_reappear_01", "kind": "run", "status": "ok", "score": 0.5}) + "\n"
    (run / "records.jsonl").write_text(line)
    (run / "config.yaml").write_text("method:\n  name: fullkv\n")
    (run / "summary.json").write_text('{"tasks_ok": 1}\n')
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert score_in_process(root, videos, run, "scorer.cache_dir=null") == 1
    err = capsys.readouterr().err
    assert f"out={run}" in err and "holds the records of a run" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_score_refuses_the_scores_of_another_videos_folder(dataset, tmp_path, capsys):  # noqa: F811
    root, videos = dataset
    first = fresh_videos(videos, tmp_path / "first")
    second = fresh_videos(videos, tmp_path / "second")
    out = tmp_path / "out"
    assert score_in_process(root, first, out, "scorer.cache_dir=null") == 1
    before = (out / "records.jsonl").read_bytes()
    assert score_in_process(root, second, out, "scorer.cache_dir=null") == 1
    assert f"cmbench: error: out={out}: holds the scores of {first}" in capsys.readouterr().err
    assert (out / "records.jsonl").read_bytes() == before
    assert score_in_process(root, first, out, "scorer.cache_dir=null") == 1  # rescoring the same folder is fine


def test_a_killed_rescore_keeps_the_earlier_records(dataset, tmp_path, monkeypatch):  # noqa: F811
    root, videos = dataset
    videos = fresh_videos(videos, tmp_path / "videos")
    out = tmp_path / "out"
    assert score_in_process(root, videos, out, "scorer.cache_dir=null") == 1
    earlier = (out / "records.jsonl").read_bytes()
    summary = (out / "summary.json").read_bytes()
    marker = (out / ".cmbench-written.json").read_bytes()  # the write guard's marker
    real = RecordWriter.write
    written = []

    def killed_after_one(self, record):
        if written:
            raise KeyboardInterrupt  # the process is stopped while rescoring
        written.append(record)
        return real(self, record)

    monkeypatch.setattr(RecordWriter, "write", killed_after_one)
    assert score_in_process(root, videos, out, "scorer.cache_dir=null") == INTERRUPTED  # Ctrl-C: status 130
    monkeypatch.undo()
    assert (out / "records.jsonl").read_bytes() == earlier and len(records(out)) == 3
    assert (out / "summary.json").read_bytes() == summary
    assert (out / ".cmbench-written.json").read_bytes() == marker
    assert sorted(p.name for p in out.iterdir()) == [".cmbench-written.json", "config.yaml", "records.jsonl",
                                                     "summary.json"]
    # SIGKILL leaves a hidden partial file: the next score clears it and the leaderboard never reads it
    (out / ".records.jsonl.abc123.tmp").write_text(json.dumps({"task_id": "x"}) + "\n")
    assert score_in_process(root, videos, out, "scorer.cache_dir=null") == 1
    assert not list(out.glob(".*.tmp")) and len(records(out)) == 3


def test_lossy_videos_at_a_size_where_that_moves_scores_are_warned_about(dataset, tmp_path, capsys):  # noqa: F811
    from cmbench.data.video import write_lossless_video

    root, videos = dataset
    videos = fresh_videos(videos, tmp_path / "videos")
    assert score_in_process(root, videos, tmp_path / "out", "scorer.cache_dir=null") == 1
    err = capsys.readouterr().err
    assert "score: warning: 2 video(s) are lossy (FMP4 at 32x32)" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert sorted(summary["lossy_videos"]) == ["syn_001_reappear_01.mp4", "syn_001_reappear_02.mp4"]
    lossless = tmp_path / "lossless"
    write_lossless_video(lossless / "syn_001_reappear_01.mkv", np.zeros((8, 32, 32, 3), np.uint8), 16.0)
    assert score_in_process(root, lossless, tmp_path / "out2", "scorer.cache_dir=null") == 0
    assert "lossy" not in capsys.readouterr().err
    assert json.loads((tmp_path / "out2" / "summary.json").read_text())["lossy_videos"] == []


def test_the_record_writer_never_follows_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "records.jsonl").symlink_to(victim)
    from cmbench.runs.records import RecordsWriteError

    with pytest.raises(RecordsWriteError, match="is a link"):
        RecordWriter(tmp_path / "records.jsonl").write({"task_id": "t", "status": "ok", "score": 0.5})
    assert victim.read_text() == "precious\n" and os.path.islink(tmp_path / "records.jsonl")
