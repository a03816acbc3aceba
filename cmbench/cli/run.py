"""``python -m cmbench run``: one method over the selected tasks; ``-m`` sweeps end with the leaderboard.

Selection (``limit``, ``task_ids``), sharding (``shard.count`` / ``shard.index`` or torchrun's
``WORLD_SIZE`` / ``RANK``) and the run directory are described in :mod:`cmbench.runs.experiment`.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from cmbench.runs.experiment import run_dir_for, run_experiment


def execute(cfg: DictConfig) -> int:
    """Run and print one line of results; exit 3 when some task failed."""
    done = run_experiment(cfg)
    summary, result = done.summary, done.result
    score = "-" if summary["score"] is None else f"{summary['score']:.4f}"
    pr = "-" if summary["pr"] is None else f"{100 * summary['pr']:.2f}%"
    print(f"{done.label}: {summary['tasks_ok']}/{summary['tasks_expected']} tasks ok "
          f"({result.done} run now, {result.cached} cached), {summary['tasks_failed']} failed; "
          f"{summary['metric'] or 'score'} {score}, PR {pr}; {done.run_dir}")
    if summary["tasks_failed"]:
        print(f"failed: {', '.join(summary['failed_task_ids'][:10])}"
              f"{' ...' if summary['tasks_failed'] > 10 else ''} (reasons in records.jsonl)", file=sys.stderr)
        return 3
    return 0


def after_sweep(configs: list[DictConfig]) -> int:
    """A ``-m`` sweep ends with the leaderboard over the run directories its jobs wrote."""
    from cmbench.cli.leaderboard import write_leaderboard

    return write_leaderboard(configs[-1], runs=list(dict.fromkeys(run_dir_for(c) for c in configs)))
