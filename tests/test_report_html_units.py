"""The HTML report's pieces one at a time, on hand-built records and stand-ins for slow parts.

Checked here: how a value is formatted by its column (every branch and its precedence), the table a
DataFrame becomes, where a folder's dataset is and which adapters it may name, which video a record
may show, a method's gallery cell (stand-ins for the decoder and the image writer), the "loses most"
panel and the provenance facts with hand-computed numbers, the build/swap of the report folder
(:func:`build_report` with the page writer stubbed), and one small real page (records only, no
continuation videos) for what :func:`_write_page` puts where. The slow end-to-end page with videos
is ``test_report_html.py``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from html import unescape
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from cmbench.data import load_manifest
from cmbench.report import html
from cmbench.report.gate import MARGIN
from cmbench.report.html import Cell, format_value
from cmbench.report.leaderboard import MATCHED_NOTE, ReportError
from cmbench.report.reading import RunRecords
from cmbench.runs.output_folder import OutputFolderError
from official_fixture import official_row, write_context_video, write_manifest
from test_report import record, write_run


def run_of(label: str, rows: list[dict], path: Path | None = None, **over) -> RunRecords:
    """A leaderboard entry built by hand: ``rows`` as its frame (``status`` ok unless given)."""
    frame = pd.DataFrame([{"status": "ok", **r} for r in rows])
    return RunRecords(path=path or Path(f"/runs/{label}"), label=label, frame=frame, **over)


def page_tables(text: str) -> list[str]:
    """The ids of the page's tables, in page order."""
    return re.findall(r'<section class="table-block" id="([^"]+)">', text)


# ---------------------------------------------------------------- format_value and table


@pytest.mark.parametrize("column, value, text", [
    ("score_ci95", 0.014815, "± 0.0148"),
    ("DELTA_CI95", 0.5, "± 0.5000"),  # the column name is read case-insensitively
    ("pr", 0.94031, "94.03%"),
    ("PR", 0.5, "50.00%"),
    ("context_pr", 0.125, "12.50%"),
    ("pr_at_target", 0.25, "25.00%"),
    ("peak_kv_bytes", 54_530_000.0, "54.53"),  # MB: 54_530_000 / 1e6
    ("speedup_vs_fullkv", 7.341, "7.34x"),
    ("continuation_fps", 12.345, "12.3"),
    ("prefill_seconds", 2.34, "2.3"),
    ("attention_keys_per_token", 1234567.4, "1,234,567"),
    ("attention_flops", 2500.6, "2,501"),
    ("score", 0.95461, "0.9546"),
    # precedence: the first rule in the documented order wins
    ("pr_ci95", 0.5, "± 0.5000"),  # ci95 before pr
    ("pr_bytes", 0.5, "50.00%"),  # pr before bytes
    ("bytes_speedup", 3_000_000.0, "3.00"),  # bytes before speedup
    ("fps_speedup", 2.0, "2.00x"),  # speedup before fps
    ("fps_per_token", 1234.56, "1234.6"),  # fps before per_token
    ("seconds_flops", 1234.56, "1234.6"),  # seconds before flops
    ("kv_bytes_ratio", 0.1255, "12.55%"),  # a share of FullKV's bytes, not MB
    ("psnr_vs_fullkv", 31.2345, "31.23"),  # dB
    ("last_frame_ssim_vs_fullkv", 0.87654, "0.8765"),
    ("prune", 0.5, "0.5000"),  # starts with "pr" but not "pr_": a plain number
    ("sprint_pr_x", 0.5, "0.5000"),  # "_pr" inside, not at the end
])
def test_a_float_is_formatted_by_what_its_column_name_says(column, value, text):
    cell = format_value(column, value)
    assert cell == Cell(text, repr(float(value)), True)
    assert format_value(column, np.float32(value)).text == format_value(column, float(np.float32(value))).text


def test_an_infinite_psnr_shows_as_infinity_and_sorts_as_javascripts_infinity():
    assert format_value("psnr_vs_fullkv", math.inf) == Cell("∞", "Infinity", True)  # identical frames
    assert format_value("score", -math.inf) == Cell("-inf", "-Infinity", True)


def test_missing_bool_int_and_text_values():
    assert format_value("score", None) == Cell("—", "", True)
    assert format_value("score", math.nan) == Cell("—", "", True)
    assert format_value("score", np.float64("nan")) == Cell("—", "", True)
    assert format_value("fps_measured_together", True) == Cell("yes", "1", True)
    assert format_value("passes", False) == Cell("no", "0", True)
    assert format_value("passes", np.bool_(True)) == Cell("yes", "1", True)
    assert format_value("pr", 3) == Cell("3", "3", True)  # an int is a count, whatever the column
    assert format_value("n_tasks", np.int64(116)) == Cell("116", "116", True)
    assert format_value("method", "DeCoPrune") == Cell("DeCoPrune", "decoprune", False)
    assert format_value("versions", {"A": 1}) == Cell("{'A': 1}", "{'a': 1}", False)


def test_a_table_has_every_column_in_order_headed_by_its_label():
    frame = pd.DataFrame({"method": ["a", "b"], "metric": ["DINO", "light"], "score": [0.5, math.nan],
                          "n_tasks": [3, 4], "my_new_column": ["x", "Y"]})
    t = html.table("board", "The board", frame, "a note")
    assert (t.id, t.title, t.note) == ("board", "The board", "a note")
    # score is headed by the metric(s) the board reports; an unknown column by its name, spaced
    assert t.columns == [("method", "Method"), ("metric", "Metric"), ("score", "DINO / light"), ("n_tasks", "Tasks"),
                         ("my_new_column", "my new column")]
    assert t.rows == [
        [Cell("a", "a", False), Cell("DINO", "dino", False), Cell("0.5000", "0.5", True), Cell("3", "3", True),
         Cell("x", "x", False)],
        [Cell("b", "b", False), Cell("light", "light", False), Cell("—", "", True), Cell("4", "4", True),
         Cell("Y", "y", False)],
    ]
    assert html.table("t", "T", frame).note == ""
    assert html.LABELS["score"] == "Score"  # the shared labels are not changed by a board's metric


def test_a_table_without_metric_rows_keeps_the_plain_score_header():
    empty = pd.DataFrame({"method": pd.Series([], dtype=str), "metric": pd.Series([], dtype=str),
                          "score": pd.Series([], dtype=float)})
    t = html.table("e", "E", empty)
    assert t.columns == [("method", "Method"), ("metric", "Metric"), ("score", "Score")] and t.rows == []
    no_metric = html.table("n", "N", pd.DataFrame({"score": [0.25], "delta_vs_fullkv": [0.125]}))
    assert no_metric.columns == [("score", "Score"), ("delta_vs_fullkv", "Δ score vs FullKV")]


# ---------------------------------------------------------------- comparison_table


