"""dist.agree: ranks with different values all fail together, naming the keys; equal values pass."""

import pytest

from torchboost.distributed import init_distributed, launch
from torchboost.distributed.group import agree
from torchboost.errors import DistributedError


def _agree_worker(mismatch: bool, catch: bool) -> str:
    info = init_distributed(timeout_s=60)
    values = {"data.batch_size": 32, "model.name": "resnet50", "model.num_classes": 10, "optim.lr": 0.1}
    if mismatch and info.rank == 1:
        values.update({"data.batch_size": 64, "model.num_classes": 1000})
    try:
        agree(values)
    except DistributedError as e:
        if not catch:
            raise
        return str(e)
    return "agreed"


@pytest.mark.dist
def test_ranks_that_disagree_all_raise_with_the_key_names():
    results = launch(_agree_worker, 2, True, True, timeout_s=120)
    assert results[0] == results[1]  # every rank raised, with the same message
    assert results[0].startswith("ranks disagree on data.batch_size, model.num_classes (ranks [1] differ from rank 0)")
    assert launch(_agree_worker, 2, False, True, timeout_s=120) == ["agreed", "agreed"]


@pytest.mark.dist
def test_no_rank_goes_on_when_another_disagrees():
    with pytest.raises(DistributedError) as info:
        launch(_agree_worker, 2, True, False, timeout_s=120)
    for rank in (0, 1):  # both failed with the error itself (none exited 0, none was killed or aborted)
        assert f"rank {rank}: torchboost.errors.DistributedError: ranks disagree on data.batch_size" in str(info.value)


def test_single_process_checks_nothing(monkeypatch):
    """No process group: nothing to compare with, so no collective is ever called (it would hang)."""
    import torch.distributed as dist

    def no_collective(*args, **kwargs):
        raise AssertionError("a collective was called without a process group")

    monkeypatch.setattr(dist, "all_gather_object", no_collective)
    monkeypatch.setattr(dist, "all_reduce", no_collective)
    assert agree({"a": 1}) is None
