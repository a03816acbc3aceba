"""Score-vs-PR curves, one function at a time, with hand-computed numbers: the points a curve is made of,
interpolation and trapezoid areas at their range boundaries, the common range of an area table, the
leaderboard row a curve point comes from, normalisation by FullKV, the quality-vs-memory window, and what
the two plots show (their figures captured before they are closed): which series, their values, the labels,
FullKV's reference and the CIs, never how they look (sizes, colours, transparency; docs/testing.md). The
end-to-end ``curves`` command is ``test_curves.py``."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from cmbench.report import curves as C
from cmbench.report.leaderboard import ReportError

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

NAN = math.nan
NO_MARKER = (None, "", " ", "None")  # a line's markers when its points are not drawn


def xy(line) -> tuple[list[float], list[float]]:
    """A plotted line's x and y data as lists of floats."""
    return np.asarray(line.get_xdata(), float).tolist(), np.asarray(line.get_ydata(), float).tolist()


def corners(band) -> set[tuple[float, float]]:
    """The distinct (x, y) vertices of a filled band (``fill_between``), rounded to 6 decimals."""
    return {(round(float(x), 6), round(float(y), 6)) for x, y in band.get_paths()[0].vertices}


def frame(**columns) -> pd.DataFrame:
    """A curves table from its columns (lists of equal length)."""
    return pd.DataFrame(columns)


# ---------------------------------------------------------------- points, interpolation, area


def test_points_are_sorted_distinct_prs_with_mean_scores_nan_dropped():
    xs, ys = C._points([0.9, 0.7, 0.9, NAN, 0.8, 0.5], [0.2, 0.6, 0.4, 0.1, NAN, 0.75])
    # 0.5 -> 0.75; 0.7 -> 0.6; 0.9 -> (0.2 + 0.4) / 2; the NaN PR and the NaN score dropped
    assert xs.tolist() == [0.5, 0.7, 0.9] and ys.tolist() == pytest.approx([0.75, 0.6, 0.3])
    assert xs.dtype == float and ys.dtype == float
    xs, ys = C._points(pd.Series([1, 0]), pd.Series([1, 0]))  # ints read as floats
    assert xs.tolist() == [0.0, 1.0] and ys.tolist() == [0.0, 1.0]
    assert C._points([], [])[0].tolist() == []


def test_score_at_its_ends_is_inside_and_beyond_them_is_nan():
    pr, score = [0.9, 0.5, 0.7], [0.25, 0.75, 0.5]
    assert C.score_at(pr, score, 0.5) == 0.75 and C.score_at(pr, score, 0.9) == 0.25
    assert C.score_at(pr, score, 0.6) == pytest.approx(0.625)  # halfway between (0.5, 0.75) and (0.7, 0.5)
    assert C.score_at(pr, score, 0.85) == pytest.approx(0.3125)  # 0.5 + 0.75 * (0.25 - 0.5)
    assert math.isnan(C.score_at(pr, score, 0.4999)) and math.isnan(C.score_at(pr, score, 0.9001))
    assert math.isnan(C.score_at([], [], 0.5)) and math.isnan(C.score_at([NAN], [0.5], 0.5))
    assert C.score_at([0.5], [0.4], 0.5) == 0.4  # one point: only its own PR
    assert isinstance(C.score_at(pr, score, 0.6), float)


def test_curve_area_is_the_trapezoid_rule_with_interpolated_ends():
    pr, score = [0.5, 0.7, 0.9], [0.75, 0.5, 0.25]
    # whole range: 0.2 * (0.75 + 0.5) / 2 + 0.2 * (0.5 + 0.25) / 2 = 0.125 + 0.075
    assert C.curve_area(pr, score, 0.5, 0.9) == pytest.approx(0.2)
    # [0.6, 0.8]: ends 0.625 and 0.375; 0.1 * (0.625 + 0.5) / 2 + 0.1 * (0.5 + 0.375) / 2 = 0.05625 + 0.04375
    assert C.curve_area(pr, score, 0.6, 0.8) == pytest.approx(0.1)
    # [0.6, 0.65], no point inside: 0.05 * (0.625 + 0.5625) / 2
    assert C.curve_area(pr, score, 0.6, 0.65) == pytest.approx(0.0296875)
    # a non-linear curve: the middle point counts once: 0.5 * (0 + 1) / 2 + 0.5 * (1 + 0) / 2
    assert C.curve_area([0, 0.5, 1], [0, 1, 0], 0, 1) == pytest.approx(0.5)
    for lo, hi in [(0.49, 0.9), (0.5, 0.91), (0.7, 0.7), (0.8, 0.6)]:
        assert math.isnan(C.curve_area(pr, score, lo, hi)), (lo, hi)
    assert math.isnan(C.curve_area([], [], 0.5, 0.9))
    assert isinstance(C.curve_area(pr, score, 0.5, 0.9), float)


