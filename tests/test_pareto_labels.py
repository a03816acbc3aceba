"""The Pareto plot's point labels never overlap, even where many entries sit at one PR with close scores (the
kvpress board: every press at PR 85.50%), and each stays tied to its point."""

from __future__ import annotations

import itertools

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from cmbench.report import leaderboard as lb


def drawn(tmp_path, monkeypatch, board):
    """The annotations of the figure ``pareto_plot`` saves, with its renderer."""
    saved = []
    original = Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    lb.pareto_plot(board, tmp_path / "pareto.png")
    fig = saved[0]
    renderer = FigureCanvasAgg(fig).get_renderer()  # pyplot closed it: a canvas to measure the saved layout
    return [a for a in fig.axes[0].texts], renderer


def crowded_board(n=9):
    """A layout fixture, not results: nine long labels at one PR, their scores in two tight clusters with a tie
    (the shape of a kvpress board, where every press runs at the same PR)."""
    methods = [f"kvpress_{name}Press@pr85" for name in ("Random", "KeyDiff", "CUR", "ObservedAttention", "TOVA",
                                                          "Knorm", "LagKV", "StreamingLLM", "SnapKV")][:n]
    scores = [0.825, 0.813, 0.767, 0.445, 0.419, 0.389, 0.324, 0.324, 0.3][:n]
    return pd.DataFrame({"method": methods, "pr": [0.855] * n, "score": scores, "score_ci95": [0.05] * n,
                         "metric": ["light"] * n})


def test_labels_of_crowded_points_do_not_overlap(tmp_path, monkeypatch):
    labels, renderer = drawn(tmp_path, monkeypatch, crowded_board())
    assert len(labels) == 9
    boxes = [Text.get_window_extent(a, renderer) for a in labels]  # the texts, not the lines to their points
    overlapping = [(a.get_text(), b.get_text()) for (a, p), (b, q) in itertools.combinations(zip(labels, boxes), 2)
                   if p.overlaps(q)]
    assert overlapping == []
    assert sorted(a.get_text() for a in labels) == sorted(crowded_board()["method"])
    assert all(a.arrow_patch is not None for a in labels)  # a moved label stays tied to its point
    figure = labels[0].figure.bbox
    assert all(figure.x0 <= b.x0 and b.x1 <= figure.x1 for b in boxes)  # long names at PR 85% stay in the figure


def test_a_label_with_room_stays_beside_its_point(tmp_path, monkeypatch):
    board = pd.DataFrame({"method": ["fullkv", "decoprune"], "pr": [0.0, 0.86], "score": [0.93, 0.88],
                          "score_ci95": [0.05, 0.05], "metric": ["light", "light"]})
    labels, _ = drawn(tmp_path, monkeypatch, board)
    assert [tuple(a.xyann) for a in labels] == [(5, 4), (-5, 4)]  # right of its point, or left near the right edge