def test_comparison_table_puts_each_sides_pr_after_its_name(monkeypatch):
    seen = {}

    def pairs(runs, focus, compare):
        seen["pairs"] = (runs, focus, compare)
        return [("b", "a")]

    def comparisons(runs, wanted):
        seen["comparisons"] = (runs, wanted)
        return pd.DataFrame({"method": ["b", "a"], "versus": ["a", "c"], "delta": [0.1, -0.2]})

    monkeypatch.setattr(html, "comparison_pairs", pairs)
    monkeypatch.setattr(html, "comparisons", comparisons)
    board = pd.DataFrame({"method": ["a", "b"], "pr": [0.0, 0.9]})
    out = html.comparison_table(["runs"], board, focus=["b"], compare=[["b", "a"]])
    assert seen == {"pairs": (["runs"], ["b"], [["b", "a"]]), "comparisons": (["runs"], [("b", "a")])}
    assert list(out.columns) == ["method", "pr", "versus", "versus_pr", "delta"]
    assert out["pr"].tolist() == [0.9, 0.0] and out["versus_pr"].tolist()[0] == 0.0
    assert math.isnan(out["versus_pr"].tolist()[1])  # c is not on the board
    assert out["pr"].dtype == float and out["versus_pr"].dtype == float
    html.comparison_table(["runs"], board)  # by default, the leaderboard's own pairs
    assert seen["pairs"] == (["runs"], None, None)


# ---------------------------------------------------------------- datasets and adapters


@pytest.fixture
def dataset(tmp_path):
    """Two manifests: ``data/`` (tasks a1, a2, b1) and ``other/`` (a1 with another target, c1)."""
    data = write_manifest(tmp_path / "data", [
        official_row("a1", "videos/synthetic/a.mp4"),
        official_row("a2", "videos/synthetic/a.mp4", task_type="revisit"),
        official_row("b1", "videos/real/b.mp4", source="real"),
    ])
    other = write_manifest(tmp_path / "other", [
        official_row("a1", "videos/synthetic/a.mp4", target_label="blue cup"),
        official_row("c1", "videos/synthetic/c.mp4"),
    ])
    return data, other


def folder_with(tmp_path: Path, name: str, config: str | None) -> Path:
    """A run folder holding only ``config.yaml`` (none when ``config`` is None)."""
    folder = tmp_path / name
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.yaml").write_text(config)
    return folder


def test_the_dataset_of_a_folder_is_its_manifest_or_the_one_in_data_root(tmp_path, dataset):
    data, other = dataset
    folder = folder_with(tmp_path, "run", "data:\n  adapter: official\n  root: /old/place\n  name: x\n")
    run = run_of("r", [{"task_id": "a1"}], folder, manifest=data)
    assert html._dataset_of(run, None) == (data, {"adapter": "official", "root": str(data.parent), "name": "x",
                                                  "manifest": "metadata.jsonl"})
    moved = run_of("r", [{"task_id": "a1"}], folder, manifest=Path("/old/place/metadata.jsonl"))
    assert html._dataset_of(moved, other.parent)[0] == other  # data_root / the manifest's own name
    renamed = other.parent / "tasks.jsonl"
    renamed.write_text(other.read_text())
    named = run_of("r", [{"task_id": "a1"}], folder, manifest=Path("/old/tasks.jsonl"))
    assert html._dataset_of(named, other.parent) == (renamed, {"adapter": "official", "root": str(other.parent),
                                                              "name": "x", "manifest": "tasks.jsonl"})
    # a folder naming no manifest: metadata.jsonl in data_root; its config's data is not a mapping: none
    bare = folder_with(tmp_path, "bare", "data: just text\n")
    assert html._dataset_of(run_of("r", [], bare), data.parent) == (
        data, {"root": str(data.parent), "manifest": "metadata.jsonl"})


def test_a_folder_without_a_dataset_says_to_pass_data_root(tmp_path, dataset):
    folder = folder_with(tmp_path, "run", None)
    with pytest.raises(ReportError, match=r"run: names no dataset \(no data\.root in its config\.yaml\); pass the "
                                          r"dataset's location as report\.data_root=DIR"):
        html._dataset_of(run_of("r", [], folder), None)
    gone = tmp_path / "gone" / "metadata.jsonl"
    with pytest.raises(ReportError, match=rf"run: its tasks' manifest {re.escape(str(gone))} is not there; pass the "
                                          r"dataset's current location as report\.data_root=DIR"):
        html._dataset_of(run_of("r", [], folder, manifest=gone), None)
    with pytest.raises(ReportError, match="is not there"):  # data_root without a manifest in it
        html._dataset_of(run_of("r", [], folder, manifest=dataset[0]), tmp_path / "empty")


@pytest.fixture
def user_configs(tmp_path, monkeypatch):
    """A user config folder (``CMBENCH_CONFIG_PATH``) whose ``data/`` holds the yaml files written into it."""
    folder = tmp_path / "configs"
    (folder / "data").mkdir(parents=True)
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(folder))

    def write(files: dict[str, str]) -> None:
        for name, text in files.items():
            (folder / "data" / name).write_text(text)
    return write


def test_user_adapters_are_those_the_users_data_configs_name(user_configs):
    user_configs({
        "a_broken.yaml": "adapter: [unclosed\n",  # sorted first: unreadable, skipped, the rest still read
        "b_list.yaml": "- adapter: listed\n",  # not a mapping: names nothing
        "c_empty.yaml": "adapter: ''\n",
        "d_none.yaml": "name: x\n",
        "e_mine.yaml": "adapter: mypkg.data:MyAdapter\n",
        "f_num.yaml": "adapter: 7\n",
        "not_yaml.txt": "adapter: txt_adapter\n",
    })
    assert html.user_adapters() == {"official", "miniworld", "mypkg.data:MyAdapter", "7"}


def test_only_registered_or_user_named_adapters_are_trusted(tmp_path, user_configs):
    run = run_of("r", [], tmp_path / "run")
    html.check_adapter(run, {})  # official when not named
    html.check_adapter(run, {"adapter": None})
    html.check_adapter(run, {"adapter": "miniworld"})
    with pytest.raises(ReportError) as err:
        html.check_adapter(run, {"adapter": "evil.module:Adapter"})
    assert str(err.value) == (
        f"{tmp_path / 'run'}: its config.yaml names the dataset adapter 'evil.module:Adapter', which is neither a "
        "registered adapter (miniworld, official) nor named by a data config of yours (configs/data/, "
        "CMBENCH_CONFIG_PATH); a run folder is data and never names code: add a data config with "
        "`adapter: evil.module:Adapter` to your config path if you trust it")
    user_configs({"mine.yaml": "adapter: evil.module:Adapter\n"})
    html.check_adapter(run, {"adapter": "evil.module:Adapter"})


