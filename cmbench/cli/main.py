"""``python -m cmbench <command> key=value ...``: dispatch to the subcommand modules of :mod:`cmbench.cli`.

Every Hydra command takes overrides over ``configs/config.yaml`` (groups ``data/``, ``method/``,
``backbone/``, ``scorer/``, ``experiment/``); ``-m`` / ``--multirun`` sweeps work for ``run``.
"""

from __future__ import annotations

import sys

from cmbench.cli.base import COMMANDS, SWEEP_FLAGS, Command, run_hydra
from cmbench.errors import CMBenchError
from cmbench.registry import did_you_mean

for _command in (
    Command("run", "generate and score every task with one method (-m to sweep)", "cmbench.cli.run"),
    Command("leaderboard", "leaderboard CSVs, markdown and Pareto plot over runs", "cmbench.cli.leaderboard"),
    Command("report", "self-contained HTML report with per-task galleries over runs", "cmbench.cli.report"),
    Command("score", "score a folder of <task_id>.mkv / .mp4 continuations from any generator", "cmbench.cli.score"),
    Command("validate", "check a manifest and its videos; list every problem", "cmbench.cli.validate"),
    Command("prepare", "build MiniWorld or fetch the official CMBench dataset", "cmbench.cli.prepare"),
    Command("ls", "list what is registered in each config group", "cmbench.cli.ls", hydra=False),
    Command("check", "check a method against the method contract on a random tiny model", "cmbench.cli.check"),
    Command("calibrate", "find a method's own knob value for a target PR on calibration contexts", "cmbench.cli.calibrate"),
    Command("curves", "score vs PR: calibrate each method to several PRs, run, plot, area under the curve",
            "cmbench.cli.curves"),
    Command("diagnose", "x0 error per context chunk and denoising step: full cache, method's cache, no history",
            "cmbench.cli.diagnose"),
    Command("plan", "predicted device memory per phase and the offloads a run would use", "cmbench.cli.plan"),
):
    COMMANDS.add(_command.name, _command)

USAGE = """usage: python -m cmbench <command> [key=value ...] [-m]

commands:
{commands}

examples:
  python -m cmbench run method=decoprune limit=8
  python -m cmbench validate data=cmbench data.root=/path/to/CMBench
  python -m cmbench ls method
"""


def usage() -> str:
    names = COMMANDS.names()
    width = max(map(len, names))
    return USAGE.format(commands="\n".join(f"  {n.ljust(width)}  {COMMANDS.get(n).help}" for n in names))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        hint = did_you_mean(name, COMMANDS.names())
        print(f"cmbench: unknown command {name!r}.{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    command = COMMANDS.get(name)
    execute = command.function()
    if execute is None:
        raise RuntimeError(f"command module {command.module} has no execute function")
    if not command.hydra:
        return int(execute(rest))
    jobs = run_hydra(execute, rest)
    code = max((job.code for job in jobs), default=0)
    after_sweep = command.function("after_sweep")
    configs = [job.cfg for job in jobs if job.cfg is not None]
    if after_sweep is not None and set(SWEEP_FLAGS) & set(rest) and configs:
        try:
            code = max(code, int(after_sweep(configs)))
        except CMBenchError as err:
            print(f"cmbench: {name}: {err}", file=sys.stderr)
            code = max(code, 1)
    return code
