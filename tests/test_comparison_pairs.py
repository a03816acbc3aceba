"""Which pairs a leaderboard compares by default: each entry against FullKV, one direction, so a board of
``n`` methods makes ``n - 1`` comparisons (not every method against every other, both ways)."""

from __future__ import annotations

import pandas as pd

from cmbench.report import read_records, write_reports
from cmbench.report.comparisons import comparison_pairs
from test_report import TASKS, record, write_run


def board(tmp_path, labels, plugins=()):
    """One entry per label, each a run folder of the four tasks; ``plugins`` carry a plug-in code hash."""
    return [read_records(write_run(tmp_path / label, [
        {**record(label, t, 0.5), **({"code": {"method": "h"}} if label in plugins else {})} for t in TASKS]))
        for label in labels]


def test_by_default_every_entry_is_compared_with_fullkv_once(tmp_path):
    runs = board(tmp_path, ["decoprune", "fullkv", "mine", "random"], plugins=["mine"])
    assert comparison_pairs(runs) == [("decoprune", "fullkv"), ("mine", "fullkv"), ("random", "fullkv")]


def test_without_fullkv_nothing_is_compared_unless_asked(tmp_path):
    runs = board(tmp_path, ["decoprune", "mine", "random"], plugins=["mine"])
    assert comparison_pairs(runs) == []
    assert comparison_pairs(runs, focus=["mine"]) == [("mine", "decoprune"), ("mine", "random")]
    assert comparison_pairs(runs, compare=["mine", "decoprune"]) == [("mine", "decoprune")]


def test_focus_and_named_pairs_ask_for_more(tmp_path):
    runs = board(tmp_path, ["fullkv", "decoprune", "mine", "random"], plugins=["mine"])
    assert comparison_pairs(runs, compare=[["mine", "decoprune"], ["decoprune", "fullkv"]]) == [
        ("decoprune", "fullkv"), ("mine", "fullkv"), ("random", "fullkv"), ("mine", "decoprune")]
    assert comparison_pairs(runs, focus=["mine"]) == [("mine", "fullkv"), ("mine", "decoprune"), ("mine", "random")]


def test_focus_all_compares_every_pair_once(tmp_path):
    """``leaderboard.focus=all``: each pair of entries once, in board order, so any two entries have a difference."""
    runs = board(tmp_path, ["fullkv", "a", "b"])
    assert comparison_pairs(runs, focus=["all"]) == [("fullkv", "a"), ("fullkv", "b"), ("a", "b")]
    assert comparison_pairs(runs, focus="all", compare=["b", "a"]) == [("fullkv", "a"), ("fullkv", "b"), ("a", "b"),
                                                                        ("b", "a")]
    named = board(tmp_path / "named", ["all", "x"])  # an entry labelled "all" is a label like any other
    assert comparison_pairs(named, focus=["all"]) == [("all", "x")]


def test_the_written_board_compares_each_variant_with_fullkv(tmp_path):
    """Three variants of a plug-in and FullKV: three comparisons, not every variant against every other both ways."""
    plugin = {"code": {"method": "h"}}
    runs = [write_run(tmp_path / label, [{**record(label, t, 0.5), **(plugin if label != "fullkv" else {})}
                                         for t in TASKS]) for label in ("fullkv", "v1", "v2", "v3")]
    compared = pd.read_csv(write_reports(runs, tmp_path / "board")["comparisons.csv"])
    assert compared[["method", "versus"]].values.tolist() == [["v1", "fullkv"], ["v2", "fullkv"], ["v3", "fullkv"]]
