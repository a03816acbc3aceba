"""Optional experiment-tracker logging: a run's tasks and summary to Weights & Biases (``logging.wandb``).

Off by default. ``logging.wandb=PROJECT`` (or ``true``: project ``cmbench``; or a mapping with ``project``,
``entity``, ``mode``, ``dir``, ``tags``) starts one W&B run per CMBench run: named by the run's label,
grouped by its setup (the seeds of one setup side by side), its result config as the W&B config. Each
task's numbers are logged as it finishes (``task/score``, ``task/pr``, ... with ``task/index`` as the
step), then a table of every task and the run's summary. ``WANDB_MODE=offline`` (or ``mode: offline``)
keeps everything local (``wandb sync`` uploads it later).

wandb is not a dependency of CMBench: ``pip install 'cmbench[tracking]'``. A run that asks for it
without it installed, or whose W&B run cannot start, is refused before any task runs; a failure while
logging is said once and the run goes on (the records are the result, the tracker a view of them).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from cmbench.errors import ConfigError

EXTRA = "pip install 'cmbench[tracking]'"
WANDB_KEYS = ("project", "entity", "mode", "dir", "tags")
MODES = ("online", "offline", "disabled")
DEFAULT_PROJECT = "cmbench"
TASK_NUMBERS = ("score", "detection_rate", "pr", "context_pr", "kv_bytes_ratio", "peak_kv_bytes", "attention_flops",
                "attention_keys_per_token", "continuation_fps", "continuation_seconds")
"""The record fields logged per task (as ``task/<field>``) when the record has them."""
TABLE_COLUMNS = ("task_id", "source", "task_type", "status", "seed", "score", "pr", "kv_bytes_ratio", "error")
SUMMARY_KEYS = ("metric", "tasks_expected", "tasks_recorded", "tasks_ok", "tasks_failed", "score", "score_all_tasks",
                "detection_rate", "pr", "kv_bytes_ratio", "peak_kv_bytes", "mean_kv_bytes", "code_hash")
"""The keys of ``summary.json`` set as the W&B run's summary."""


def tracker_settings(logging: Any) -> dict[str, Any] | None:
    """The W&B settings ``logging`` asks for, checked (None: no tracker).

    Raises
    ------
    ConfigError
        One line naming the bad key.
    """
    if logging is None:
        return None
    if not isinstance(logging, Mapping):
        raise ConfigError(f"logging={logging!r}: expected a mapping, e.g. logging.wandb=PROJECT")
    unknown = sorted(set(logging) - {"wandb"})
    if unknown:
        raise ConfigError(f"logging.{unknown[0]}: not a tracker CMBench logs to (logging.wandb)")
    value = logging.get("wandb")
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, str) and value:
        return {"project": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"logging.wandb={value!r}: expected a project name, true, or a mapping of "
                          f"{', '.join(WANDB_KEYS)}")
    settings = dict(value)
    for key, item in settings.items():
        if key not in WANDB_KEYS:
            raise ConfigError(f"logging.wandb.{key}: not a setting CMBench passes (one of {', '.join(WANDB_KEYS)})")
        if key == "tags":
            if not isinstance(item, list) or not all(isinstance(t, str) for t in item):
                raise ConfigError(f"logging.wandb.tags={item!r}: expected a list of words")
        elif item is not None and not isinstance(item, str):
            raise ConfigError(f"logging.wandb.{key}={item!r}: expected text")
    if settings.get("mode") is not None and settings["mode"] not in MODES:
        raise ConfigError(f"logging.wandb.mode={settings['mode']!r}: expected one of {', '.join(MODES)}")
    return settings


class Tracker:
    """One W&B run for one CMBench run.

    Parameters
    ----------
    settings : dict
        :func:`tracker_settings`.
    label, group : str
        The run's label (the W&B run's name) and its setup hash (the W&B group).
    config : dict
        The run's result config.

    Raises
    ------
    ConfigError
        wandb is not installed, or its run cannot start (one line).
    """

    def __init__(self, settings: Mapping[str, Any], *, label: str, group: str | None, config: Mapping[str, Any]):
        try:
            import wandb
        except ImportError:
            raise ConfigError(f"logging.wandb: wandb is not installed ({EXTRA})") from None
        self._wandb = wandb
        try:
            self.run = wandb.init(project=settings.get("project") or DEFAULT_PROJECT, entity=settings.get("entity"),
                                  mode=settings.get("mode"), dir=settings.get("dir"), tags=settings.get("tags"),
                                  name=label, group=group, job_type="run", config=dict(config))
        except Exception as err:  # a missing login, an unreachable server: before any task runs
            raise ConfigError(f"logging.wandb: cannot start a W&B run: {str(err).splitlines()[0][:200]}") from None
        self.rows: list[list[Any]] = []
        self._failed = False

    def _guard(self, log) -> None:
        """Run ``log``; its first failure is said once, and the run goes on without the tracker."""
        if self._failed:
            return
        try:
            log()
        except Exception as err:
            self._failed = True
            print(f"logging.wandb: logging stopped: {str(err).splitlines()[0][:200]}", file=sys.stderr)

    def record(self, record: Any) -> None:
        """Log one task's numbers (a :class:`cmbench.runs.records.TaskRecord`) as it is written."""
        values = {f"task/{name}": getattr(record, name) for name in TASK_NUMBERS if getattr(record, name) is not None}
        values["task/ok"] = int(record.status == "ok")
        values["task/index"] = len(self.rows)
        self.rows.append([getattr(record, name) for name in TABLE_COLUMNS])
        self._guard(lambda: self.run.log(values))

    def finish(self, summary: Mapping[str, Any] | None) -> None:
        """Log the table of this invocation's tasks and the run's summary, then close the W&B run
        (``summary`` None: the run stopped early; W&B marks it failed)."""
        def close() -> None:
            if self.rows:
                self.run.log({"tasks": self._wandb.Table(columns=list(TABLE_COLUMNS), data=self.rows)})
            if summary is not None:
                self.run.summary.update({k: summary[k] for k in SUMMARY_KEYS if summary.get(k) is not None})
        self._guard(close)
        try:
            self.run.finish(exit_code=0 if summary is not None else 1)
        except Exception as err:
            print(f"logging.wandb: the W&B run did not close: {str(err).splitlines()[0][:200]}", file=sys.stderr)
