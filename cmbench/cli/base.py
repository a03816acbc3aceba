"""What every subcommand shares: its registry entry and the Hydra runner.

A subcommand is a module of :mod:`cmbench.cli` with an ``execute`` function: Hydra commands take the
resolved root config (``configs/config.yaml`` plus overrides) and return an exit code; a command with
``hydra=False`` (``ls``) takes its raw arguments. A ``-m`` sweep runs ``execute`` once per job and then
the command's ``after_sweep`` (``run``: the leaderboard of the runs the sweep wrote), which gets every
job's config, so nothing passes between jobs through module state. A sweep's jobs may run in other
processes or on other hosts (Hydra's launchers: joblib, submitit): each job's exit status and config
reach the sweep through its job folder (:mod:`cmbench.cli.sweep`). ``<command> --help`` (or ``-h``)
prints the command's own help from its registry entry (:meth:`Command.usage`): what it does and the keys
a user sets for it, without importing the command or composing a config.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cmbench.config_paths import CONFIG_DIR, complete_method_name, knob_overrides, search_path_overrides, unknown_choice
from cmbench.errors import CMBenchError
from cmbench.registry import Registry, import_object

SWEEP_FLAGS = ("-m", "--multirun")
HELP_FLAGS = ("-h", "--help")
KEY_WIDTH = 34  # the key column of a command's help; a longer key pushes its line's text right


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, help and the module that implements it.

    Attributes
    ----------
    name : str
    help : str
        One line, in the list of commands.
    module : str
        Imported on use (``cmbench.cli.<name>``), so listing commands stays cheap.
    hydra : bool
        ``execute(cfg) -> int`` under Hydra; ``False``: ``execute(args: list[str]) -> int``.
    description : str
        What the command does, for its ``--help``.
    keys : tuple of (str, str)
        The keys (``limit=N``) or, without Hydra, the arguments a user sets, each with one line.
    synopsis : str
        What follows the command's name on its usage line.
    """

    name: str
    help: str
    module: str
    hydra: bool = True
    description: str = ""
    keys: tuple[tuple[str, str], ...] = ()
    synopsis: str = "[key=value ...]"

    def usage(self) -> str:
        """The command's ``--help``: usage, what it does, its keys one per line."""
        heading = "keys" if self.hydra else "arguments"
        width = min(KEY_WIDTH, max((len(key) for key, _ in self.keys), default=0))
        lines = [f"usage: python -m cmbench {self.name} {self.synopsis}", "", *textwrap.wrap(self.description, 100),
                 "", f"{heading}:"]
        lines += [f"  {key.ljust(width)}  {text}" for key, text in self.keys]
        if self.hydra:
            lines += ["", *textwrap.wrap("Overrides use Hydra's grammar; any key of configs/config.yaml and of the "
                                         "chosen groups can be set; `python -m cmbench ls` lists each group's "
                                         "options.", 100)]
        return "\n".join(lines)

    def function(self, attr: str = "execute") -> Callable[..., Any] | None:
        """``execute`` (or another attribute, e.g. ``after_sweep``) of the command's module, if defined."""
        module = import_object(self.module, f"command {self.name!r}")
        return getattr(module, attr, None)


COMMANDS: Registry[Command] = Registry("command")


@dataclass(frozen=True)
class Job:
    """One Hydra job of a command: its exit code and resolved config."""

    code: int
    cfg: Any


def error(message: str, command: str = "cmbench") -> None:
    """Print a one-line error (no traceback): what a user can act on."""
    print(f"{command}: error: {message}", file=sys.stderr)


def set_threads(cfg: Any) -> None:
    """Run torch on ``cfg.threads`` CPU threads, for every command (null: torch's default, every core).

    Raises
    ------
    ConfigError
        ``threads`` is not a whole number in [1, :data:`cmbench.spec.MAX_THREADS`].
    """
    from cmbench.spec import thread_count

    threads = thread_count(cfg.get("threads"))
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)


def run_hydra(func: Callable[[Any], int], overrides: list[str]) -> list[Job]:
    """Run ``func(cfg)`` under Hydra, so ``-m`` sweeps and the usual override grammar work.

    A sweep's jobs run wherever its launcher (``hydra/launcher=...``) runs them; each records its exit
    status and config (:func:`cmbench.cli.sweep.record_job`), gathered here once the launcher returns,
    or fails (a job that raised still counts, as failed).

    Returns
    -------
    list of Job
        One per job, in order; ``[Job(code, None)]`` when Hydra itself refused the overrides (it printed
        why), and a sweep whose launcher failed has such a job after the ones it finished.
    """
    import hydra
    from omegaconf import DictConfig, OmegaConf

    from cmbench.cli.sweep import gathered_jobs, record_job, sweep_dir_override

    jobs: list[Job] = []
    sweeping = any(o in SWEEP_FLAGS for o in overrides)

    @hydra.main(version_base=None, config_path=str(CONFIG_DIR), config_name="config")
    def _app(cfg: DictConfig) -> int:
        from hydra.core.hydra_config import HydraConfig

        code = 1
        try:
            complete_method_name(cfg, HydraConfig.get().runtime.choices.get("method"))
            if sweeping:  # a job is one setting, never a shard of a Slurm array (submitit runs a sweep as one)
                OmegaConf.update(cfg, "shard.slurm_array", False, force_add=True)
            set_threads(cfg)
            code = int(func(cfg) or 0)
        except CMBenchError as err:
            error(str(err))
        finally:  # a job that raised counts too: as failed
            if sweeping:
                record_job(cfg, code)
            else:
                jobs.append(Job(code, cfg))
        return code

    # Hydra's parser wants its flags (-m, --cfg job, ...) before the overrides; users put them anywhere
    flags = [o for o in overrides if o in SWEEP_FLAGS]
    rest = knob_overrides([o for o in overrides if o not in flags])
    try:
        unknown = unknown_choice(rest)
        if unknown is not None:  # one line, not Hydra's list of options and search path
            error(unknown)
            return [Job(1, None)]
        rest = [*search_path_overrides(), *rest, *(sweep_dir_override(rest) if sweeping else [])]
    except CMBenchError as err:
        error(str(err))
        return [Job(1, None)]
    saved = sys.argv
    sys.argv = [saved[0] if saved else "cmbench", *flags, *rest]
    refused = None
    try:
        _app()
    except SystemExit as exit_:
        if exit_.code:
            refused = Job(int(exit_.code) if isinstance(exit_.code, int) else 1, None)
    finally:
        sys.argv = saved
    if sweeping:
        jobs = [Job(code, cfg) for _, code, cfg in gathered_jobs()]
    return [*jobs, refused] if refused is not None else jobs