def test_load_tasks_reads_each_manifest_once_and_keeps_the_first_folders_task(tmp_path, dataset, monkeypatch):
    data, other = dataset
    built = []
    real_build = html.build_adapter
    monkeypatch.setattr(html, "build_adapter", lambda d: built.append(d) or real_build(d))
    one = run_of("one", [{"task_id": t} for t in ("a2", "a1")], folder_with(tmp_path, "one", None), manifest=data)
    two = run_of("two", [{"task_id": "a1"}], folder_with(tmp_path, "two", None), manifest=data)
    three = run_of("three", [{"task_id": t} for t in ("a1", "c1")], folder_with(tmp_path, "three", None),
                   manifest=other)
    found = html.load_tasks([one, two, three])
    assert len(built) == 2  # data once (two runs), other once
    assert list(found) == ["a2", "a1", "c1"]  # the order records are met in
    assert found["a1"][0].target_label == "red vase" and found["c1"][0].target_label == "red vase"
    assert found["a1"][1] is found["a2"][1] and found["c1"][1] is not found["a1"][1]
    assert found["a1"][0].task_id == "a1"
    # data_root: every folder's manifest is looked for there
    only_a1 = run_of("four", [{"task_id": "a1"}], three.path, manifest=other)
    found = html.load_tasks([only_a1], data_root=str(data.parent))
    assert found["a1"][0].target_label == "red vase"  # not "blue cup": data/ read, not other/


def test_load_tasks_reads_a_manifest_by_its_own_file_name(tmp_path, dataset):
    data, _ = dataset
    renamed = data.rename(data.with_name("tasks.jsonl"))  # no metadata.jsonl left beside it
    run = run_of("r", [{"task_id": "b1"}], folder_with(tmp_path, "r", None), manifest=renamed)
    assert html.load_tasks([run])["b1"][0].source == "real"


def test_load_tasks_names_the_first_five_tasks_a_manifest_lacks(tmp_path, dataset):
    data, _ = dataset
    folder = folder_with(tmp_path, "run", None)
    run = run_of("r", [{"task_id": t} for t in ("z6", "a1", "z1", "z5", "z2", "z4", "z3")], folder, manifest=data)
    with pytest.raises(ReportError) as err:
        html.load_tasks([run])
    assert str(err.value) == f"{folder}: records of tasks not in {data}: ['z1', 'z2', 'z3', 'z4', 'z5']"
    evil = folder_with(tmp_path, "evil", "data:\n  adapter: evil.module:Adapter\n")
    with pytest.raises(ReportError, match="names the dataset adapter 'evil.module:Adapter'"):
        html.load_tasks([run_of("e", [{"task_id": "a1"}], evil, manifest=data)])


# ---------------------------------------------------------------- scores, references, best frames


def test_missing_values_and_score_text():
    assert html._missing(None) and html._missing(math.nan) and html._missing(np.float64("nan"))
    assert not html._missing(0.0) and not html._missing("nan") and not html._missing(0)
    assert html._score_text(None) == "—" and html._score_text(math.nan) == "—"
    assert html._score_text(0.123456) == "0.1235" and html._score_text(1) == "1.0000" and html._score_text("0.5") == "0.5000"


class FakeAdapter:
    """Reference frames by hand: ``references(task)`` gives ``frames`` named by ``keys``."""

    def __init__(self, keys: list[str]):
        self.keys = keys

    def references(self, task):
        frames = [np.full((8, 8, 3), 10 * (i + 1), dtype=np.uint8) for i in range(len(self.keys))]
        return SimpleNamespace(frames=lambda: frames, keys=self.keys)


def test_reference_views_name_each_image_by_task_and_reference_and_say_which_frame(tmp_path, monkeypatch):
    write_manifest(tmp_path / "data", [
        official_row("a1", "videos/synthetic/a.mp4"),
        official_row("a2", "videos/synthetic/a.mp4", references=[
            {"timestamp_seconds": 0.5, "frame_index": 8, "bbox_xyxy_normalized": [0.1, 0.2, 0.5, 0.6]},
            {"timestamp_seconds": 1.25, "bbox_xyxy_normalized": [0.0, 0.0, 1.0, 1.0]},
            {"timestamp_seconds": 2.0, "frame_index": 0, "bbox_xyxy_normalized": [0.5, 0.5, 1.0, 1.0]}]),
    ])
    a1, a2 = load_manifest(tmp_path / "data", "metadata.jsonl", check_videos=False)
    drawn = []
    monkeypatch.setattr(html.gallery, "reference_image", lambda path, frame, box: drawn.append((path, frame, box)))
    views = html._reference_views([(a2, FakeAdapter(["video.mp4@12", "pixels:ab12", "x@7a"])),
                                   (a1, FakeAdapter(["video.mp4@3"]))], tmp_path / "out")
    assert list(views) == ["a2", "a1"]
    # a content name ending in @<digits> gives the frame; otherwise the reference's frame_index, else its time
    assert views == {"a2": [{"src": "img/ref/t0000_0.png", "frame": "12"}, {"src": "img/ref/t0000_1.png",
                                                                            "frame": "at 1.25 s"},
                            {"src": "img/ref/t0000_2.png", "frame": 0}],
                     "a1": [{"src": "img/ref/t0001_0.png", "frame": "3"}]}
    assert [(p, f[0, 0, 0], tuple(b)) for p, f, b in drawn] == [
        (tmp_path / "out/img/ref/t0000_0.png", 10, (0.1, 0.2, 0.5, 0.6)),
        (tmp_path / "out/img/ref/t0000_1.png", 20, (0.0, 0.0, 1.0, 1.0)),
        (tmp_path / "out/img/ref/t0000_2.png", 30, (0.5, 0.5, 1.0, 1.0)),
        (tmp_path / "out/img/ref/t0001_0.png", 10, (0.1, 0.2, 0.5, 0.6))]
    assert html._reference_views([], tmp_path) == {}


def test_the_best_frame_is_the_records_own_else_the_argmax_of_its_similarities():
    box = [0.1, 0.2, 0.3, 0.4]
    assert html._best_frame({"best_frame": 4, "best_box": box, "similarities": [0.9]}) == (4, box)
    assert html._best_frame({"best_frame": 2.0, "best_box": (0.5, 0.5, 1.0, 1.0)}) == (2, [0.5, 0.5, 1.0, 1.0])
    assert html._best_frame({"best_frame": 0, "best_box": math.nan}) == (0, None)
    assert html._best_frame({"best_frame": 3}) == (3, None)
    sims, boxes = [0.2, None, 0.7, 0.7], [[0, 0, 1, 1], None, box, [0, 0, 0.5, 0.5]]
    # best_frame missing (None / NaN from the frame): argmax of the similarities (the first of equal ones)
    assert html._best_frame({"best_frame": math.nan, "similarities": sims, "boxes": boxes}) == (2, box)
    assert html._best_frame({"similarities": sims, "boxes": boxes}) == (2, box)
    assert html._best_frame({"similarities": sims, "boxes": boxes[:3]}) == (2, box)  # the last box there
    assert html._best_frame({"similarities": sims, "boxes": boxes[:2]}) == (2, None)  # past the boxes
    assert html._best_frame({"similarities": sims, "boxes": "no"}) == (2, None)
    assert html._best_frame({"similarities": sims}) == (2, None)
    assert html._best_frame({"similarities": [None, None], "boxes": [box, box]}) == (None, None)
    assert html._best_frame({"similarities": math.nan, "boxes": [box]}) == (None, None)
    assert html._best_frame({}) == (None, None)


# ---------------------------------------------------------------- which video a record may show


