"""A deterministic stand-in for the model + scorer, to test the task loop on its own.

Run as a script it executes a whole run (used by the kill-and-resume test):
    python fake_evaluator.py MANIFEST_ROOT RUN_DIR SLEEP_SECONDS [SHARD_COUNT SHARD_INDEX]
With ``FAKE_EVALUATOR_HOLD=<file>`` in the environment, every task after the first waits while that file
exists (a test holds the run mid-way however slowly the machine starts processes).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from cmbench.data import load_manifest
from cmbench.runs.runner import run_tasks


class FakeEvaluator:
    """Score = a function of the task seed; fails on tasks whose id contains ``fail_on``."""

    def __init__(self, sleep: float = 0.0, fail_on: str | None = None, fail_prepare_on: str | None = None,
                 hold: Path | None = None):
        self.sleep, self.fail_on, self.fail_prepare_on, self.hold = sleep, fail_on, fail_prepare_on, hold
        self.prepared: list[str] = []
        self.evaluated = 0

    def prepare(self, tasks):
        context = tasks[0].context_id
        if self.fail_prepare_on and self.fail_prepare_on in context:
            raise RuntimeError(f"cannot prefill {context}")
        self.prepared.append(context)
        return {"context": context}

    def evaluate(self, task, prepared, seed):
        time.sleep(self.sleep)
        while self.hold is not None and self.evaluated and self.hold.exists():
            time.sleep(0.01)
        self.evaluated += 1
        if self.fail_on and self.fail_on in task.task_id:
            raise ValueError(f"boom on {task.task_id}")
        rng = np.random.default_rng(seed)
        return {"score": float(rng.random()), "pr": 0.5, "context_id": prepared["context"]}


def main(argv):
    root, run_dir, sleep = Path(argv[0]), Path(argv[1]), float(argv[2])
    shard = (int(argv[3]), int(argv[4])) if len(argv) > 3 else (1, 0)
    tasks = load_manifest(root, check_videos=False)
    hold = os.environ.get("FAKE_EVALUATOR_HOLD")
    run_tasks(tasks, FakeEvaluator(sleep, hold=Path(hold) if hold else None), run_dir, global_seed=7, base_record={"label": "fake"}, shard=shard,
              show_progress=False)


if __name__ == "__main__":
    main(sys.argv[1:])
