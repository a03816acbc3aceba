"""``python -m cmbench leaderboard ... leaderboard.families=true`` builds the families board (score vs device KV bytes)
from runs one already has, beside the leaderboard: ``families.csv`` with where each entry lands and its total
memory, ``families.png`` the figure; no run is made, nothing outside the board's folder is written, and a later
board without the flag removes them."""

from __future__ import annotations

import pandas as pd
import pytest
from PIL import Image
from test_report import record, write_run

from cmbench.cli.main import main

TASKS = ("a1", "a2", "b1", "b2")


def entry(tmp_path, label, score, ratio, peak):
    rows = [{**record(label, t, score + 0.01 * i, pr=1 - ratio), "kv_bytes_ratio": ratio, "peak_kv_bytes": peak}
            for i, t in enumerate(TASKS)]
    return write_run(tmp_path / "runs" / label.replace("@", "_").replace("+", "_"), rows)


@pytest.fixture
def runs(tmp_path):
    return [entry(tmp_path, "fullkv", 0.9, 1.0, 8e6), entry(tmp_path, "decoprune@bytes25", 0.6, 0.287, 2.3e6),
            entry(tmp_path, "decoprune@bytes15", 0.5, 0.151, 1.2e6), entry(tmp_path, "streaming@bytes15", 0.3, 0.141, 1.1e6)]


def test_the_families_board_comes_from_existing_runs_beside_the_leaderboard(tmp_path, runs, capsys):
    out = tmp_path / "board"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["leaderboard", f"runs=[{','.join(map(str, runs))}]", f"leaderboard.out={out}",
                 "leaderboard.families=true"]) == 0
    table = pd.read_csv(out / "families.csv").set_index("method")
    assert table.loc["decoprune@bytes25", "bytes_target"] == 0.25 and not table.loc["decoprune@bytes25", "on_target"]
    assert table.loc["decoprune@bytes15", "on_target"] and table.loc["fullkv", "total_bytes_ratio"] == 1
    assert Image.open(out / "families.png").size[0] > 400
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert [p for p in after if p not in before and p.parts[0] != "board"] == []  # no run made, nothing else written
    assert "families.csv" in capsys.readouterr().out


def test_a_board_without_the_flag_removes_an_earlier_families_board(tmp_path, runs):
    out = tmp_path / "board"
    args = ["leaderboard", f"runs=[{','.join(map(str, runs))}]", f"leaderboard.out={out}"]
    assert main([*args, "leaderboard.families=true"]) == 0 and (out / "families.png").is_file()
    assert main(args) == 0
    assert not (out / "families.png").exists() and not (out / "families.csv").exists()