def make_file(path: Path) -> Path:
    """An (empty) file, its folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_video_roots_are_the_folder_and_for_a_score_output_its_videos_folder(tmp_path):
    gen = tmp_path / "gen"
    scored = folder_with(gen, "scores_light", f"videos: {gen}\n")
    assert html.video_roots(scored) == [scored.resolve(), gen.resolve()]
    assert html.video_roots(folder_with(gen, "s2", f"videos: {gen}/../gen\n")) == [(gen / "s2").resolve(),
                                                                                  gen.resolve()]
    assert html.video_roots(folder_with(gen, "s3", f"videos: {tmp_path}\n")) == [(gen / "s3").resolve()]
    assert html.video_roots(folder_with(gen, "s4", f"videos: [{gen}]\n")) == [(gen / "s4").resolve()]
    assert html.video_roots(folder_with(gen, "s5", "videos: ''\n")) == [(gen / "s5").resolve()]
    assert html.video_roots(folder_with(gen, "s6", None)) == [(gen / "s6").resolve()]


def test_the_continuation_is_the_named_video_else_the_lossless_else_the_mp4_one(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    assert html.continuation_video(folder, {"task_id": "t"}) is None
    mp4 = make_file(folder / "videos/t.mp4")
    assert html.continuation_video(folder, {"task_id": "t"}) == mp4
    mkv = make_file(folder / "videos/t.mkv")
    assert html.continuation_video(folder, {"task_id": "t", "video": ""}) == mkv
    assert html.continuation_video(folder, {"task_id": "t", "video": math.nan}) == mkv
    named = make_file(folder / "elsewhere/t.webm")
    assert html.continuation_video(folder, {"task_id": "t", "video": "elsewhere/t.webm"}) == named
    assert html.continuation_video(folder, {"task_id": "t", "video": str(named)}) == named
    assert html.continuation_video(folder, {"task_id": "t", "video": "elsewhere/gone.webm"}) == mkv
    monkeypatch.chdir(tmp_path)  # a relative name not in the folder: as given (from the working directory)
    assert html.continuation_video(folder, {"task_id": "t", "video": "run/elsewhere/t.webm"}) == Path(
        "run/elsewhere/t.webm")


def test_a_video_outside_the_folder_is_never_taken(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    outside = make_file(tmp_path / "secret.mp4")
    with pytest.raises(html.OutsideFolder) as err:
        html.continuation_video(folder, {"task_id": "t", "video": str(outside)})
    assert str(err.value) == f"{folder}: task t: its video {outside} is outside the folder"
    assert isinstance(err.value, ReportError)
    with pytest.raises(html.OutsideFolder, match="its video ../secret.mp4 is outside"):
        html.continuation_video(folder, {"task_id": "t", "video": "../secret.mp4"})
    (folder / "videos").mkdir()
    (folder / "videos/t.mp4").symlink_to(outside)  # a link out of the folder is outside too
    with pytest.raises(html.OutsideFolder, match="its video None is outside"):
        html.continuation_video(folder, {"task_id": "t"})
    inside = make_file(folder / "videos/t.mkv")
    assert html.continuation_video(folder, {"task_id": "t", "video": str(outside)}) == inside
    # a score output may show the videos of the folder it sits in, when its config names that one
    gen = tmp_path / "gen"
    scored = folder_with(gen, "scores_light", f"videos: {gen}\n")
    video = make_file(gen / "t.mp4")
    assert html.continuation_video(scored, {"task_id": "t", "video": str(video)}) == video


# ---------------------------------------------------------------- a method's gallery cell


@pytest.fixture
def drawn(monkeypatch):
    """Stand-ins for the decoder and the image writer: ``drawn.sample`` is what :func:`sample_frames` returns
    (``frames`` 0..3 filled with their index), ``drawn.calls`` what each was called with."""
    state = SimpleNamespace(calls=[])
    frames = np.stack([np.full((4, 4, 3), i, dtype=np.uint8) for i in range(4)])
    state.sample = SimpleNamespace(frames=frames, fps=30.0, spacing=3, count=10, kept=np.full((4, 4, 3), 99, np.uint8))

    def sample_frames(path, most, keep=None, transform=None):
        state.calls.append(("sample", path, most, keep, transform))
        return state.sample

    def continuation_images(animation, best, frames, fps, best_frame, box):
        state.calls.append(("images", animation, best, frames, fps, int(best_frame[0, 0, 0]), box))

    monkeypatch.setattr(html, "sample_frames", sample_frames)
    monkeypatch.setattr(html.gallery, "continuation_images", continuation_images)
    return state


def cell_of(tmp_path: Path, fields: dict, seeds=(1,), index: int = 3, number: int = 12) -> dict:
    """:func:`_method_cell` of a record of ``fields`` (its folder ``tmp_path/run``) for an entry of ``seeds``."""
    run = run_of("deco", [{"run_seed": s} for s in seeds], tmp_path / "run")
    return html._method_cell(run, index, {"task_id": "t", "folder": str(tmp_path / "run"), **fields}, number,
                             tmp_path / "out")


def test_a_failed_record_shows_the_last_line_of_its_error(tmp_path, drawn):
    long = "RuntimeError: " + "x" * 400
    cell = cell_of(tmp_path, {"status": "failed", "score": None, "error": f"Traceback\n  at line 3\n{long}\n\n"})
    assert cell == {"method": "deco", "status": "failed", "score": "—", "error": long[:300], "animation": None,
                    "best": None, "seed": None}
    assert len(cell["error"]) == 300
    for error in (None, math.nan, "  \n \n"):
        assert cell_of(tmp_path, {"status": "oom", "score": 0.5, "error": error})["error"] == "failed"
    assert cell_of(tmp_path, {"status": "oom", "score": 0.5, "error": "one line"})["score"] == "0.5000"
    assert drawn.calls == []


def test_a_finished_record_without_a_video_says_so(tmp_path, drawn):
    cell = cell_of(tmp_path, {"score": 0.25, "detection_rate": 0.375, "best_frame": 2})  # status ok by default
    assert cell == {"method": "deco", "status": "ok", "score": "0.2500", "error": "no video saved (save_videos=false?)",
                    "animation": None, "best": None, "seed": None, "best_frame": 2, "detection_rate": "38%"}
    assert cell_of(tmp_path, {"score": 0.25, "detection_rate": math.nan})["detection_rate"] == "—"
    assert cell_of(tmp_path, {"score": 0.25, "detection_rate": 1})["detection_rate"] == "100%"
    assert cell_of(tmp_path, {"score": 0.25})["detection_rate"] == "—"
    # the seed is shown for an entry of several seeds only
    assert cell_of(tmp_path, {"score": 0.25, "run_seed": 2}, seeds=(2, 3))["seed"] == 2
    assert cell_of(tmp_path, {"score": 0.25, "run_seed": 2}, seeds=(2, 2))["seed"] is None
    outside = make_file(tmp_path / "secret.mp4")
    cell = cell_of(tmp_path, {"score": 0.25, "video": str(outside)})
    assert cell["error"] == "video outside its folder: not shown" and cell["animation"] is None
    assert drawn.calls == []


def test_a_shown_continuation_is_sampled_and_drawn_under_its_method_and_task_number(tmp_path, drawn):
    video = make_file(tmp_path / "run/videos/t.mp4")
    box = [0.25, 0.25, 0.75, 0.75]
    cell = cell_of(tmp_path, {"score": 0.5, "best_frame": 5, "best_box": box, "detection_rate": 0.5})
    assert cell["animation"] == "img/m03/t0012.webp" and cell["best"] == "img/m03/t0012_best.png"
    assert cell["frames"] == 10 and cell["error"] == "" and cell["best_frame"] == 5
    out = tmp_path / "out"
    # 30 fps sampled every 3rd frame: 10 fps; the kept best frame (filled with 99) with its box
    assert drawn.calls == [("sample", video, html.gallery.MAX_ANIMATION_FRAMES, 5, html.gallery.shrink),
                           ("images", out / "img/m03/t0012.webp", out / "img/m03/t0012_best.png",
                            drawn.sample.frames, 10.0, 99, box)]
    # never detected: the last sampled frame (filled with 3) and no box; a header without a rate: 16 fps
    drawn.calls.clear()
    drawn.sample.kept, drawn.sample.fps, drawn.sample.spacing = None, None, 2
    cell = cell_of(tmp_path, {"score": 0.0, "similarities": [None, None]}, index=0, number=7)
    assert cell["animation"] == "img/m00/t0007.webp" and cell["best_frame"] is None
    assert drawn.calls[0][3] is None and drawn.calls[1][4:] == (8.0, 3, None)  # 16 / 2


def test_a_best_frame_past_the_end_of_the_video_is_an_error(tmp_path, drawn):
    video = make_file(tmp_path / "run/videos/t.mkv")
    drawn.sample.kept = None
    with pytest.raises(ReportError) as err:
        cell_of(tmp_path, {"score": 0.5, "best_frame": 10})
    assert str(err.value) == (f"{tmp_path / 'run'}: task t: the record's best frame 10 is past the end of {video} "
                              "(10 frames)")


# ---------------------------------------------------------------- where a method loses most


def test_losses_list_the_largest_mean_paired_drops_first(tmp_path):
    ref_rows = [{"task_id": f"t{i}", "seed": 0, "score": 1.0} for i in range(10)]
    ref_rows[7] = {"task_id": "t7", "seed": 0, "score": None, "status": "failed"}
    ref_rows.append({"task_id": "t1", "seed": 1, "score": 0.5})
    reference = run_of("fullkv", ref_rows)
    mine = run_of("mine", [
        {"task_id": "t4", "seed": 0, "score": 1.25},  # drop -0.25: last
        {"task_id": "t2", "seed": 0, "score": 0.75},  # drop 0.25, ties with t1: by task id
        {"task_id": "t5", "seed": 0, "score": None, "status": "failed"},  # not finished: no pair
        {"task_id": "t1", "seed": 0, "score": 0.75},  # drops 0.25 and 0.25 (reference 1.0 and 0.5)
        {"task_id": "t1", "seed": 1, "score": 0.25},
        {"task_id": "t7", "seed": 0, "score": 0.5},  # the reference failed: no pair
        {"task_id": "t1", "seed": 5, "score": 0.0},  # a seed the reference lacks: no pair
        {"task_id": "t99", "seed": 0, "score": 0.0},  # a task the reference lacks
        {"task_id": "t3", "seed": 0, "score": 0.0},  # drop 1.0: first
    ])
    # nine tasks with drops i / 16 (t7 unpaired): the eight largest, t0's zero left out
    many = run_of("many", [{"task_id": f"t{i}", "seed": 0, "score": 1 - i / 16} for i in range(10)])
    failed = run_of("failed", [{"task_id": "t1", "seed": 0, "score": None, "status": "failed"}])
    losses = html._losses([mine, reference, many, failed])
    assert list(losses) == ["mine", "many", "failed"]
    assert losses["mine"] == [
        {"task_id": "t3", "reference": "1.0000", "score": "0.0000", "drop": "+1.0000", "seeds": 1},
        {"task_id": "t1", "reference": "0.7500", "score": "0.5000", "drop": "+0.2500", "seeds": 2},  # means
        {"task_id": "t2", "reference": "1.0000", "score": "0.7500", "drop": "+0.2500", "seeds": 1},
        {"task_id": "t4", "reference": "1.0000", "score": "1.2500", "drop": "-0.2500", "seeds": 1},
    ]
    assert [r["task_id"] for r in losses["many"]] == ["t9", "t8", "t6", "t5", "t4", "t3", "t2", "t1"]
    assert losses["many"][0]["drop"] == "+0.5625" and losses["many"][-1]["drop"] == "+0.0625"  # 9/16, 1/16
    assert losses["failed"] == []
    assert html._losses([mine, many]) == {}  # no FullKV entry: nothing to lose against
    assert html.LOSSES_SHOWN == 8


# ---------------------------------------------------------------- provenance


def test_provenance_counts_each_fact_over_the_records(tmp_path):
    folder = folder_with(tmp_path, "run", "method:\n  name: deco\n")
    nan = math.nan
    frame_rows = [
        {"kind": "run", "config_hash": "h2", "method": "deco", "scorer": "light", "schema_version": 3,
         "versions": {"torch": "2.1", "cmbench": "0.1"}, "status": "ok"},
        {"kind": "run", "config_hash": "h1", "method": "deco", "scorer": nan, "schema_version": 3,
         "versions": {"torch": "2.1", "cmbench": "0.1"}, "status": "failed"},
        {"kind": "run", "config_hash": "h2", "method": "deco", "scorer": "light", "schema_version": 4,
         "versions": nan, "status": "oom"},
    ]
    run = run_of("deco", frame_rows, folder, manifest=Path("/data/metadata.jsonl"), checked=True)
    got = html._provenance(run)
    assert got == {
        "label": "deco", "path": str(folder), "records": 3, "failures": 2, "config": "method:\n  name: deco\n",
        "facts": [("kind", [("run", 3)]), ("config hash", [("h1", 1), ("h2", 2)]), ("method", [("deco", 3)]),
                  ("scorer", [("light", 2)]), ("versions", [("cmbench 0.1, torch 2.1", 2)]),
                  ("record schema", [("3", 2), ("4", 1)]), ("manifest", [("/data/metadata.jsonl", 3)])],
    }
    dropped = tuple(f"x{i:02d}" for i in range(12))
    unchecked = run_of("d", frame_rows[:1], tmp_path / "none", manifest=Path("/m.jsonl"), dropped=dropped)
    facts = dict(html._provenance(unchecked)["facts"])
    assert facts["manifest"] == [("/m.jsonl (not there: records not checked against it)", 1)]
    assert facts["left out"] == [("records of 12 task(s) not in the manifest: "
                                  "x00, x01, x02, x03, x04, x05, x06, x07, x08, x09", 12)]
    bare = html._provenance(run_of("b", frame_rows[:1], tmp_path / "none"))
    assert bare["config"] == "(no config.yaml in the run directory)" and bare["failures"] == 0
    assert [name for name, _ in bare["facts"]] == ["kind", "config hash", "method", "scorer", "versions",
                                                    "record schema"]
    everything = {"kind": "k", "config_hash": "c", "method": "m", "backbone": "b", "scorer": "s", "scorer_hash": "sh",
                  "metric": "DINO", "git_commit": "g", "versions": "v", "schema_version": 1}
    assert [name for name, _ in html._provenance(run_of("e", [everything], tmp_path / "none"))["facts"]] == [
        "kind", "config hash", "method", "backbone", "scorer", "scorer hash", "metric", "git commit", "versions",
        "record schema"]


# ---------------------------------------------------------------- the report folder: build, swap, refuse


def report_folder(path: Path, extra: dict[str, str] | None = None, page: str = html.GENERATOR) -> Path:
    """An earlier report: ``index.html`` holding ``page``, ``img/old.png``, plus any ``extra`` files."""
    (path / "img").mkdir(parents=True)
    (path / "index.html").write_text(f"<html><head>{page}</head></html>")
    (path / "img/old.png").write_bytes(b"old")
    for name, text in (extra or {}).items():
        (path / name).write_text(text)
    return path


def test_a_report_folder_holds_only_our_page_and_images(tmp_path):
    assert html.is_report(report_folder(tmp_path / "r"))
    only_page = tmp_path / "p"
    only_page.mkdir()
    (only_page / "index.html").write_text(html.GENERATOR)
    assert html.is_report(only_page)
    assert not html.is_report(report_folder(tmp_path / "extra", {"notes.txt": "mine"}))
    assert not html.is_report(report_folder(tmp_path / "theirs", page='<meta name="generator" content="Other">'))
    # only the first 4096 characters are read: "<html><head>" (12), padding, then the marker
    fits = 4096 - 12 - len(html.GENERATOR)
    assert html.is_report(report_folder(tmp_path / "early", page="x" * fits + html.GENERATOR))
    assert not html.is_report(report_folder(tmp_path / "late", page="x" * (fits + 1) + html.GENERATOR))
    only_img = tmp_path / "i"
    (only_img / "img").mkdir(parents=True)
    assert not html.is_report(only_img)
    folder_page = tmp_path / "f"
    (folder_page / "index.html").mkdir(parents=True)
    assert not html.is_report(folder_page)
    linked = tmp_path / "l"
    linked.mkdir()
    (linked / "index.html").symlink_to(tmp_path / "r/index.html")
    assert not html.is_report(linked)


def test_a_report_page_with_bytes_that_are_not_utf8_is_still_recognised(tmp_path):
    folder = report_folder(tmp_path / "r")
    (folder / "index.html").write_bytes(b"\xff\xfe<html>" + html.GENERATOR.encode() + b"</html>")
    assert html.is_report(folder)


def test_the_output_folder_must_be_new_empty_or_an_earlier_report(tmp_path):
    html.check_report_folder(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    html.check_report_folder(tmp_path / "empty")
    html.check_report_folder(report_folder(tmp_path / "old"))
    mine = report_folder(tmp_path / "mine", {"thesis.tex": "years of work"})
    with pytest.raises(OutputFolderError) as err:
        html.check_report_folder(mine)
    assert str(err.value) == (f"report.out={mine}: not empty and not written by CMBench (it holds img, index.html, "
                              "thesis.tex); choose an empty or new folder for report.out, so nothing of yours is replaced")
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "old")
    for bad, what in (("file", "is a file, not a folder"), ("link", "is a link (an output folder is never written "
                                                                     "through one)")):
        with pytest.raises(OutputFolderError) as err:
            html.check_report_folder(tmp_path / bad)
        assert str(err.value) == (f"report.out={tmp_path / bad}: {what}; choose an empty or new folder for "
                                  "report.out, so nothing of yours is replaced")


DEAD = 2 ** 22 + 12345  # above Linux's default pid_max: no process has it


def test_stale_builds_of_killed_reports_are_removed_and_a_moved_aside_report_restored(tmp_path):
    out = tmp_path / "report"
    prefix = ".report.report-"
    for name in (f"{DEAD}", f"{DEAD + 1}-old", f"{os.getpid()}", "abc"):
        (tmp_path / (prefix + name)).mkdir()
    (tmp_path / (prefix + f"{DEAD + 1}-old" + "/index.html")).write_text("restored")
    (tmp_path / f"{prefix}{DEAD + 2}").write_text("a file, not a build folder")
    gone = html.remove_stale_builds(out)
    assert gone == [tmp_path / f"{prefix}{DEAD}"]
    assert (out / "index.html").read_text() == "restored"  # out was missing: the earlier report is back
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([f"{prefix}{os.getpid()}", f"{prefix}abc", f"{prefix}{DEAD + 2}", "report"])
    (tmp_path / f"{prefix}{DEAD + 3}-old").mkdir()  # out exists now: the old copy is stale
    assert html.remove_stale_builds(out) == [tmp_path / f"{prefix}{DEAD + 3}-old"]
    assert (out / "index.html").read_text() == "restored" and not (tmp_path / f"{prefix}{DEAD + 3}-old").exists()


def test_a_stale_build_that_cannot_be_removed_does_not_stop_the_report(tmp_path, monkeypatch):
    stale = tmp_path / f".report.report-{DEAD}"
    stale.mkdir()

    def refused(path, ignore_errors=False, **kw):
        """rmtree on a folder another user owns: an error unless errors are ignored."""
        if not ignore_errors:
            raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(shutil, "rmtree", refused)
    assert html.remove_stale_builds(tmp_path / "report") == [stale]


def test_swap_in_replaces_the_earlier_report_and_restores_it_when_the_move_fails(tmp_path):
    out, build = tmp_path / "report", tmp_path / "build"
    build.mkdir()
    (build / "index.html").write_text("first")
    html.swap_in(build, out)
    assert (out / "index.html").read_text() == "first" and not build.exists()
    build.mkdir()
    (build / "index.html").write_text("second")
    html.swap_in(build, out)
    assert (out / "index.html").read_text() == "second" and sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    with pytest.raises(OSError):
        html.swap_in(tmp_path / "no build", out)
    assert (out / "index.html").read_text() == "second" and sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    with pytest.raises(OSError):
        html.swap_in(tmp_path / "no build", tmp_path / "no report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


@pytest.fixture
def stubbed(monkeypatch):
    """:func:`build_report` with its readers and page writer replaced: ``stubbed.calls`` holds what each got;
    the page writer writes ``index.html`` (just :data:`html.GENERATOR`) and two images (5 and 7 bytes), or raises ``stubbed.error``."""
    state = SimpleNamespace(calls={}, error=None)

    def load_runs(run_dirs, allow_mixed, shared_tasks=False):
        state.calls["load_runs"] = (list(run_dirs), allow_mixed)
        return ["run a", "run b"]

    def load_tasks(runs, data_root):
        state.calls["load_tasks"] = (runs, data_root)
        return {"t1": None, "t2": None, "t3": None}

    def write_page(runs, tasks, out, **kwargs):
        state.calls["write_page"] = (runs, tasks, out, kwargs)
        if state.error is not None:
            raise state.error
        (out / "img/sub").mkdir()
        (out / "img/a.png").write_bytes(b"12345")
        (out / "img/sub/b.png").write_bytes(b"1234567")
        (out / "index.html").write_text(html.GENERATOR)
        return out / "index.html", ["b", "a"]

    monkeypatch.setattr(html, "load_runs", load_runs)
    monkeypatch.setattr(html, "load_tasks", load_tasks)
    monkeypatch.setattr(html, "_write_page", write_page)
    return state


def test_build_report_builds_beside_the_folder_and_swaps_it_in(tmp_path, stubbed, capsys):
    out = report_folder(tmp_path / "report")
    result = html.build_report(["x", "y"], out)
    assert stubbed.calls["load_runs"] == (["x", "y"], False)
    assert stubbed.calls["load_tasks"] == (["run a", "run b"], None)
    runs, tasks, build, kwargs = stubbed.calls["write_page"]
    assert runs == ["run a", "run b"] and list(tasks) == ["t1", "t2", "t3"]
    assert build == tmp_path / f".report.report-{os.getpid()}"
    assert kwargs == {"title": "CMBench report", "focus": None, "compare": None, "curves": None, "allow_suspect": False}
    assert (result.index, result.files, result.bytes, result.methods, result.tasks) == (
        out / "index.html", 3, len(html.GENERATOR) + 5 + 7, ["b", "a"], 3)
    assert 0 <= result.seconds < 60
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [".cmbench-written.json", "img", "img/a.png",
                                                                      "img/sub", "img/sub/b.png", "index.html"]  # the old image is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    assert capsys.readouterr().err == ""
    curves = pd.DataFrame({"method": []})
    html.build_report(["x"], out, allow_mixed=True, data_root="/d", title="T", focus=["f"], compare=[["a", "b"]],
                      curves=curves)
    assert stubbed.calls["load_runs"] == (["x"], True) and stubbed.calls["load_tasks"][1] == "/d"
    assert stubbed.calls["write_page"][3] == {"title": "T", "focus": ["f"], "compare": [["a", "b"]], "curves": curves,
                                              "allow_suspect": False}


def test_build_report_refuses_a_folder_of_yours_before_reading_anything(tmp_path, stubbed):
    mine = report_folder(tmp_path / "mine", {"thesis.tex": "years of work"})
    with pytest.raises(OutputFolderError, match="not empty and not written by CMBench"):
        html.build_report(["x"], mine)
    assert stubbed.calls == {} and (mine / "thesis.tex").is_file()


def test_build_report_says_which_stale_builds_it_removed(tmp_path, stubbed, capsys):
    for name in (f".report.report-{DEAD}", f".report.report-{DEAD + 1}"):
        (tmp_path / name).mkdir()
    html.build_report(["x"], tmp_path / "report")
    assert capsys.readouterr().err == (f"report: removed 2 folder(s) left by killed reports: .report.report-{DEAD}, "
                                       f".report.report-{DEAD + 1}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_a_failed_write_leaves_the_earlier_report_and_no_build_folder(tmp_path, stubbed):
    out = report_folder(tmp_path / "report")
    stubbed.error = OSError(28, "No space left on device")
    with pytest.raises(ReportError) as err:
        html.build_report(["x"], out)
    assert str(err.value) == (f"cannot write the report into {out}: No space left on device (the previous report, "
                              "if any, is unchanged)")
    assert isinstance(err.value.__cause__, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"] and (out / "img/old.png").is_file()
    stubbed.error = OSError("disk gone")
    with pytest.raises(ReportError, match=r"into .*report: disk gone \(the previous report"):
        html.build_report(["x"], out)
    stubbed.error = ValueError("not an OS error")
    with pytest.raises(ValueError):
        html.build_report(["x"], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


# ---------------------------------------------------------------- one small real page


def page_run(root: Path, data: Path, label: str, scores: dict[str, float], **fields) -> Path:
    """A run folder (records only, no videos) of ``label`` with ``scores`` per task, its config naming ``data``."""
    rows = [{**record(label, t, s), "backbone": "tiny", **fields} for t, s in scores.items()]
    folder = write_run(root / label, rows)
    (folder / "config.yaml").write_text(f"data:\n  root: {data}\n  manifest: metadata.jsonl\nmethod:\n  name: {label}\n")
    return folder


@pytest.fixture
def page(tmp_path):
    """Two real reports of three tasks (a1, a2: synthetic; b1: real): ``gated`` of fullkv (mean 0.7), deco
    (0.9, no record of b1) and the sink-only control (its gate row comes first), with a curves table; ``plain``
    of fullkv and deco only, without curves. Returns both pages' text and build results.

    Built for every test, not once per module: mutmut runs a mutant only under the tests that call the mutated
    function, and a module-scoped build would count as called by the first test alone."""
    tmp = tmp_path
    data = tmp / "data"
    write_context_video(data / "videos/synthetic/a.mp4", seed=1)
    write_context_video(data / "videos/real/b.mp4", seed=2)
    write_manifest(data, [
        official_row("b1", "videos/real/b.mp4", source="real", target_aliases=[]),
        official_row("a2", "videos/synthetic/a.mp4", task_type="revisit"),
        official_row("a1", "videos/synthetic/a.mp4"),
    ])
    full = page_run(tmp / "runs", data, "fullkv", {"a1": 0.8, "a2": 0.6, "b1": 0.7}, method="fullkv",
                    method_config={})
    deco = page_run(tmp / "runs", data, "deco", {"a1": 0.9, "a2": 0.9}, method="deco", pr=0.9)
    sink = page_run(tmp / "runs", data, "sink", {"a1": 0.1, "a2": 0.2, "b1": 0.1}, method="streaming",
                    method_config={"recent_chunks": 0}, pr=0.5)
    curves = pd.DataFrame({"method": ["deco", "deco"], "test_pr": [0.8, 0.9], "score": [0.3, 0.1]})
    gated = html.build_report([sink, deco, full], tmp / "gated", allow_mixed=True, title="Tiny & board",
                              curves=curves)
    plain = html.build_report([deco, full], tmp / "plain", allow_mixed=True)
    return SimpleNamespace(gated=gated, plain=plain, text=gated.index.read_text(), plain_text=plain.index.read_text())


def section(text: str, table_id: str) -> str:
    """A table's section of the page, unescaped."""
    return unescape(re.search(rf'<section class="table-block" id="{table_id}">.*?</section>', text, re.S).group(0))


