"""Test-wide settings: never touch a model hub; one torch thread (see docs/speed.md)."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # the session default, so module-scoped fixtures run on one thread too


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every test on one torch thread, restored afterwards (a test or an in-process command may set
    more): the tensors are tiny, and on a loaded 2-core machine every parallel region (e.g. CPU SDPA)
    otherwise waits ~10 ms for its second thread to be scheduled."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The files that take longest, longest first (a file's wall time with -n 2 on a loaded 2-core machine, from
# --durations; refresh the order when a file's cost changes a lot). Under pytest-xdist (`-n`), pyproject's
# `--dist loadfile --no-loadscope-reorder` hands whole files to the workers in collection order: these go out
# first so that no long file starts last while the other workers idle. Unlisted files follow in their usual order.
LONGEST_FIRST = (
    "test_writing_a_method_doc.py",
    "test_run_command.py",
    "test_calibrate.py",
    "test_method_check.py",
    "test_tiny_weights.py",
    "test_parallel_run.py",
    "test_report_html.py",
    "test_memory_plan.py",
    "test_scoring_deep.py",
    "test_parallel.py",
    "test_reproduce_paper.py",
    "test_curves.py",
    "test_pr_at_scale.py",
    "test_miniworld_suite.py",
    "test_cli.py",
)


def pytest_collection_modifyitems(config, items):
    """In mutmut's copy of the repository (``mutants/``), run a mutant's tests fastest first, by the durations
    mutmut recorded (``mutmut-stats.json``), and those marked slow last: mutmut stops at the first failure, so
    a mutant a unit test kills never waits for an end-to-end run. In a pytest-xdist worker, the files of
    :data:`LONGEST_FIRST` first (every worker sorts alike, as xdist requires; a file's own order is kept)."""
    copy = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.basename(copy) != "mutants":
        if hasattr(config, "workerinput"):
            rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
            items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
        return
    stats = os.path.join(copy, "mutmut-stats.json")
    durations = {}
    if os.path.isfile(stats):
        with open(stats) as f:
            durations = json.load(f).get("duration_by_test", {})
    items.sort(key=lambda item: (item.get_closest_marker("slow") is not None, durations.get(item.nodeid, 0.0)))
