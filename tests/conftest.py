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


def pytest_collection_modifyitems(config, items):
    """In mutmut's copy of the repository (``mutants/``), run a mutant's tests fastest first, by the durations
    mutmut recorded (``mutmut-stats.json``), and those marked slow last: mutmut stops at the first failure, so
    a mutant a unit test kills never waits for an end-to-end run."""
    copy = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.basename(copy) != "mutants":
        return
    stats = os.path.join(copy, "mutmut-stats.json")
    durations = {}
    if os.path.isfile(stats):
        with open(stats) as f:
            durations = json.load(f).get("duration_by_test", {})
    items.sort(key=lambda item: (item.get_closest_marker("slow") is not None, durations.get(item.nodeid, 0.0)))
