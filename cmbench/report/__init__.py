"""Reports from run records: leaderboards, per-source / per-type / per-seed tables, paired comparisons, plots."""

from cmbench.report.leaderboard import ReportError, clustered_mean_ci, load_runs, read_records, write_reports

__all__ = ["ReportError", "clustered_mean_ci", "load_runs", "read_records", "write_reports"]