def test_the_page_lists_fullkv_first_then_the_methods_by_score(page):
    assert page.gated.methods == ["fullkv", "deco", "sink"] and page.gated.tasks == 3
    assert page.plain.methods == ["fullkv", "deco"]
    board = section(page.text, "leaderboard")
    assert re.findall(r'href="#method=(\w+)"', board) == ["deco", "fullkv", "sink"]  # by score, highest first
    assert "<title>Tiny &amp; board</title>" in page.text and "<title>CMBench report</title>" in page.plain_text
    options = re.search(r'<select id="filter-method".*?</select>', page.text, re.S).group(0)
    assert re.findall(r'<option value="(\w+)">', options) == ["fullkv", "deco", "sink"]
    assert "3 methods, 3 tasks." in page.text


def test_the_page_shows_its_tables_with_their_titles_and_notes_gate_first(page):
    assert page_tables(page.text) == ["gate", "leaderboard", "leaderboard-more", "by-source", "by-type", "paired",
                                      "comparisons"]
    assert page_tables(page.plain_text) == ["leaderboard", "leaderboard-more", "by-source", "by-type", "paired",
                                            "comparisons"]
    titles = {t: re.search(r"<h3>(.*?)</h3>", section(page.text, t)).group(1) for t in page_tables(page.text)}
    assert titles == {"gate": "Backbone gate: FullKV against the no-context control", "leaderboard": "Leaderboard",
                      "leaderboard-more": "Leaderboard: the other columns", "by-source": "Per source", "by-type": "Per task type", "paired": "Paired deltas against FullKV",
                      "comparisons": "Paired comparisons"}
    notes = {t: (re.search(r'<p class="note">(.*?)</p>', section(page.text, t), re.S) or [None, None])[1]
             for t in page_tables(page.text)}
    board_note = "Score: mean over finished tasks, 95% CI clustered by context. Click a header to sort."
    # allow_mixed, deco without b1: its mean is over other tasks than the others', and the note says so
    mixed = (" Task sets: the runs cover different tasks (leaderboard.allow_mixed=true; tasks: {}): "
             "their means are over different tasks, so rows are not comparable (paired deltas are over the tasks "
             "both ran).")
    assert notes == {
        "gate": f"FullKV minus Streaming with recent_chunks=0 (the sink only), paired by task and seed, 95% CI "
                f"clustered by context; decided by the verdict rule as one family (docs/verdicts.md): a backbone "
                f"passes when all of its simultaneous interval lies above +{MARGIN:g}, fails when it lies within "
                f"±{MARGIN:g} (level with forgetting) or below, and is inconclusive otherwise. A backbone that does "
                "not pass has not shown that it uses its context: comparing compression methods on it says nothing "
                "about memory (the paper's reason for choosing LingBot World v2).",
        "leaderboard": board_note + " score_at_85pr: " + MATCHED_NOTE.split(": ", 1)[1] + mixed.format("fullkv 3, sink 3, deco 2"),
        "leaderboard-more": "Each entry's other measures (quality, fidelity to FullKV, host store, context PR, FLOPs, "
                            "tasks ...), in the leaderboard's row order.",
        "by-source": None, "by-type": None,
        "paired": "Per task (matched by task and seed), method score minus FullKV score.",
        "comparisons": "Method score minus versus score over the (task, seed) pairs both finished, with both PRs; "
                       "95% CI clustered by context; p: cluster-robust paired t-test; adjusted p: p times the number of "
                       "tests in this table (Bonferroni: the tests one table prints are one family); verdict: the "
                       "method against versus read as an equivalence claim on the table's simultaneous intervals "
                       "(docs/verdicts.md). Pairs: each entry against FullKV, or leaderboard.focus against every "
                       "other, plus leaderboard.compare.",
    }
    assert re.search(r'<p class="note">(.*?)</p>', section(page.plain_text, "leaderboard")).group(1) == (
        board_note + mixed.format("fullkv 3, deco 2"))
    by_source = re.findall(r'data-key="(\w+)"', section(page.text, "by-source"))
    by_type = re.findall(r'data-key="(\w+)"', section(page.text, "by-type"))
    assert "source" in by_source and "task_type" not in by_source
    assert "task_type" in by_type and "source" not in by_type


