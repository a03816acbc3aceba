"""Command line: ``python -m cmbench <command> key=value ...``.

Every command takes Hydra overrides over ``configs/config.yaml`` (groups ``data/``, ``method/``,
``backbone/``, ``scorer/``, ``experiment/``); ``-m`` / ``--multirun`` sweeps work for ``run``.
Commands are looked up in :data:`COMMANDS` and imported lazily, so ``ls`` and ``validate`` stay fast.
"""

from __future__ import annotations

import importlib
import sys

from cmbench.config_paths import CONFIG_DIR, user_config_dirs
from cmbench.errors import CMBenchError

# command -> (module:function taking the resolved DictConfig and returning an exit code, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("cmbench.cli.data:validate", "check a manifest and its videos; list every problem"),
    "prepare": ("cmbench.cli.data:prepare", "build MiniWorld or fetch the official CMBench dataset"),
    "ls": ("cmbench.cli.ls:ls", "list what is registered in each config group"),
    "score": ("cmbench.cli.score:score", "score a folder of <task_id>.mp4 continuations"),
    "run": ("cmbench.cli.run:run", "generate and score every task with one method (-m to sweep)"),
    "leaderboard": ("cmbench.cli.run:leaderboard", "leaderboard CSVs, markdown and Pareto plot over runs"),
    "report": ("cmbench.cli.report:report", "self-contained HTML report with per-task galleries over runs"),
}

USAGE = """usage: python -m cmbench <command> [key=value ...] [-m]

commands:
{commands}

examples:
  python -m cmbench validate data=cmbench data.root=/path/to/CMBench
  python -m cmbench ls method
"""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = "\n".join(f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items())
    return USAGE.format(commands=lines)


def _resolve(command: str):
    target, _ = COMMANDS[command]
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        print(f"cmbench: unknown command '{command}'.{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    func = _resolve(command)
    if command == "ls":  # positional group names, no Hydra
        return func(rest)
    code, last_cfg = _run_hydra(func, rest)
    if command == "run" and ({"-m", "--multirun"} & set(rest)) and last_cfg is not None:
        from cmbench.cli import run as run_command

        try:  # a sweep ends with the leaderboard over the runs it wrote
            code = max(code, run_command.leaderboard(last_cfg, runs=list(dict.fromkeys(run_command.RUN_DIRS))))
        except CMBenchError as err:
            print(f"cmbench: leaderboard: {err}", file=sys.stderr)
            code = max(code, 1)
    return code


def _run_hydra(func, overrides: list[str]):
    """Run ``func(cfg)`` under Hydra (so ``-m`` sweeps and the usual override grammar work).

    Returns the worst exit code over the jobs and the last job's config.
    """
    import hydra
    from omegaconf import DictConfig

    codes: list[int] = []
    configs: list[DictConfig] = []

    @hydra.main(version_base=None, config_path=str(CONFIG_DIR), config_name="config")
    def _app(cfg: DictConfig) -> None:
        configs.append(cfg)
        try:
            codes.append(int(func(cfg) or 0))
        except CMBenchError as err:
            print(f"cmbench: error: {err}", file=sys.stderr)
            codes.append(1)

    # Hydra's parser wants its flags (-m, --cfg job, ...) before the overrides; users put them anywhere
    flags = [o for o in overrides if o in ("-m", "--multirun")]
    overrides = flags + [o for o in overrides if o not in flags]
    extra = user_config_dirs()
    if extra:
        paths = ",".join(f"file://{p}" for p in extra)
        overrides = [*flags, f"hydra.searchpath=[{paths}]", *overrides[len(flags):]]
    saved = sys.argv
    sys.argv = [saved[0] if saved else "cmbench", *overrides]
    try:
        _app()
    except SystemExit as exit_:
        return int(exit_.code or 0), None
    finally:
        sys.argv = saved
    return max(codes, default=0), (configs[-1] if configs else None)
