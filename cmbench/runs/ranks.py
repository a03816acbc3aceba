"""A run whose model is split over a group of torchrun ranks (``parallel.sequence=P``).

``torchrun --nproc_per_node=N -m cmbench run ... parallel.sequence=P`` starts ``N`` processes. Ranks
``g P .. g P + P - 1`` form group ``g``: one model split by Ulysses sequence parallelism
(:mod:`cmbench.parallel`), and one shard of the run (``N / P`` shards of whole contexts:
:func:`cmbench.spec.shard_from_env`).

A group's rank 0, its *writer*, runs the task loop exactly as one process does (the shard's lock,
resume, records, videos, ``summary.json``: :func:`cmbench.runs.runner.run_tasks`), through a
:class:`Leader` that tells the other ranks, its *followers*, which context to prepare and which task to
generate before each call; a follower (:func:`follow`) runs the same model calls on its heads and
writes nothing. When the writer stops (every task done, a refused run, a configuration error), it tells
the followers, which stop with it. The split DiT's collectives need every rank of the group in the
same model call: a failure only one rank meets inside a model call (out of device memory) holds the
others until torch.distributed's timeout.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.distributed as dist

from cmbench.data.task import Task
from cmbench.errors import CMBenchError, ConfigError
from cmbench.parallel import SequenceGroup
from cmbench.runs.evaluator import ModelEvaluator
from cmbench.spec import ParallelSpec


@dataclass(frozen=True)
class Launch:
    """This process among torchrun's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) and the group size ``P``."""

    rank: int
    world: int
    local_rank: int
    sequence: int

    @property
    def group_index(self) -> int:
        return self.rank // self.sequence

    @property
    def writer(self) -> bool:
        """Whether this rank writes its group's results (the group's rank 0)."""
        return self.rank % self.sequence == 0


def launch_of(parallel: ParallelSpec) -> Launch | None:
    """torchrun's ranks when the model is split (``None``: one process per model). The run spec has already
    checked that ``P`` divides ``WORLD_SIZE``.

    Raises
    ------
    ConfigError
        ``P > 1`` in a process torchrun did not start.
    """
    if parallel.sequence == 1:
        return None
    env = os.environ
    if "WORLD_SIZE" not in env:
        raise ConfigError(f"parallel.sequence={parallel.sequence} splits a model over torchrun's ranks: launch with "
                          f"torchrun --nproc_per_node={parallel.sequence} -m cmbench run ...")
    return Launch(rank=int(env["RANK"]), world=int(env["WORLD_SIZE"]), local_rank=int(env.get("LOCAL_RANK", "0")),
                  sequence=parallel.sequence)


def _on_gpu(backbone: Mapping[str, Any]) -> bool:
    return torch.device(str(backbone.get("device", "cpu"))).type == "cuda"


def pin_device(launch: Launch, backbone: Mapping[str, Any]) -> None:
    """On GPUs: make this rank's GPU (``LOCAL_RANK``) torch's current device, before the backbone loads."""
    if _on_gpu(backbone):
        torch.cuda.set_device(launch.local_rank)


def _leave() -> None:
    """Tear the process group down at exit, before the interpreter's own teardown: a rank that leaves gloo's
    threads to it can abort on its way out ("terminate called without an active exception", seen once
    under load on a rank that had finished first), failing a run whose records are all written."""
    if dist.is_initialized():
        dist.destroy_process_group()


def join(launch: Launch, parallel: ParallelSpec, backbone: Mapping[str, Any]) -> SequenceGroup:
    """Join torch.distributed (torchrun's ``env://``: gloo on the CPU; on GPUs NCCL for CUDA tensors and gloo
    for the CPU tensors of the cache's accounting) and return this rank's group of ``P`` ranks."""
    if not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:nccl" if _on_gpu(backbone) else "gloo")
        atexit.register(_leave)
    p = launch.sequence
    groups = [dist.new_group(list(range(g * p, (g + 1) * p))) for g in range(launch.world // p)]  # every rank makes every group
    return SequenceGroup(launch.rank % p, p, groups[launch.group_index], check_masks=parallel.check_masks)


class Leader:
    """The writer's evaluator: every call is announced to the group's followers, then run.

    Parameters
    ----------
    evaluator : ModelEvaluator
        Split over ``group`` (:meth:`ModelEvaluator.split`).
    group : SequenceGroup
        The writer is its rank 0.
    """

    def __init__(self, evaluator: ModelEvaluator, group: SequenceGroup) -> None:
        self.evaluator, self.group = evaluator, group

    def prepare(self, tasks: list[Task]) -> Any:
        self.group.broadcast(("prepare", [t.task_id for t in tasks]))
        return self.evaluator.prepare(tasks)

    def evaluate(self, task: Task, prepared: Any, seed: int) -> dict[str, Any]:
        self.group.broadcast(("generate", task.task_id, seed))
        return self.evaluator.evaluate(task, prepared, seed)


@contextmanager
def leading(evaluator: ModelEvaluator, group: SequenceGroup | None) -> Iterator[Any]:
    """The evaluator the writer's task loop calls (``evaluator`` itself on one process); on leaving, the
    followers are told to stop, with the writer's error when it stops on one."""
    if group is None:
        yield evaluator
        return
    error = None
    try:
        yield Leader(evaluator, group)
    except BaseException as err:
        error = f"{type(err).__name__}: {err}".splitlines()[0]
        raise
    finally:
        group.broadcast(("stop", error))


def follow(evaluator: ModelEvaluator, tasks: list[Task], group: SequenceGroup) -> int:
    """A follower: run the writer's model calls on this rank's heads until it stops.

    A call that fails here is left to the writer, which meets the same failure and records it.

    Parameters
    ----------
    evaluator : ModelEvaluator
        Split over ``group``.
    tasks : list of Task
        The run's selected tasks (the writer names them by id).

    Returns
    -------
    int
        Tasks generated.

    Raises
    ------
    CMBenchError
        The writer stopped on an error (its message).
    """
    by_id = {t.task_id: t for t in tasks}
    prepared, generated = None, 0
    while True:
        command = group.broadcast()
        if command[0] == "stop":
            if command[1] is not None:
                raise CMBenchError(f"rank {group.rank} of its model's group stopped with the group's writer: "
                                   f"{command[1]}")
            return generated
        try:
            if command[0] == "prepare":
                prepared = None  # stays None if this context fails: the writer then sends none of its tasks
                prepared = evaluator.prepare([by_id[i] for i in command[1]])
            elif prepared is not None:
                _, task_id, seed = command
                evaluator.generate(by_id[task_id], prepared, seed)
                generated += 1
        except Exception:  # noqa: BLE001 - the writer meets the same failure and records it
            continue
