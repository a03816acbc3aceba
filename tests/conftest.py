"""Test-wide settings: never touch a model hub; one torch thread (see docs/speed.md)."""

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
    """In mutmut's copy of the repository (``mutants/``), run the tests not marked slow first: mutmut stops a
    mutant's tests at the first failure, so a mutant a unit test kills never waits for an end-to-end run."""
    if os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) == "mutants":
        items.sort(key=lambda item: item.get_closest_marker("slow") is not None)
