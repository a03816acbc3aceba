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
    assert drawn.drop(columns="total").to_dict("records") == [
        {"family": "eviction", "method": "decoprune@bytes15", "x": pytest.approx(15.0), "y": 0.8, "yerr": 0.1,
         "series": "decoprune", "on_target": True},
        {"family": "quantization", "method": "fullkv+kivi2-g32-r128", "x": pytest.approx(12.0), "y": 0.85, "yerr": 0.0,
         "series": "fullkv+kivi2-g32-r128", "on_target": True}]
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


@pytest.mark.parametrize("realised, counts", [
    (0.179, False),   # 19% over 0.15: DeCoPrune's landing in the float32 comparison
    (0.142, False),   # 5.3% under
    (0.143, True),    # 4.7% under
    (0.156, True),    # 4% over
])
def test_an_entry_counts_at_its_target_only_where_it_lands(realised, counts):
    assert figure.on_target(0.15, realised) is counts
    assert figure.bytes_miss(0.15, realised) == pytest.approx(realised / 0.15 - 1)
    assert figure.on_target(None, 0.7)  # no target (FullKV, a format alone): counts where it is


def test_an_entry_19_percent_over_its_target_is_not_ranked_there():
    """The families board's lead at a target is between the entries that landed there: DeCoPrune 19% over 0.15
    scores highest but is in no group; Streaming (on target) leads TempCache (4% under)."""
    from cmbench.report.board_claims import families_claims, target_groups

    rows = pd.DataFrame([
        {"method": "fullkv", "score": 0.94, "kv_bytes_ratio": 1.0},
        {"method": "decoprune@bytes15", "score": 0.89, "kv_bytes_ratio": 0.179},
        {"method": "streaming@bytes15", "score": 0.6, "kv_bytes_ratio": 0.15},
        {"method": "tempcache@bytes15", "score": 0.5, "kv_bytes_ratio": 0.144}])
    groups = target_groups(rows)
    assert [(t, list(g["method"])) for t, g in groups] == [(0.15, ["streaming@bytes15", "tempcache@bytes15"])]
    pairs = pd.DataFrame(columns=["method", "versus", "delta", "delta_ci95", "p_value", "n_pairs"])
    named = [c.name for c in families_claims(rows, pairs, "here")]
    assert "streaming@bytes15 ahead of tempcache@bytes15" in named
    assert not any(n.startswith("decoprune@bytes15 ahead") for n in named)
    assert "decoprune@bytes15 level with fullkv" in named  # its difference from FullKV is still stated


def test_memory_columns_give_host_store_and_total_bytes_against_fullkvs_peak_by_hand():
    """FullKV peaks at 100 MB on the device; WorldKV holds 10 MB there and 33 MB in its host store, moving 20 MB
    a chunk: its store is 0.33 of FullKV's peak, its total 0.43; an entry without a store has 0 store bytes."""
    rows = pd.DataFrame([
        {"method": "fullkv", "kv_bytes_ratio": 1.0, "peak_kv_bytes": 100e6},
        {"method": "worldkv@bytes8", "kv_bytes_ratio": 0.082, "peak_kv_bytes": 10e6, "peak_store_bytes": 33e6,
         "moved_bytes_per_chunk": 20e6},
        {"method": "decoprune@bytes8", "kv_bytes_ratio": 0.1, "peak_kv_bytes": 9e6}])
    out = figure.memory_columns(rows).set_index("method")
    assert out.loc["worldkv@bytes8", "store_bytes_ratio"] == pytest.approx(0.33)
    assert out.loc["worldkv@bytes8", "total_bytes_ratio"] == pytest.approx(0.43)
    assert out.loc["worldkv@bytes8", "moved_bytes_per_chunk"] == 20e6
    assert out.loc["decoprune@bytes8", "store_bytes_ratio"] == 0.0
    assert out.loc["decoprune@bytes8", "total_bytes_ratio"] == pytest.approx(0.09)
    assert out.loc["fullkv", "total_bytes_ratio"] == 1.0
    assert bool(out.loc["worldkv@bytes8", "on_target"]) and not bool(out.loc["decoprune@bytes8", "on_target"])


def test_a_store_kept_on_the_device_counts_in_its_device_bytes_and_where_it_lands():
    """WorldKV with its bank on the device attends the same rows as with it on the host (kv_bytes_ratio 0.255 both)
    but holds its 60 MB store on the device and moves nothing: its device bytes are 0.255 + 0.60, far off the 0.25
    target, so it is not ranked there and no claim ranks it; the host-store reading lands."""
    from cmbench.report.board_claims import target_groups

    rows = pd.DataFrame([
        {"method": "fullkv", "score": 0.95, "kv_bytes_ratio": 1.0, "peak_kv_bytes": 100e6},
        {"method": "worldkv@bytes25", "score": 0.949, "kv_bytes_ratio": 0.255, "peak_kv_bytes": 26e6,
         "peak_store_bytes": 60e6, "moved_bytes_per_chunk": 6e6},
        {"method": "worldkv-on-device@bytes25", "score": 0.949, "kv_bytes_ratio": 0.255, "peak_kv_bytes": 26e6,
         "peak_store_bytes": 60e6, "moved_bytes_per_chunk": 0.0},
        {"method": "tempcache@bytes25", "score": 0.946, "kv_bytes_ratio": 0.244, "peak_kv_bytes": 25e6}])
    out = figure.memory_columns(rows).set_index("method")
    assert list(out["store_on_device"]) == [False, False, True, False]
    assert out.loc["worldkv-on-device@bytes25", "device_bytes_ratio"] == pytest.approx(0.855)
    assert out.loc["worldkv@bytes25", "device_bytes_ratio"] == pytest.approx(0.255)
    assert list(out["on_target"]) == [True, True, False, True]
    groups = target_groups(rows)
    assert [list(g["method"]) for _, g in groups] == [["worldkv@bytes25", "tempcache@bytes25"]]
    drawn = figure.points(figure.memory_columns(rows).assign(family=figure.entry_families(rows), score_ci95=0.01)
                          ).set_index("method")
    assert drawn.loc["worldkv-on-device@bytes25", "x"] == pytest.approx(85.5)


def test_the_table_and_figure_name_the_precision_and_refuse_a_mixed_board(tmp_path):
    rows = [{**r, "cache_dtype": "bfloat16"} for r in ROWS]
    assert figure.board_axis(figure.read_board(board(tmp_path, rows))) == "bytes relative to FullKV in bfloat16"
    assert figure.board_axis(figure.read_board(board(tmp_path, ROWS))) == "bytes relative to FullKV in float32"
    rows[1]["cache_dtype"] = "float32"
    with pytest.raises(ValueError, match=r"mixes cache precisions \(bfloat16, float32\)"):
        figure.board_axis(figure.read_board(board(tmp_path, rows)))
    done = figure_command(str(board(tmp_path, ROWS)), str(tmp_path / "f.png"), "--table", str(tmp_path / "t.csv"))
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "t.csv")
    assert {"on_target", "bytes_miss", "store_bytes_ratio", "total_bytes_ratio"} <= set(table.columns)
    assert list(table["method"]) == [r["method"] for r in ROWS]
