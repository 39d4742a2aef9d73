"""Shared fixtures, and the one setting every number in the suite is computed under: one thread per process.

A float sum's order depends on the thread count (and on the CPU's kernels), so a test that compares two runs bit
for bit holds the count fixed rather than leaving it to the machine: every pytest-xdist worker computes with one
thread, and every process a test starts inherits OMP_NUM_THREADS=1. Bit-identical checks in the suite compare runs
made on this machine under that setting, in one process or its children, never a figure made elsewhere. One thread
per worker is also what keeps N workers on N cores from oversubscribing them.
"""

import os
from pathlib import Path

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


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> Path:
    """One finished 1-epoch `train -c digits-lenet` run (no progress bar), trained once for the whole suite — once for
    all pytest-xdist workers, under a file lock — for the checks that read a real run. Tests use a copy
    (`shutil.copytree`): commands act on the folder they are given, and config.yaml still records where the original
    was written, as a moved run's does."""
    from filelock import FileLock

    from torchboost.cli import main

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, not an older one's
    out = shared / "digits-run"
    with FileLock(str(shared / "digits-run.lock")):
        if not (shared / "digits-run.done").exists():
            assert main(["train", "-c", "digits-lenet", "--epochs", "1", "--set", "train.progress_bar=false",
                         "-o", str(out)]) == 0
            (shared / "digits-run.done").touch()
    return out



# The modules whose tests take the longest (tens of CPU-seconds each: every zoo network through the CLI, torchrun
# restarts, multi-node agents, the README's commands), run first: pytest-xdist gives each worker a contiguous share of
# the collection and an idle worker steals from the end of the other's queue, so what is left at the end is short
# tests rather than one worker on a 40-second test while the other core idles. Only the order changes; a module
# missing from the list just keeps its place.
HEAVY_FIRST = ("test_zoo_generator", "test_elastic", "test_readme", "test_multinode", "test_reliability",
               "test_run_says", "test_device_decode", "test_shards", "test_train_e2e", "test_lr_find")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(getattr(getattr(item, "module", None), "__name__", ""), len(HEAVY_FIRST)))
