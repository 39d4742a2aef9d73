"""Shared fixtures, and the one setting every number in the suite is computed under: one thread per process.

A float sum's order depends on the thread count (and on the CPU's kernels), so a test that compares two runs bit
for bit holds the count fixed rather than leaving it to the machine: every pytest-xdist worker computes with one
thread, and every process a test starts inherits OMP_NUM_THREADS=1. Bit-identical checks in the suite compare runs
made on this machine under that setting, in one process or its children, never a figure made elsewhere. One thread
per worker is also what keeps N workers on N cores from oversubscribing them.
"""

import os

os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"  # before torch starts its thread pool

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

torch.set_num_threads(1)  # torch may be imported before this file (a plugin): the env var alone is then too late

# Hypothesis: a fixed seed and example count in CI; `pytest --hypothesis-profile=soak` for a long hunt.
settings.register_profile("ci", max_examples=80, deadline=None, derandomize=True,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("soak", max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
# the generators that run the real CLI on generated trees take ~0.5 s an example: an hour's hunt
settings.register_profile("soak-cli", max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def one_thread():
    """Every test starts at one thread, and one that changes it (`--threads 2`) leaves the next at one."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)
