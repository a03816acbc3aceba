"""The ``report`` command: ``python -m cmbench report [runs=[dir,...]] [report.out=DIR]``.

Writes a self-contained HTML report (``index.html`` plus ``img/``, nothing fetched from anywhere)
over the same runs as ``leaderboard``: every run directory under ``<out_dir>/<data>/`` unless
``runs`` names them, with the leaderboard's paired comparisons (``leaderboard.focus`` /
``leaderboard.compare`` choose them, as for ``leaderboard``). ``report.screenshot=PNG`` also renders the page in headless Chromium and saves
it (``report.screenshot_method=X``: method X's view of the gallery). A ``curves.csv`` in the leaderboard
folder (or ``leaderboard.curves``) adds "Score @ 85% PR" to its leaderboard. See docs/report.md.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from omegaconf import DictConfig

from cmbench.cli.leaderboard import comparison_labels, find_run_dirs
from cmbench.spec import flag


def execute(cfg: DictConfig) -> int:
    """Build the report (and its screenshot) and print where it is, its size and how long it took."""
    from cmbench.report.html import build_report
    from cmbench.report.leaderboard import find_curves
    from cmbench.spec import data_dir

    out = Path(str(cfg.report.out or Path(str(cfg.out_dir)) / str(cfg.data.name) / "report"))
    board = Path(str(cfg.leaderboard.out or data_dir(cfg) / "leaderboard"))
    result = build_report(find_run_dirs(cfg), out, allow_mixed=flag(cfg.leaderboard.allow_mixed, "leaderboard.allow_mixed"),
                          shared_tasks=flag(cfg.leaderboard.get("shared_tasks", False), "leaderboard.shared_tasks"),
                          data_root=cfg.report.data_root, title=str(cfg.report.title),
                          allow_suspect=flag(cfg.leaderboard.get("allow_suspect", False), "leaderboard.allow_suspect"),
                          focus=comparison_labels(cfg, "focus"), compare=comparison_labels(cfg, "compare"),
                          curves=find_curves(board, cfg.leaderboard.get("curves")))
    methods = f"{len(result.methods)} method{'s' if len(result.methods) != 1 else ''}"
    print(f"report: {methods} x {result.tasks} tasks -> {result.index} "
          f"({result.files} files, {result.bytes / 1e6:.1f} MB, {result.seconds:.1f} s)")
    if cfg.report.screenshot:
        from cmbench.report.browser import screenshot

        method = cfg.report.screenshot_method
        view = f"method={quote(str(method))}" if method else ""
        shot = screenshot(result.index, Path(str(cfg.report.screenshot)), view=view)
        print(f"report: screenshot {shot}")
    return 0
