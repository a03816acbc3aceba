"""The families figure (cmbench.report.families, drawn by scripts/families_figure.py): the family each
leaderboard label belongs to, the board it reads (refused in one line naming file, row and field) and the
points it draws."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cmbench.report import families as figure

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "families_figure.py"


def figure_command(*args: str) -> subprocess.CompletedProcess:
    """The script run on the cmbench under test (PYTHONPATH to its package), not whichever is installed."""
    env = {**os.environ, "PYTHONPATH": str(Path(figure.__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("label, family", [
    ("fullkv", "reference"),
    ("fullkv+kivi2-g32-r128", "quantization"),
    ("decoprune@bytes15", "eviction"),
    ("streaming@bytes15+kivi2-g32-r128", "eviction + quantization"),
    ("worldkv@bytes15+kivi4-g32-r128", "retrieval + quantization"),
    ("tempcache@bytes15", "merging"),
    ("kvpress_KnormPress@pr85", "eviction"),
    ("my_method", "other"),
])
def test_each_label_names_its_family(label, family):
    assert figure.family(label) == family


@pytest.mark.parametrize("label, target", [
    ("decoprune@bytes15+kivi4-g32-r128", 0.15),
    ("streaming@bytes8", 0.08),
    ("tempcache@bytes12.5", 0.125),  # a target of a fractional percent keeps its decimals in the tag
    ("decoprune@pr85", None),
    ("fullkv+kivi2-g32-r128", None),
    ("fullkv", None),
])
def test_each_label_names_its_bytes_target(label, target):
    assert figure.bytes_target(label) == target


def board(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "board.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


ROWS = [{"method": "fullkv", "metric": "light", "score": 0.9, "score_ci95": 0.05, "kv_bytes_ratio": 1.0},
        {"method": "decoprune@bytes15", "metric": "light", "score": 0.8, "score_ci95": 0.1, "kv_bytes_ratio": 0.15},
        {"method": "fullkv+kivi2-g32-r128", "metric": "light", "score": 0.85, "score_ci95": None,
         "kv_bytes_ratio": 0.12}]


def test_the_points_are_every_entry_but_fullkv_at_its_bytes_in_percent(tmp_path):
    drawn = figure.points(figure.read_board(board(tmp_path, ROWS)))
    assert drawn.to_dict("records") == [
        {"family": "eviction", "method": "decoprune@bytes15", "x": pytest.approx(15.0), "y": 0.8, "yerr": 0.1},
        {"family": "quantization", "method": "fullkv+kivi2-g32-r128", "x": pytest.approx(12.0), "y": 0.85, "yerr": 0.0}]
    out = figure.draw(figure.read_board(board(tmp_path, ROWS)), tmp_path / "f.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("change, message", [
    ({"kv_bytes_ratio": "lots"}, "row 3 (decoprune@bytes15), kv_bytes_ratio: 'lots' is not a number"),
    ({"score": None}, "row 3 (decoprune@bytes15), score: empty, expected a number"),
    ({"score_ci95": "wide"}, "row 3 (decoprune@bytes15), score_ci95: 'wide' is not a number"),
])
def test_a_bad_cell_is_one_line_naming_file_row_and_field(tmp_path, change, message):
    path = board(tmp_path, [ROWS[0], {**ROWS[1], **change}])
    with pytest.raises(ValueError) as err:
        figure.read_board(path)
    assert str(err.value) == f"{path}: {message}"


def test_a_missing_column_is_named_and_the_command_says_it_in_one_line(tmp_path):
    path = board(tmp_path, [{k: v for k, v in row.items() if k != "kv_bytes_ratio"} for row in ROWS])
    done = figure_command(str(path), str(tmp_path / "f.png"))
    assert done.returncode == 2
    assert done.stderr == (f"families_figure: {path}: no column 'kv_bytes_ratio' (a leaderboard CSV "
                           "has method, score, score_ci95, kv_bytes_ratio)\n")
    assert not (tmp_path / "f.png").exists()


def test_a_torn_board_is_refused_by_the_table_reader_in_one_line(tmp_path):
    """The board is read as every table a command wrote (bounded, not torn): a file cut off mid-line is named."""
    path = board(tmp_path, ROWS)
    path.write_text(path.read_text().rstrip("\n")[:-3])
    done = figure_command(str(path), str(tmp_path / "f.png"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"families_figure: {path}: torn: its last line is cut off")
    assert not (tmp_path / "f.png").exists()