def test_the_page_has_both_plots_and_a_card_per_task_in_task_id_order(page):
    plots = re.search(r'<section id="plots">.*?</section>', page.text, re.S).group(0)
    assert re.findall(r'<img src="([^"]+)" alt="([^"]+)">', plots) == [
        ("img/pareto.png", "pruning ratio against score, one point per method"),
        ("img/frame_curves.png", "mean similarity and detection rate per continuation frame, one line per method")]
    out = page.gated.index.parent
    assert (out / "img/pareto.png").is_file() and (out / "img/frame_curves.png").is_file()
    assert re.findall(r'<article class="task" id="task-(\w+)"', page.text) == ["a1", "a2", "b1"]
    # references numbered by that order; b1's target has no aliases
    assert re.findall(r'<img src="(img/ref/[^"]+)"', page.text) == ["img/ref/t0000_0.png", "img/ref/t0001_0.png",
                                                                    "img/ref/t0002_0.png"]
    cards = dict(re.findall(r'<article class="task" id="task-(\w+)".*?<span class="target">(.*?)</span>', page.text,
                            re.S))
    assert cards["a1"] == "target: <strong>red vase</strong> (vase, pot)" and cards["b1"] == "target: <strong>red vase</strong>"
    b1 = re.search(r'<article class="task" id="task-b1".*?</article>', page.text, re.S).group(0)
    cells = re.findall(r'data-method="(\w+)" data-status="(\w+)">', b1)
    assert cells == [("fullkv", "ok"), ("deco", "missing"), ("sink", "ok")]
    deco = re.search(r'data-method="deco".*?</figure>', b1, re.S).group(0)
    assert 'score <span class="score">—</span>' in deco and '<span class="error">no record</span>' in deco
    assert "no video saved (save_videos=false?)" in re.search(r'data-method="fullkv".*?</figure>', b1, re.S).group(0)
    filters = {name: re.findall(r'<option value="(\w+)">', block) for name, block in re.findall(
        r'<select id="filter-(\w+)".*?>(.*?)</select>', page.text, re.S)}
    assert filters["source"] == ["real", "synthetic"] and filters["type"] == ["reappear", "revisit"]


