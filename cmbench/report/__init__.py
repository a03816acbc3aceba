"""Reports from run records: leaderboards, per-source / per-type tables, paired deltas, plots."""

from cmbench.report.leaderboard import ReportError, clustered_mean_ci, read_records, write_reports

__all__ = ["ReportError", "clustered_mean_ci", "read_records", "write_reports"]
