"""A ``-m`` sweep's jobs, whatever Hydra launcher runs them: each job's exit status reaches the sweep
and the launcher, and the sweep gathers every job's result for its board.

A launcher may run a job in this process (Hydra's ``basic``), in a pool of worker processes
(``joblib``), or in a process of its own on another node (``submitit_local``, ``submitit_slurm``), so
nothing passes back through this process's memory. Each job writes its outcome, its exit status and its
resolved config, as ``cmbench-job.json`` in its own Hydra job folder (``<hydra.sweep.dir>/<job
number>/``); the sweep's folder is one of its own (``<out_dir>/sweeps/<date>_<time>-<pid>/``), found
by :class:`SweepFolder` (a Hydra callback) as the sweep starts, and read when the launcher returns,
so the sweep finishes every job it can, then ends with the board of those that ran and fails if any
failed. A job that a launcher runs in a process of its own (submitit) also ends that process with its
exit status (after submitit has stored its result), so Slurm shows the job FAILED and ``afterok``
dependencies do not fire.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cmbench import bounded_read
from cmbench.config_paths import to_dict
from cmbench.errors import CMBenchError
from cmbench.runs import atomic

JOB_FILE = "cmbench-job.json"
SWEEP_DIR_KEY = "hydra.sweep.dir"
OWN_PROCESS_LAUNCHERS = ("submitit",)  # launchers whose jobs each have a process of their own
# the folder of each sweep this process started (SweepFolder), newest last, with the job folders it already held
_started: list[tuple[Path, set[str]]] = []


def sweep_dir_override(overrides: list[str]) -> list[str]:
    """``hydra.sweep.dir`` for a sweep of its own (this moment and process), unless the user set one."""
    if any(o.lstrip("+~").startswith(f"{SWEEP_DIR_KEY}=") for o in overrides):
        return []
    return [f"{SWEEP_DIR_KEY}=${{out_dir}}/sweeps/{time.strftime('%Y-%m-%d_%H-%M-%S', time.gmtime())}-{os.getpid()}"]


class SweepFolder(Callback):
    """Hydra callback (``hydra.callbacks`` in configs/config.yaml): at the start of a sweep, in the
    process that launches it, note the sweep's folder and the job folders an earlier sweep left there (a
    folder the user named twice), and remove their outcomes, so only this sweep's jobs are gathered."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = Path(str(config.hydra.sweep.dir))
        for old in folder.glob(f"*/{JOB_FILE}"):
            old.unlink(missing_ok=True)
        _started.append((folder, {d.name for d in folder.glob("*") if d.is_dir()}))


def record_job(cfg: DictConfig, code: int) -> None:
    """In a sweep's job (any process, any host): write the job's outcome into its Hydra job folder, and
    where the launcher gave the job a process of its own, end that process with ``code`` once the
    launcher has stored the job's result (Slurm: FAILED, no ``afterok``)."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    folder = Path(str(hydra_cfg.runtime.output_dir))
    try:
        outcome = {"job": int(hydra_cfg.job.num), "code": int(code), "config": to_dict(cfg)}
        atomic.write_text(folder / JOB_FILE, json.dumps(outcome, sort_keys=True, default=str) + "\n")
    except (OSError, CMBenchError, OmegaConfBaseException) as err:  # unwritable, or a config that does not resolve
        print(f"cmbench: sweep job {hydra_cfg.job.num}: cannot write its outcome into {folder} ({err}): the sweep "
              f"counts it as failed", file=sys.stderr)
    launcher = str(hydra_cfg.launcher.get("_target_", ""))
    if code and any(name in launcher for name in OWN_PROCESS_LAUNCHERS):
        atexit.register(_exit_with, int(code))


def _exit_with(code: int) -> None:
    """The last act of a job's own process: its exit status (handlers registered after this one have run)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def gathered_jobs() -> list[tuple[int, int, DictConfig | None]]:
    """``(job number, exit status, config)`` of every job of the sweep this process started, by job
    number: every job folder Hydra made there (a job that started); one without a readable outcome (its
    process was killed, or could not write) is that job's failure (config None), named on one line, unless
    the folder was there before the sweep (an earlier sweep's job that this one did not have)."""
    if not _started:
        return []
    folder, earlier = _started.pop()
    jobs = []
    for job in sorted((d for d in folder.glob("*") if d.name.isdigit() and d.is_dir()), key=lambda d: int(d.name)):
        if job.name in earlier and not (job / JOB_FILE).exists():
            continue
        try:
            outcome = json.loads(bounded_read.read_bytes(job / JOB_FILE, "config"))
            jobs.append((int(outcome["job"]), int(outcome["code"]), OmegaConf.create(outcome["config"])))
        except (OSError, ValueError, KeyError, TypeError, CMBenchError, OmegaConfBaseException) as err:
            why = "it wrote no outcome (killed?)" if isinstance(err, FileNotFoundError) else f"its outcome: {err}"
            print(f"cmbench: sweep job {job.name} ({job}) failed: {why}", file=sys.stderr)
            jobs.append((int(job.name), 1, None))
    failed = [f"{number} (exit status {code})" for number, code, _ in jobs if code]
    if failed:
        print(f"cmbench: sweep: {len(failed)} of {len(jobs)} job(s) failed: job {', '.join(failed)}; a job's output "
              f"is in its launcher's log (submitit: {folder}/.submitit/)", file=sys.stderr)
    return jobs