def test_the_page_has_each_methods_losses_and_each_runs_provenance(page):
    panels = re.findall(r'<section class="losses" data-method="(\w+)"', page.text)
    assert panels == ["deco", "sink"]
    sink = re.search(r'<section class="losses" data-method="sink".*?</section>', page.text, re.S).group(0)
    # drops 0.8 - 0.1, 0.6 - 0.2, 0.7 - 0.1: largest first
    assert re.findall(r'href="#task-(\w+)"', sink) == ["a1", "b1", "a2"] and "+0.7000" in sink
    runs = re.findall(r'<details class="run">\s*<summary><strong>(\w+)</strong> · (\d+) records', page.text)
    assert runs == [("fullkv", "3"), ("deco", "2"), ("sink", "3")]
    assert "name: sink" in page.text


def test_the_page_template_drops_its_block_tag_lines_and_keeps_the_final_newline(page):
    # the line holding only "{% set most_seeds ... %}" leaves nothing behind (trim_blocks, lstrip_blocks)
    assert ('<section class="losses" data-method="deco" hidden>\n    <h3>Where deco loses most against fullkv</h3>\n'
            '    <p class="note">The 2 tasks with the largest paired score drop (fullkv minus deco);') in page.text
    assert page.text.endswith("</html>\n") and page.text.startswith("<!DOCTYPE html>\n<html")
