"""Shared fixtures."""

import pytest
import torch
from hypothesis import HealthCheck, settings

# Hypothesis: a fixed seed and example count in CI; `pytest --hypothesis-profile=soak` for a long hunt.
settings.register_profile("ci", max_examples=80, deadline=None, derandomize=True,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("soak", max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
# the generators that run the real CLI on generated trees take ~0.5 s an example: an hour's hunt
settings.register_profile("soak-cli", max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile("ci")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: on the shared 2-core machine this is several times faster for tiny models."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
