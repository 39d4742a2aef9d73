"""No host wait per update: with the deferred non-finite check the host reads a device value
O(updates / check_every) times, not once per update. Counted on the CPU by wrapping every Tensor method that
copies a value to the host (the reads that would wait for a GPU's queue)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchboost.errors import TrainingError
from torchboost.train.callbacks import LossMonitor
from torchboost.train.model import Model
from torchboost.train.step import TrainStep
from train_tiny import batches, tiny_model, tiny_net

READS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist")


@pytest.fixture
def host_reads(monkeypatch):
    counted = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            counted.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return counted


def _step(check_every: int, loss_fn=None) -> TrainStep:
    net = tiny_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)  # no host reads of its own
    return TrainStep(net, loss_fn or nn.CrossEntropyLoss(), opt, compute_accuracy=True, check_every=check_every)


@pytest.mark.parametrize("check_every, most", [(1, None), (10, 4), (40, 1)])
def test_train_step_reads_the_host_once_per_check_not_per_update(host_reads, check_every, most):
    data = batches(8)
    step = _step(check_every)
    for k in range(40):
        step([data[k % len(data)]], k)
    if most is None:  # the counter sees the reads: checking every update costs one per update
        assert len(host_reads) >= 40
    else:
        assert len(host_reads) <= most, host_reads


def test_a_deferred_check_names_the_update_whose_loss_was_not_finite():
    calls = []

    def loss_fn(logits, y):
        calls.append(1)
        loss = nn.functional.cross_entropy(logits, y)
        return loss * float("nan") if len(calls) == 8 else loss  # update index 7 = the 8th update

    step = _step(5, loss_fn)
    data = batches(4)
    for k in range(9):
        step([data[k % len(data)]], k)  # update 5 checks (finite so far); 10 would check next
    with pytest.raises(TrainingError, match=r"non-finite at update 8 \(checked at update 10, every 5 updates\)"):
        step([data[1]], 9)


def test_model_train_reads_the_host_per_log_line_not_per_update(host_reads):
    data = batches(40)
    quiet, per_update = tiny_model(check_every=10), tiny_model(check_every=1)
    host_reads.clear()
    state = quiet.train(1, data, callbacks=[LossMonitor(10)], log_fn=lambda line: None)
    deferred = len(host_reads)
    host_reads.clear()
    per_update.train(1, data, callbacks=[LossMonitor(10)], log_fn=lambda line: None)
    assert state.global_step == 40 and len(host_reads) >= 40 > deferred
    assert deferred <= 3 * 40 // 10 + 8, deferred  # each log line and check, and the epoch's summary


def test_model_train_stops_at_the_epoch_end_check_naming_the_update():
    calls = []

    def loss_fn(logits, y):
        calls.append(1)
        loss = nn.functional.cross_entropy(logits, y)
        return loss * float("inf") if len(calls) == 3 else loss

    net = tiny_net()
    model = Model(net, loss_fn, torch.optim.SGD(net.parameters(), lr=0.05), device="cpu", check_every=100)
    with pytest.raises(TrainingError, match=r"epoch 1: the loss became non-finite at update 3 \(checked at update 6"):
        model.train(1, batches(6), log_fn=lambda line: None)