def test_the_area_table_uses_the_range_every_method_covers():
    curves = frame(method=["b", "b", "a", "a", "a", "b"], test_pr=[0.6, 1.0, 0.5, 0.7, 0.9, NAN],
                   score=[0.5, 0.5, 0.75, 0.5, 0.25, 0.1])
    table = C.area_table(curves)
    assert list(table.columns) == C.AREA_COLUMNS == ["method", "pr_low", "pr_high", "auc", "mean_score", "points"]
    assert table["method"].tolist() == ["b", "a"]  # in the order met
    # range: max(0.6, 0.5) .. min(1.0, 0.9) = [0.6, 0.9]; b: flat 0.5 -> 0.15; a: ends 0.625 and 0.25:
    # 0.1 * (0.625 + 0.5) / 2 + 0.2 * (0.5 + 0.25) / 2 = 0.05625 + 0.075 = 0.13125
    assert table["pr_low"].tolist() == [0.6, 0.6] and table["pr_high"].tolist() == [0.9, 0.9]
    assert table["auc"].tolist() == pytest.approx([0.15, 0.13125])
    assert table["mean_score"].tolist() == pytest.approx([0.5, 0.4375])  # auc / 0.3
    assert table["points"].tolist() == [2, 3]  # b's point without a PR does not count


def test_an_area_table_without_a_common_range_has_no_areas():
    # a method with no usable point: no range for anyone (its row still listed, with 0 points)
    table = C.area_table(frame(method=["a", "a", "b"], test_pr=[0.5, 0.9, NAN], score=[0.5, 0.5, 0.5]))
    assert table["method"].tolist() == ["a", "b"] and table["points"].tolist() == [2, 0]
    assert table[["pr_low", "pr_high", "auc", "mean_score"]].isna().all().all()
    # ranges touching at one PR: [0.5, 0.7] and [0.7, 0.9] share no width
    table = C.area_table(frame(method=["a", "a", "b", "b"], test_pr=[0.5, 0.7, 0.7, 0.9], score=[1, 1, 1, 1]))
    assert table[["pr_low", "pr_high", "auc", "mean_score"]].isna().all().all()
    # one method: its own range
    table = C.area_table(frame(method=["a", "a"], test_pr=[0.5, 0.7], score=[1.0, 0.5]))
    assert table.iloc[0].tolist()[1:] == pytest.approx([0.5, 0.7, 0.15, 0.75, 2])


# ---------------------------------------------------------------- reading, scores at a PR, score range


def test_read_curves_needs_method_test_pr_and_score(tmp_path):
    path = tmp_path / "curves.csv"
    path.write_text("method,test_pr,score,extra\na,0.5,0.25,x\n")
    got = C.read_curves(path)
    assert got.to_dict("list") == {"method": ["a"], "test_pr": [0.5], "score": [0.25], "extra": ["x"]}
    path.write_text("method,score\na,0.25\n")
    with pytest.raises(ReportError) as err:
        C.read_curves(str(path))
    assert str(err.value) == f"{path}: not a curves table: no column(s) test_pr"
    with pytest.raises(ReportError) as err:
        C.read_curves(tmp_path / "none.csv")
    assert str(err.value) == f"{tmp_path / 'none.csv'}: no curves file (python -m cmbench curves writes one)"


