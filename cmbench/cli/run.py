"""``python -m cmbench run``: one method over the selected tasks; ``-m`` sweeps end with their leaderboard.

The composed config is resolved and checked once (:func:`cmbench.spec.resolve_run`: every knob, the
method, selection, sharding (``shard.count`` / ``shard.index``, torchrun's ``WORLD_SIZE`` / ``RANK`` or a
Slurm array's ``SLURM_ARRAY_TASK_COUNT`` / ``_ID``) and the run directory), then run by
:func:`cmbench.runs.experiment.run_experiment`. A task of a Slurm array has no process waiting for the
others, so it ends with the command that builds the board once they have all ended. Under torchrun with
``parallel.sequence=P`` each group of ``P`` ranks runs one split model and only its first rank prints
(:mod:`cmbench.runs.ranks`).
Tasks whose records came from other code (an edited method, CMBench or weights) are computed again
and the run says so; with ``keep_other_code=true`` they are kept and the run warns, naming them.
"""

from __future__ import annotations

import os
import sys

from omegaconf import DictConfig

from cmbench.calibration.target_pr import resolve_target_pr
from cmbench.config_paths import to_dict
from cmbench.runs.experiment import ExperimentResult, run_experiment
from cmbench.identity.code import changed_parts, describe_changes
from cmbench.spec import flag, parallel_spec, resolve_run, slurm_array


def _ids(task_ids: list[str], most: int = 10) -> str:
    return ", ".join(task_ids[:most]) + (" ..." if len(task_ids) > most else "")


def code_messages(done: ExperimentResult) -> list[str]:
    """What the run did about records from other code: recomputed, or kept (a warning)."""
    result, lines = done.result, []
    for ids, template in (
        (result.recomputed, "{label}: {n} task(s) recomputed: their records came from other code ({what})"),
        (result.other_code, "{label}: warning: {n} task(s) kept from other code ({what}) because "
                            "keep_other_code=true; their results are not this code's: {ids}"),
    ):
        if ids:
            what = sorted({p for i in ids for p in changed_parts(result.previous_code.get(i), done.code.parts)})
            lines.append(template.format(label=done.label, n=len(ids), what=describe_changes(what), ids=_ids(ids)))
    return lines


def board_later(cfg: DictConfig, shards: int) -> str | None:
    """For a task of a Slurm array that shards this run (``shards`` > 1): the one line that builds the
    board once every task of the array has ended (nothing waits for them), else None."""
    shard = cfg.get("shard") or {}
    if shards < 2 or not flag(shard.get("slurm_array", True), "shard.slurm_array") or slurm_array() is None:
        return None
    job = os.environ.get("SLURM_ARRAY_JOB_ID", "<array job id>")
    command = f"python -m cmbench leaderboard data={cfg.data.name} out_dir={cfg.out_dir}"
    return (f"board: once every task of Slurm array {job} has ended: {command} (or submit it to run then: "
            f"sbatch --dependency=afterany:{job} --wrap '{command}')")


def execute(cfg: DictConfig) -> int:
    """Run and print one line of results; exit 3 when some task failed."""
    target = resolve_target_pr(cfg)  # method.target_pr -> the method's calibrated knob, before anything reads it
    spec = resolve_run(target.cfg, target.record_fields())
    done = run_experiment(spec)
    summary, result = done.summary, done.result
    if not done.writer:  # another rank of this split model printed the run's lines
        return 3 if summary["tasks_failed"] else 0
    for line in code_messages(done):
        print(line, file=sys.stderr)
    score = "-" if summary["score"] is None else f"{summary['score']:.4f}"
    pr = "-" if summary["pr"] is None else f"{100 * summary['pr']:.2f}%"
    kept = f", {summary['tasks_other_code']} from other code" if summary.get("tasks_other_code") else ""
    print(f"{done.label}: {summary['tasks_ok']}/{summary['tasks_expected']} tasks ok "
          f"({result.done} run now, {result.cached} cached{kept}), {summary['tasks_failed']} failed; "
          f"{summary['metric'] or 'score'} {score}, PR {pr}; {done.run_dir}")
    later = board_later(cfg, spec.selection.shard[0])
    if later is not None:
        print(later)
    if summary["tasks_failed"]:
        print(f"failed: {_ids(summary['failed_task_ids'])} (reasons in records.jsonl)", file=sys.stderr)
        return 3
    return 0


def after_sweep(configs: list[DictConfig]) -> int:
    """A ``-m`` sweep ends with its leaderboard over the run directories its jobs wrote, on the tasks the
    sweep ran (a run directory may hold more from earlier runs), in a folder of its own, and refreshes
    the leaderboard over every run (:func:`cmbench.cli.leaderboard.write_sweep_leaderboards`); the seeds
    of one setup, ``-m seed=2,3,4``, are one row."""
    from cmbench.cli.leaderboard import selected_task_ids, write_sweep_leaderboards
    from cmbench.runs.ranks import launch_of

    launch = launch_of(parallel_spec({"parallel": to_dict(configs[-1].get("parallel") or {})}))
    if launch is not None and not launch.writer:  # a follower of a split model wrote no run: no board either
        return 0
    # calibrations are cached by the jobs, so resolving each target again measures nothing
    specs = [resolve_run(t.cfg, t.record_fields()) for t in (resolve_target_pr(c, verbose=False) for c in configs)]
    return write_sweep_leaderboards(configs[-1], list(dict.fromkeys(s.run_dir for s in specs)), selected_task_ids(specs))
