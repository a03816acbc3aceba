"""``report`` treats run folders as data: no code they name, no file outside them, a whole page or the old one."""

from __future__ import annotations

import json
import re
import tracemalloc

import numpy as np
import pytest

from cmbench.data.video import write_video
from cmbench.report import gallery
from cmbench.report.html import build_report
from cmbench.report.leaderboard import ReportError
from cmbench.runs.output_folder import OutputFolderError
from test_report_html import continuation_frames, made_runs  # noqa: F401  (made_runs: a fixture)

PAYLOAD = """
from pathlib import Path
Path({marker!r}).write_text("imported")
from cmbench.data.adapter import DatasetAdapter
class X(DatasetAdapter):
    pass
"""


def name_adapter(run, adapter: str) -> None:
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("  manifest: metadata.jsonl\n",
                                                  f"  manifest: metadata.jsonl\n  adapter: {adapter}\n"))


def test_report_never_imports_an_adapter_named_by_a_run_folder(made_runs, tmp_path, monkeypatch):  # noqa: F811
    tmp, data, full, deco = made_runs
    code = tmp_path / "code"
    code.mkdir()
    marker = tmp_path / "imported"
    (code / "payload_mod.py").write_text(PAYLOAD.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(code))  # `python -m` makes the working directory importable
    name_adapter(deco, "payload_mod:X")
    with pytest.raises(ReportError, match=r"deco: its config\.yaml names the dataset adapter 'payload_mod:X'"):
        build_report([full, deco], tmp / "report")
    assert not marker.exists()
    name_adapter(full, "this.Zen")
    with pytest.raises(ReportError, match="'this.Zen'"):
        build_report([full], tmp / "report")
    assert not marker.exists()
    # the user's own config search path may name code: a data config there naming the adapter trusts it
    configs = tmp_path / "configs"
    (configs / "data").mkdir(parents=True)
    (configs / "data" / "mine.yaml").write_text("name: mine\nroot: data/mine\nadapter: payload_mod:X\n")
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(configs))
    assert build_report([deco], tmp / "report").tasks == 3
    assert marker.exists()


def test_report_shows_only_videos_inside_their_folder(made_runs, tmp_path):  # noqa: F811
    tmp, data, full, deco = made_runs
    secret = tmp_path / "secret" / "holiday.mp4"
    write_video(secret, continuation_frames(5), 16.0)
    rows = [json.loads(x) for x in (deco / "records.jsonl").read_text().splitlines()]
    rows[0]["video"] = str(secret)  # an absolute path anywhere on the reader's disk
    rows[1].update(status="ok", video="../../secret/holiday.mp4")  # or out of the folder by ..
    (deco / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for task in ("syn_a_reappear_01", "syn_a_revisit_01"):
        (deco / "videos" / f"{task}.mp4").unlink()
    text = build_report([full, deco], tmp / "report").index.read_text()
    assert text.count("video outside its folder: not shown") == 2
    assert "holiday" not in "".join(re.findall(r'src="([^"]+)"', text))
    assert len(list((tmp / "report" / "img" / "m01").glob("*.webp"))) == 0


def test_report_refuses_an_output_folder_that_is_not_a_report(made_runs):  # noqa: F811
    tmp, data, full, deco = made_runs
    out = tmp / "photos"
    (out / "img").mkdir(parents=True)
    (out / "img" / "precious.jpg").write_bytes(b"a user's photo")
    with pytest.raises(OutputFolderError, match=r"report\.out=.*photos: not empty and not written by CMBench"):
        build_report([full, deco], out)
    assert (out / "img" / "precious.jpg").read_bytes() == b"a user's photo"
    report = tmp / "report"
    build_report([full, deco], report)
    assert build_report([full, deco], report).tasks == 3  # an earlier report is replaced
    (report / "notes.txt").write_text("mine")  # a report folder holding a user's file is not replaced
    with pytest.raises(OutputFolderError, match="notes.txt is there and CMBench did not write it"):
        build_report([full, deco], report)
    assert (report / "notes.txt").read_text() == "mine"


def test_a_failed_report_leaves_the_previous_page_whole(made_runs, monkeypatch):  # noqa: F811
    tmp, data, full, deco = made_runs
    out = tmp / "report"
    build_report([full, deco], out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    calls = []

    def fails_on_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    real = gallery.continuation_images
    monkeypatch.setattr(gallery, "continuation_images", fails_on_the_third)
    with pytest.raises(ReportError, match=r"cannot write the report into .*report: .*No space left on device"):
        build_report([full, deco], out)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".")) == []


def test_report_reads_only_the_frames_it_shows(made_runs, monkeypatch):  # noqa: F811
    """A continuation whose header claims 16M frames (a 1.8 KB file can) allocates nothing for them."""
    import cmbench.data.video as video

    tmp, data, full, deco = made_runs
    monkeypatch.setattr(video, "probe_video", lambda path: (16_000_000, 16.0, 16, 16))
    tracemalloc.start()
    try:
        build_report([full, deco], tmp / "report")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200e6


def test_sample_frames_keeps_at_most_what_is_shown(tmp_path):
    from cmbench.data.video import sample_frames

    frames = np.stack([np.full((8, 8, 3), i, np.uint8) for i in range(100)])
    write_video(tmp_path / "v.mkv", frames, 16.0, codec="FFV1")
    sample = sample_frames(tmp_path / "v.mkv", most=10, keep=37)
    assert sample.count == 100 and len(sample.frames) <= 10 and sample.spacing == 16 and sample.fps == 16.0
    assert [int(f[0, 0, 0]) for f in sample.frames] == list(range(0, 100, 16))
    assert int(sample.kept[0, 0, 0]) == 37
    sample = sample_frames(tmp_path / "v.mkv", most=200, transform=lambda f: f[:4, :2])
    assert sample.frames.shape == (100, 4, 2, 3) and sample.spacing == 1 and sample.kept is None


def test_the_losses_list_says_how_many_tasks_it_shows(made_runs):  # noqa: F811
    tmp, data, full, deco = made_runs
    text = build_report([full, deco], tmp / "report").index.read_text()
    assert "The 2 tasks with the largest paired score drop" in text  # deco finished 2 of its 3 tasks
    assert "The 8 tasks" not in text


def test_plots_keep_scores_and_their_intervals_in_the_score_range(tmp_path, monkeypatch):
    import matplotlib.figure
    import pandas as pd

    from cmbench.report.curves import curves_plot
    from cmbench.report.leaderboard import pareto_plot

    limits, bands = [], []
    real = matplotlib.figure.Figure.savefig

    def savefig(self, *args, **kwargs):
        limits.append(self.axes[0].get_ylim())
        bands.extend(c.get_paths()[0].vertices[:, 1] for c in self.axes[0].collections if c.get_paths())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    board = pd.DataFrame({"method": ["a", "b"], "metric": ["light"] * 2, "pr": [0.5, 0.9], "score": [0.6, 0.1],
                          "score_ci95": [3.0, float("nan")]})  # one degree of freedom: a CI wider than the range
    pareto_plot(board, tmp_path / "pareto.png")
    curves = pd.DataFrame({"method": ["a", "a"], "test_pr": [0.5, 0.9], "score": [0.6, 0.05],
                           "ci_low": [-0.9, -0.5], "ci_high": [1.8, 0.4]})
    curves_plot(curves, tmp_path / "curves.png", reference=(0.7, 2.0))
    for low, high in limits:
        assert -0.1 <= low <= 0 and 1 <= high <= 1.1
    assert bands and all(v.min() >= 0 and v.max() <= 1 for v in bands)
