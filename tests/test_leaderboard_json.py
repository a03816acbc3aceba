"""leaderboard.json: written beside the CSVs with the identities another person needs, merged from received files
(one task set, scorer and schema version, or one line naming the file and field), forged values refused."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from cmbench import __version__
from cmbench.cli.main import main
from cmbench.report import ReportError
from cmbench.report.leaderboard import write_reports
from cmbench.report.leaderboard_json import FILE, merge_boards, read_board
from test_report import record, write_run

CODE = {"cmbench": "c1", "method": None, "backbone": "b1", "manifest": "m1", "scorer": "s1/x"}


def rec(label, task_id, score, run_seed, **extra):
    return {**record(label, task_id, score, seed=10 * run_seed + int(task_id[1]), pr=extra.pop("pr", 0.0)),
            "run_seed": run_seed, "setup_hash": f"S_{label}", "code": CODE, "code_hash": f"h_{label}",
            "scorer_models_hash": "x", **extra}


@pytest.fixture
def board_dir(tmp_path) -> Path:
    """A board over ``fullkv`` and ``mine``, seeds 2 and 3 each, on tasks a1, a2, b1."""
    folders = [write_run(tmp_path / f"full_{s}", [rec("fullkv", t, 0.5 + 0.1 * s, s) for t in ("a1", "a2", "b1")])
               for s in (2, 3)]
    folders += [write_run(tmp_path / f"mine_{s}", [rec("mine", "a1", 0.9, s, pr=0.8), rec("mine", "a2", 0.3, s, pr=0.9),
                                                  rec("mine", "b1", 0.6 + 0.1 * (s - 2), s, pr=0.7)]) for s in (2, 3)]
    write_reports(folders, tmp_path / "board")
    return tmp_path / "board"


def test_the_board_json_holds_every_csv_row_with_its_identities(board_dir):
    board = json.loads((board_dir / FILE).read_text())
    assert (board["schema"], board["schema_version"], board["cmbench_version"]) == ("cmbench.leaderboard", 1, __version__)
    assert board["date"].endswith("+00:00")
    assert board["task_set"]["task_ids"] == ["a1", "a2", "b1"] and board["task_set"]["manifests"] == ["m1"]
    assert board["scorer"]["config_hashes"] == ["s1"] and board["scorer"]["models_hashes"] == ["x"]
    csv = pd.read_csv(board_dir / "leaderboard.csv").set_index("method")
    rows = {r["method"]: r for r in board["rows"]}
    assert list(rows) == list(csv.index)  # the CSV's order
    for method, row in rows.items():
        for column, value in csv.loc[method].items():
            if isinstance(value, float) and math.isnan(value):
                assert row[column] is None, (method, column)
            elif isinstance(value, str):
                assert row[column] == value, (method, column)
            elif column != "seeds":
                assert row[column] == pytest.approx(value, rel=1e-5), (method, column)
    assert rows["fullkv"]["seeds"] == [2, 3] and rows["mine"]["seeds"] == [2, 3]
    assert rows["mine"]["code_hash"] == "h_mine" and rows["mine"]["code"] == CODE
    mine = rows["mine"]
    assert mine["score"] == pytest.approx((0.9 + 0.3 + 0.6 + 0.9 + 0.3 + 0.7) / 6)
    assert mine["by_source"]["synthetic"]["score"] == pytest.approx(0.6)  # a1, a2
    assert mine["by_source"]["real"]["score"] == pytest.approx(0.65) and mine["by_source"]["real"]["n_tasks"] == 2
    assert mine["by_task_type"]["reappear"]["pr"] == pytest.approx(0.75)  # a1 and b1 (names ending in 1)
    assert mine["by_task_type"]["revisit"]["score"] == pytest.approx(0.3)


def split(board_dir: Path, where: Path) -> tuple[Path, Path]:
    """The board as two submissions, one entry each."""
    board = json.loads((board_dir / FILE).read_text())
    where.mkdir()
    paths = []
    for i, row in enumerate(board["rows"]):
        path = where / f"sub{i}.json"
        path.write_text(json.dumps({**board, "rows": [row]}))
        paths.append(path)
    return paths[0], paths[1]


def run_cli(capsys, *argv: str) -> subprocess.CompletedProcess:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out.out, out.err)


def test_merged_submissions_are_one_board(board_dir, tmp_path, capsys):
    a, b = split(board_dir, tmp_path / "subs")
    done = run_cli(capsys, "leaderboard", f"leaderboard.merge=[{a},{b}]", f"leaderboard.out={tmp_path / 'merged'}")
    assert done.returncode == 0, done.stderr
    merged = json.loads((tmp_path / "merged" / FILE).read_text())
    original = json.loads((board_dir / FILE).read_text())
    assert [r["method"] for r in merged["rows"]] == [r["method"] for r in original["rows"]]
    assert merged["task_set"] == original["task_set"] and merged["scorer"] == original["scorer"]
    csv = pd.read_csv(tmp_path / "merged" / "leaderboard.csv").set_index("method")
    assert csv.loc["mine", "score"] == pytest.approx(original["rows"][[r["method"] for r in original["rows"]]
                                                                    .index("mine")]["score"])
    assert csv.loc["fullkv", "seeds"] == 2
    by_source = pd.read_csv(tmp_path / "merged" / "leaderboard_by_source.csv")
    assert len(by_source) == 4 and set(by_source["source"]) == {"synthetic", "real"}
    assert "| mine |" in done.stdout


def edited(path: Path, change) -> Path:
    board = json.loads(path.read_text())
    change(board)
    path.write_text(json.dumps(board))
    return path


@pytest.mark.parametrize("change, field", [
    (lambda b: b.update(schema_version=2), "schema_version: is 2"),
    (lambda b: b["task_set"].update(task_ids=["a1", "a2", "b1", "zz"]), "task_set.hash: does not match"),
    (lambda b: b["rows"][0].update(score=3.0), "rows[0].score: is 3.0, expected a similarity in [-1, 1]"),
    (lambda b: b["rows"][0].update(pr=1.5), "rows[0].pr: is 1.5, expected a fraction in [0, 1]"),
    (lambda b: b["rows"][0].update(n_tasks=99), "rows[0].n_tasks: is 99, more than the task set's 3 tasks x 2 seed(s)"),
    (lambda b: b["rows"][0].update(n_tasks=1.5), "rows[0].n_tasks: is 1.5, expected a whole number >= 0"),
    (lambda b: b["rows"][0].update(score="high"), "rows[0].score: is \"high\", expected a number or null"),
    (lambda b: b["rows"][0].update(seeds=["x"]), "rows[0].seeds: expected a list of whole numbers"),
    (lambda b: b["rows"][0].update(continuation_fps="fast"), "rows[0].continuation_fps: is \"fast\", expected a number"),
    (lambda b: b["rows"][0].update(psnr_vs_fullkv=True), "rows[0].psnr_vs_fullkv: is true, expected a number"),
    (lambda b: b["rows"][0]["by_source"]["synthetic"].update(score=-7), "rows[0].by_source.synthetic.score: is -7"),
    (lambda b: b["rows"][0].update(peak_kv_bytes=-1), "rows[0].peak_kv_bytes: is -1, expected a number >= 0"),
])
def test_a_forged_or_unknown_board_is_one_line_naming_file_and_field(board_dir, tmp_path, capsys, change, field):
    a, b = split(board_dir, tmp_path / "subs")
    edited(b, change)
    done = run_cli(capsys, "leaderboard", f"leaderboard.merge=[{a},{b}]", f"leaderboard.out={tmp_path / 'merged'}")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{b}: {field}" in lines[0]
    assert not (tmp_path / "merged" / FILE).exists()


def test_nan_and_infinity_are_not_json(board_dir, tmp_path):
    a, _ = split(board_dir, tmp_path / "subs")
    a.write_text(a.read_text().replace('"score": 0.', '"score": NaN, "x": 0.', 1))
    with pytest.raises(ReportError, match=f"{a}: not a leaderboard.json"):
        read_board(a)


@pytest.mark.parametrize("key, change", [
    ("task_set", lambda b: b["task_set"].update(manifests=["m2"], hash=__import__("cmbench.hashing").hashing.json_digest(
        {"task_ids": b["task_set"]["task_ids"], "manifests": ["m2"], "dataset_commits": []}))),
    ("scorer", lambda b: b["scorer"].update(hash="another")),
])
def test_boards_of_other_task_sets_or_scorers_do_not_merge(board_dir, tmp_path, key, change):
    a, b = split(board_dir, tmp_path / "subs")
    edited(b, change)
    with pytest.raises(ReportError, match=rf"^{b}: {key}.hash: is .*, {a} has .* do not merge$"):
        merge_boards([a, b])


def test_one_method_in_two_submissions_is_refused(board_dir, tmp_path):
    a, _ = split(board_dir, tmp_path / "subs")
    with pytest.raises(ReportError, match="method .* is also in"):
        merge_boards([a, a])


def test_a_received_board_that_is_not_a_regular_small_file_is_one_line(tmp_path, monkeypatch):
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ReportError, match="FIFO"):
        read_board(fifo)
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(65 * 2**20)  # sparse: past the 64 MiB bound
    with pytest.raises(ReportError, match="limit"):
        read_board(big)