def test_scores_at_the_operating_point_per_method():
    curves = frame(method=["z", "a", "z", "a", 3], test_pr=[0.8, 0.8, 0.9, 0.84, 0.85], score=[0.5, 0.5, 0.25, 0.4, 1])
    got = C.scores_at(curves)
    assert list(got) == ["z", "a", "3"]  # the order met, names as text
    assert got["z"] == pytest.approx(0.375) and math.isnan(got["a"]) and got["3"] == 1.0  # 0.85 past a's 0.84
    assert C.OPERATING_PR == 0.85
    assert C.scores_at(curves, 0.82)["a"] == pytest.approx(0.45)  # 0.5 + 0.5 * (0.4 - 0.5)


def test_the_score_range_is_zero_to_one_widened_to_any_score_outside():
    assert C.score_range([]) == (0.0, 1.0)
    assert C.score_range([0.2, NAN, 0.9]) == (0.0, 1.0)
    assert C.score_range([-0.5, 0.3, np.float64(1.25)]) == (-0.5, 1.25)
    assert C.score_range(["0.5", 2]) == (0.0, 2.0)


# ---------------------------------------------------------------- the plots' figures


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions close, kept open to look at (closed at the end)."""
    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for fig in kept:
        matplotlib.pyplot.figure(fig.number)
    plt.close("all")


def test_the_curves_plot_draws_each_method_its_band_and_the_reference(tmp_path, figures):
    curves = frame(method=["b", "a", "a", "b", "c"], test_pr=[0.9, 0.8, 0.6, 0.7, NAN],
                   score=[0.5, 0.25, 0.75, 0.5, 3.0], ci_low=[0.25, -0.5, 0.5, 0.25, 0], ci_high=[0.75, 0.5, 2.0, 0.75, 9])
    path = C.curves_plot(curves, str(tmp_path / "c.png"), reference=(1.25, 0.5), metric="DINO")
    assert path == tmp_path / "c.png" and path.read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    (ax,) = fig.axes
    # score range: [0, 1.25] (the reference above 1; c has no PR), margins of 0.03
    assert ax.get_ylim() == pytest.approx((-0.03, 1.28))
    assert ax.get_xlabel() == "realised pruning ratio on the test suite (%)"
    assert ax.get_ylabel() == "DINO (mean max-similarity)"
    assert ax.get_title() == "CMBench: DINO vs PR (each method's own knob, calibrated)"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["fullkv", "b", "a"]  # the reference, then methods as met
    assert xy(lines["b"]) == ([70.0, 90.0], [0.5, 0.5]) and xy(lines["a"]) == ([60.0, 80.0], [0.75, 0.25])
    assert xy(lines["fullkv"]) == ([0.0, 1.0], [1.25, 1.25])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fullkv", "b", "a"]
    # bands: the reference's 1.25 +- 0.5 clipped to [0, 1.25]; a's CI clipped to [0, 1.25] too
    (band,) = ax.patches
    assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((0.75, 1.25))
    # a: at PR 60% [0.5, 2.0] -> [0.5, 1.25]; at 80% [-0.5, 0.5] -> [0, 0.5]
    assert [corners(c) for c in ax.collections] == [{(70, 0.25), (70, 0.75), (90, 0.25), (90, 0.75)},
                                                    {(60, 0.5), (60, 1.25), (80, 0.0), (80, 0.5)}]
    # every point visible (a one-point curve too), and each band in the colour of the line it belongs to
    assert all(lines[m].get_marker() not in NO_MARKER for m in "ba")
    assert [to_rgb(c.get_facecolor()[0]) for c in ax.collections] == [to_rgb(lines[m].get_color()) for m in "ba"]
    assert to_rgb(band.get_facecolor()) == to_rgb(lines["fullkv"].get_color())


def test_the_curves_plot_draws_scores_against_kv_bytes_beside_pr(tmp_path, figures):
    # a stores 25% / 12.5% of FullKV's bytes at PR 0.6 / 0.8; b's second point has no bytes (left out there only)
    curves = frame(method=["a", "b", "a", "b"], test_pr=[0.8, 0.5, 0.6, 0.7], kv_bytes_ratio=[0.125, 0.5, 0.25, NAN],
                   score=[0.25, 0.5, 0.75, 0.625], ci_low=[0.0, 0.25, 0.5, 0.5], ci_high=[0.5, 0.75, 1.0, 0.75])
    C.curves_plot(curves, tmp_path / "c.png", reference=(0.875, 0.125), metric="light")
    (fig,) = figures
    pr_ax, bytes_ax = fig.axes
    assert bytes_ax.get_xlabel() == "device KV bytes on the test suite (% of FullKV's)"
    assert bytes_ax.get_title() == "CMBench: light vs KV bytes (the same runs)"
    assert bytes_ax.get_ylabel() == "light (mean max-similarity)"
    lines = {line.get_label(): xy(line) for line in bytes_ax.get_lines()}
    assert lines == {"fullkv": ([0.0, 1.0], [0.875, 0.875]), "a": ([12.5, 25.0], [0.25, 0.75]), "b": ([50.0], [0.5])}
    assert [corners(c) for c in bytes_ax.collections][0] == {(12.5, 0.0), (12.5, 0.5), (25, 0.5), (25, 1.0)}
    (band,) = bytes_ax.patches
    assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((0.75, 1.0))
    assert bytes_ax.get_ylim() == pr_ax.get_ylim() == pytest.approx((-0.03, 1.03))
    pr_lines = {line.get_label(): xy(line) for line in pr_ax.get_lines()}
    assert pr_lines["a"] == ([60.0, 80.0], [0.75, 0.25]) and pr_lines["b"] == ([50.0, 70.0], [0.5, 0.625])
    C.curves_plot(curves.assign(kv_bytes_ratio=NAN), tmp_path / "none.png")  # no bytes anywhere: the PR panel only
    assert len(figures[-1].axes) == 1


@pytest.fixture
def unsaved(monkeypatch):
    """Figures drawn but not encoded (``savefig`` only lays them out): for tests that look at the figure only."""
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: None)


def test_the_curves_plot_without_a_reference_or_its_ci(tmp_path, figures, unsaved):
    curves = frame(method=["a"], test_pr=[0.5], score=[0.5], ci_low=[0.25], ci_high=[0.75])
    C.curves_plot(curves, tmp_path / "none.png")
    C.curves_plot(curves, tmp_path / "nan.png", reference=(NAN, 0.1))
    C.curves_plot(curves, tmp_path / "noci.png", reference=(1.5, NAN))
    C.curves_plot(curves, tmp_path / "low.png", reference=(0.25, 0.5))
    none, nan, noci, low = (f.axes[0] for f in figures)
    for ax in (none, nan):
        assert [line.get_label() for line in ax.get_lines()] == ["a"] and not ax.patches
        assert ax.get_ylim() == pytest.approx((-0.03, 1.03))
        assert ax.get_ylabel() == "score (mean max-similarity)"
    assert [line.get_label() for line in noci.get_lines()] == ["fullkv", "a"] and not noci.patches
    assert noci.get_ylim() == pytest.approx((-0.03, 1.53))
    (band,) = low.patches  # 0.25 +- 0.5 clipped below at 0
    assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((0.0, 0.75))
    assert xy(noci.get_lines()[0]) == ([0.0, 1.0], [1.5, 1.5])  # FullKV's reference line, without its band
    C.curves_plot(curves.assign(ci_low=NAN, ci_high=NAN), tmp_path / "point_without_ci.png")
    assert [xy(line) for line in figures[-1].axes[0].get_lines()] == [([50.0], [0.5])]  # a point without its CI


# ---------------------------------------------------------------- writing, board points, tables


def test_write_curves_writes_the_three_files_and_returns_the_areas(tmp_path):
    curves = frame(method=["a", "a"], test_pr=[0.5, 0.7], score=[1 / 3, 0.5], ci_low=[1.5e-7, 0.2],
                   ci_high=[0.6, 0.7])
    out = tmp_path / "deep" / "out"
    areas = C.write_curves(curves, out, reference=(0.9, 0.05), metric="light")
    assert sorted(p.name for p in out.iterdir()) == ["auc.csv", "curves.csv", "curves.png"]
    assert (out / "curves.csv").read_text().splitlines() == [
        "method,test_pr,score,ci_low,ci_high", "a,0.5,0.333333,1.5e-07,0.6", "a,0.7,0.5,0.2,0.7"]  # %.6g
    # 0.2 * (1/3 + 1/2) / 2 = 1/12 = 0.0833333; mean 0.416667
    assert (out / "auc.csv").read_text().splitlines() == [
        "method,pr_low,pr_high,auc,mean_score,points", "a,0.5,0.7,0.0833333,0.416667,2"]
    assert areas["auc"].tolist() == pytest.approx([1 / 12])
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    C.write_curves(curves, str(out), reference=(0.9, 0.05), metric="light")  # an existing folder is fine


def test_write_curves_plots_with_fullkvs_reference_and_the_metric(tmp_path, monkeypatch):
    seen = []

    def plot(curves, path, reference, metric):
        seen.append((reference, metric))
        Path(path).write_bytes(b"png")

    monkeypatch.setattr(C, "curves_plot", plot)
    C.write_curves(frame(method=["a"], test_pr=[0.5], score=[0.5], ci_low=[0.4], ci_high=[0.6]), tmp_path,
                   reference=(0.9, 0.05), metric="light")
    assert seen == [((0.9, 0.05), "light")] and (tmp_path / "curves.png").read_bytes() == b"png"


def test_a_board_point_is_the_rows_pr_score_ci_bounds_and_quality():
    row = {"pr": 0.85, "score": 0.5, "score_ci95": 0.125, "n_tasks": 7, "subject_consistency": 0.75,
           "subject_consistency_ci95": 0.25, "imaging_quality": 0.5, "imaging_quality_ci95": 0.0, "other": 1}
    point = C.board_point(row)
    assert math.isnan(point.pop("kv_bytes_ratio"))  # a row from before the bytes were recorded
    assert point == {
        "test_pr": 0.85, "score": 0.5, "ci_low": 0.375, "ci_high": 0.625, "n_tasks": 7,
        "subject_consistency": 0.75, "subject_consistency_ci_low": 0.5, "subject_consistency_ci_high": 1.0,
        "imaging_quality": 0.5, "imaging_quality_ci_low": 0.5, "imaging_quality_ci_high": 0.5}
    assert C.board_point({**row, "kv_bytes_ratio": 0.125})["kv_bytes_ratio"] == 0.125
    assert list(C.board_point(pd.Series(row))) == ["test_pr", "kv_bytes_ratio", "score", "ci_low", "ci_high", "n_tasks",
                                                   "subject_consistency", "subject_consistency_ci_low",
                                                   "subject_consistency_ci_high", "imaging_quality",
                                                   "imaging_quality_ci_low", "imaging_quality_ci_high"]


def test_quality_columns_and_the_curve_table():
    table = frame(imaging_quality=[NAN, 0.5], motion_smoothness=[NAN, NAN], subject_consistency=[0.25, NAN],
                  unknown=[1, 2])
    assert C.quality_columns(table) == ["subject_consistency", "imaging_quality"]  # QUALITY_FIELDS order
    curve = C.curve_table([{"method": "a", "score": 0.5, "imaging_quality": 0.25, "junk": 1},
                           {"method": "b", "test_pr": 0.75, "imaging_quality_ci_low": 0.125}])
    assert list(curve.columns) == C.CURVE_COLUMNS + ["imaging_quality", "imaging_quality_ci_low",
                                                     "imaging_quality_ci_high"]
    assert curve["method"].tolist() == ["a", "b"] and curve["test_pr"].tolist()[1] == 0.75
    assert curve["imaging_quality_ci_low"].tolist()[1] == 0.125 and curve["imaging_quality_ci_high"].isna().all()
    assert list(C.curve_table([{"method": "a"}]).columns) == C.CURVE_COLUMNS


# ---------------------------------------------------------------- quality beside memory


POINTS = frame(method=["a", "a", "b", "c"], test_pr=[0.5, 0.8, 0.9, NAN], score=[0.5, 0.25, 0.75, 0.1],
               ci_low=[0.25, 0.0, 0.5, 0], ci_high=[1.0, 0.5, 1.0, 0], imaging_quality=[0.4, 0.8, NAN, 0.1],
               imaging_quality_ci_low=[0.2, 0.6, NAN, 0], imaging_quality_ci_high=[0.6, 1.0, NAN, 0],
               subject_consistency=[NAN, NAN, NAN, NAN])


def test_normalised_points_divide_every_value_by_fullkvs():
    got = C.normalised_points(POINTS, {"score": 0.5, "imaging_quality": 0.8}, memory="DINO")
    assert list(got.columns) == ["method", "test_pr", "metric", "kind", "value", "ci_low", "ci_high"]
    rows = [tuple(r) for r in got.itertuples(index=False)]
    expected = [("a", 0.5, "DINO", "memory", 1.0, 0.5, 2.0), ("a", 0.8, "DINO", "memory", 0.5, 0.0, 1.0),
                ("b", 0.9, "DINO", "memory", 1.5, 1.0, 2.0),
                ("a", 0.5, "imaging_quality", "quality", 0.5, 0.25, 0.75),
                ("a", 0.8, "imaging_quality", "quality", 1.0, 0.75, 1.25)]
    assert [r[:4] for r in rows[:5]] == [e[:4] for e in expected]
    assert [r[4:] for r in rows[:5]] == [pytest.approx(e[4:]) for e in expected]
    assert rows[5][:4] == ("b", 0.9, "imaging_quality", "quality") and all(map(math.isnan, rows[5][4:]))
    assert len(rows) == 6  # c has no PR; subject_consistency has no values
    assert C.normalised_points(POINTS, {"score": 0.5})["metric"].iloc[0] == "score"  # the default name


def test_normalised_points_are_nan_where_fullkv_has_no_value_or_zero():
    for reference in ({"score": 0.0, "imaging_quality": NAN}, {}):
        got = C.normalised_points(POINTS, reference)
        assert len(got) == 6 and got[["value", "ci_low", "ci_high"]].isna().all().all()


def test_the_quality_table_gives_each_metrics_range_inside_the_window():
    points = frame(metric=["DINO"] * 5 + ["iq"] * 3, kind=["memory"] * 5 + ["quality"] * 3,
                   method=["a", "a", "b", "b", "b", "a", "a", "b"],
                   test_pr=[0.74, 0.75, 0.85, 0.95, 0.96, 0.8, 0.9, 0.85],
                   value=[9.0, 0.5, 1.25, 0.75, -9.0, NAN, 1.0, NAN])
    table = C.quality_vs_memory_table(points)
    assert list(table.columns) == C.QUALITY_TABLE_COLUMNS
    # DINO: 0.75, 0.85, 0.95 inside [0.75, 0.95] (both ends inside): 0.5, 1.25, 0.75
    assert table.iloc[0].tolist() == pytest.approx(["DINO", "memory", 0.75, 0.95, 3, 0.5, 1.25, 0.75])
    assert table.iloc[1].tolist() == pytest.approx(["iq", "quality", 0.75, 0.95, 1, 1.0, 1.0, 0.0])  # NaNs dropped
    narrow = C.quality_vs_memory_table(points, (0.8, 0.8))
    assert narrow["points"].tolist() == [0, 0] and narrow[["min_vs_fullkv", "max_vs_fullkv", "range_vs_fullkv"]
                                                           ].isna().all().all()
    assert C.QUALITY_WINDOW == (0.75, 0.95)


def test_the_quality_plot_has_a_panel_per_metric_normalised_to_fullkv(tmp_path, figures):
    points = C.normalised_points(POINTS, {"score": 0.5, "imaging_quality": 0.8}, memory="DINO")
    path = C.quality_vs_memory_plot(points, str(tmp_path / "q.png"), title="Tiny")
    assert path == tmp_path / "q.png" and path.read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    dino, iq = fig.axes
    assert dino.get_shared_y_axes().joined(dino, iq)  # one y scale for every panel
    assert (dino.get_title(), iq.get_title()) == ("DINO (memory)", "imaging_quality")
    assert dino.get_ylabel() == "relative to FullKV (= 1)" and iq.get_ylabel() == ""
    assert dino.get_xlabel() == "realised PR (%)" == iq.get_xlabel()
    assert fig._suptitle.get_text() == "Tiny"
    assert dino.get_legend() is None and [t.get_text() for t in iq.get_legend().get_texts()] == ["fullkv", "a"]
    reference = {ax.get_title(): [xy(line) for line in ax.get_lines()][:2] for ax in (dino, iq)}
    # FullKV: the line at 1 and its own point at PR 0, in every panel
    assert reference["DINO (memory)"] == reference["imaging_quality"] == [([0.0, 1.0], [1.0, 1.0]), ([0.0], [1.0])]
    bars = {(ax.get_title(), c.get_label()): c for ax in (dino, iq) for c in ax.containers}
    assert list(bars) == [("DINO (memory)", "a"), ("DINO (memory)", "b"), ("imaging_quality", "a")]  # b's NaN: none
    a = bars[("DINO (memory)", "a")]
    assert xy(a.lines[0]) == ([50.0, 80.0], [1.0, 0.5])
    assert [seg[:, 1].tolist() for seg in a.lines[2][0].get_segments()] == [[0.5, 2.0], [0.0, 1.0]]  # the CIs
    assert xy(bars[("DINO (memory)", "b")].lines[0]) == ([90.0], [1.5])
    assert xy(bars[("imaging_quality", "a")].lines[0])[1] == pytest.approx([0.5, 1.0])
    bands = [corners(c) for c in dino.collections if type(c).__name__ != "LineCollection"]
    assert bands == [{(50, 0.5), (50, 2.0), (80, 0.0), (80, 1.0)}, {(90, 1.0), (90, 2.0)}]
    assert all(c.lines[0].get_marker() not in NO_MARKER for c in bars.values())  # every value a visible point
    for ax in (dino, iq):  # FullKV's line in the colour of its point, which the legend names, and that point visible
        line, point = ax.get_lines()[:2]
        assert to_rgb(line.get_color()) == to_rgb(point.get_color()) and point.get_marker() not in NO_MARKER
    C.quality_vs_memory_plot(points[points["metric"] == "DINO"], tmp_path / "one.png")
    assert figures[1]._suptitle is None and len(figures[1].axes) == 1
    no_ci = frame(method=["a"], test_pr=[0.5], metric=["DINO"], kind=["memory"], value=[0.9], ci_low=[NAN],
                  ci_high=[NAN])
    C.quality_vs_memory_plot(no_ci, tmp_path / "no_ci.png")  # a value without its CI is still drawn
    assert [xy(c.lines[0]) for c in figures[2].axes[0].containers] == [([50.0], [0.9])]
    # a PNG whatever the file is called (the curves command draws into its atomic writer's ``.tmp`` file)
    assert C.quality_vs_memory_plot(points, tmp_path / "q.tmp").read_bytes()[:4] == b"\x89PNG"


def test_one_legend_names_every_method_in_one_colour_across_panels(tmp_path, figures, unsaved):
    # the legend is drawn in the last panel only: it lists the methods as they are met, and a method's points,
    # bars and band keep one colour in every panel (also in "x", where b is missing)
    points = frame(method=["a", "b", "a"], test_pr=[0.5, 0.6, 0.5], metric=["x", "y", "y"], kind=["memory"] * 3,
                   value=[1.0, 0.9, 0.8], ci_low=[0.9, 0.8, 0.7], ci_high=[1.1, 1.0, 0.9])
    C.quality_vs_memory_plot(points, tmp_path / "q.png")
    x, y = figures[0].axes
    assert x.get_legend() is None and [t.get_text() for t in y.get_legend().get_texts()] == ["fullkv", "b", "a"]

    def colours(ax):
        bands = [c for c in ax.collections if type(c).__name__ != "LineCollection"]
        return {c.get_label(): (to_rgb(c.lines[0].get_color()), to_rgb(band.get_facecolor()[0]))
                for c, band in zip(ax.containers, bands)}

    seen_x, seen_y = colours(x), colours(y)
    assert seen_x["a"] == seen_y["a"] and seen_y["a"] != seen_y["b"]
    assert all(line == band for line, band in [*seen_x.values(), *seen_y.values()])  # a band in its line's colour
