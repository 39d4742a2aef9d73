"""The undo is complete and never waits (issue: the no-host-wait step). An update dropped on the device restores
everything it wrote — the optimizer's own parameters, every state tensor (written in place or replaced), BatchNorm's
counters, the EMA and its count, param-group tensors — exactly as if it had never been applied; which optimizers
may be undone is declared, never assumed; and between checks an update makes no host read and no copy across
devices, counted at torch's dispatcher (every `.item()`, `bool()`, `.cpu()` and cross-device `.to()` passes there)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from torchboost.optim.muon import muon_optimizer
from torchboost.optim.protocol import TrainerProtocol, maskable_of
from torchboost.train.ema import ModelEMA
from torchboost.train.step import TrainStep
from test_device_skip import bn_net, huge, poisoned, same_state
from train_tiny import batches

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def undo_on_cpu(monkeypatch):  # the device path, checked on the CPU (by default it runs on accelerators)
    monkeypatch.setattr(TrainStep, "undo_on_cpu", True)


class HostTraffic(TorchDispatchMode):
    """Counts what would make the host wait for a device: reads of a tensor's value (`_local_scalar_dense`, behind
    item/bool/float/int/tolist) and copies whose source and destination devices differ."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is aten._local_scalar_dense.default:
            self.reads.append("read")
        elif func in (aten._to_copy.default, aten.copy_.default) and isinstance(out, torch.Tensor):
            src = args[1] if func is aten.copy_.default else args[0]
            if isinstance(src, torch.Tensor) and src.device != out.device:
                self.reads.append(f"copy {src.device}->{out.device}")
        return out


class ReplacingSGD(TrainerProtocol, torch.optim.Optimizer):
    """Plain SGD that keeps a step count it REPLACES every update (a new tensor object, as `t = t + 1` does) and a
    per-group tensor it replaces too: what an undo saving references only would miss."""

    maskable = True

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, dict(lr=lr))
        for g in self.param_groups:
            g["moved"] = torch.zeros(())

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            g["moved"] = g["moved"] + 1
            for p in g["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["count"] = state["count"] + 1 if "count" in state else torch.ones(())
                p.add_(p.grad, alpha=-g["lr"])


class ScaledLoss(nn.Module):
    """Cross-entropy times a learned temperature: a parameter the optimizer holds that is not the model's."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, logits, y):
        return nn.functional.cross_entropy(logits * self.scale, y)


def train(check_every: int, bad: set[int], updates: int = 10):
    net, loss = bn_net(), ScaledLoss()
    opt = ReplacingSGD([*net.parameters(), loss.scale], lr=0.05)
    ema = ModelEMA(net, decay=0.6, warmup="timm")
    step = TrainStep(net, loss, opt, ema=ema, check_every=check_every, nonfinite="skip", max_nonfinite_steps=3)
    data = batches(4)
    outs = [step([poisoned(data[k % 4], k, bad)], k) for k in range(updates)]
    return net, loss, opt, ema, step, outs


@pytest.mark.parametrize("bad", [{0}, {4}, {4, 5}], ids=["first", "one", "two"])
def test_replaced_state_outside_parameters_counters_and_ema_count_are_undone(bad):
    host, device = train(1, bad), train(5, bad)
    assert device[4].masks_on_device and not host[4].masks_on_device
    assert same_state(host[0].state_dict(), device[0].state_dict())  # weights, BN statistics and counters
    assert device[0][1].num_batches_tracked == 10 - len(bad)  # a dropped update's batch is not counted
    assert torch.equal(host[1].scale, device[1].scale)  # the loss's parameter
    assert same_state(host[2].state_dict()["state"], device[2].state_dict()["state"])  # the replaced counts
    assert all(int(s["count"]) == 10 - len(bad) for s in device[2].state.values())
    assert [float(g["moved"]) for g in device[2].param_groups] == [10 - len(bad)]
    assert host[3].updates == device[3].updates == 10 - len(bad)  # the EMA's count, hence its warm-up decay
    assert same_state(host[3].module.state_dict(), device[3].module.state_dict())


def test_only_declared_optimizers_are_undone_on_the_device():
    params = [nn.Parameter(torch.zeros(3))]
    meta = [nn.Parameter(torch.zeros(3, device="meta"))]  # a parameter off the CPU, without running a kernel
    assert maskable_of(torch.optim.SGD(params, lr=0.1)) and maskable_of(torch.optim.SGD(meta, lr=0.1))
    assert maskable_of(torch.optim.AdamW(params, lr=0.1))  # on the CPU its CPU step counter is beside its weights
    assert not maskable_of(torch.optim.AdamW(meta, lr=0.1))  # elsewhere: the counter on the CPU, a wait per undo
    assert maskable_of(torch.optim.AdamW(meta, lr=0.1, capturable=True))
    assert not maskable_of(torch.optim.RMSprop(params, lr=0.1))  # not declared: its state unchecked

    class MySGD(torch.optim.SGD):  # a subclass may keep state elsewhere
        pass

    assert not maskable_of(MySGD(params, lr=0.1))
    assert maskable_of(muon_optimizer(bn_net(), lr=0.02))
    net = bn_net()
    step = TrainStep(net, nn.CrossEntropyLoss(), torch.optim.RMSprop(net.parameters(), lr=0.01), check_every=5,
                     nonfinite="skip", max_nonfinite_steps=3)
    assert not step.masks_on_device  # decided on the host before applying, as with check_every=1


OPTIMIZERS = {  # as the registry builds them (fused where torch has a fused kernel)
    "sgd": lambda net: torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, fused=True),
    "adamw": lambda net: torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True),
    "muon": lambda net: muon_optimizer(net, lr=0.02, weight_decay=1e-3),
}


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["skip", "float16-scaling"])
def test_between_checks_an_update_reads_nothing_and_copies_nothing_across_devices(opt_name, mode):
    net = bn_net()
    opt = OPTIMIZERS[opt_name](net)
    scaling = mode == "float16-scaling"
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 116, growth_interval=4) if scaling else None
    step = TrainStep(net, huge if scaling else nn.CrossEntropyLoss(), opt, check_every=10, grad_scaler=scaler,
                     nonfinite="skip", max_nonfinite_steps=3, compute_accuracy=True)
    assert step.masks_on_device
    data = batches(4)
    for k in range(10):  # updates that create optimizer state are decided on the host (the first applied)
        step([data[k % 4]], k)
    traffic, reads_before = HostTraffic(), step.undo.host_reads
    skipped = []
    with traffic:
        for k in range(10, 50):
            skipped.append(step([poisoned(data[k % 4], k, set() if scaling else {25})], k).skipped)
    assert len(traffic.reads) <= 40 // 10, traffic.reads  # the deferred checks' reads, one per check
    assert step.undo.host_reads == reads_before
    assert any(bool(s) for s in skipped)  # updates were dropped, on the device
    for p, entry in opt.state.items():  # every state tensor beside its parameter
        assert all(v.device == p.device for v in entry.values() if isinstance(v, torch.Tensor))


def test_a_state_tensor_on_another_device_is_decided_on_the_host_and_counted():
    class StrayState(ReplacingSGD):
        @torch.no_grad()
        def step(self, closure=None):
            super().step(closure)
            for p in self.state:
                self.state[p]["stray"] = torch.zeros((), device="meta")  # never beside its parameter

    net = bn_net()
    step = TrainStep(net, nn.CrossEntropyLoss(), StrayState(net.parameters(), lr=0.05), check_every=5,
                     nonfinite="skip", max_nonfinite_steps=3)
    data = batches(4)
    for k in range(6):
        step([poisoned(data[k % 4], k, {4})], k)
    assert step.undo.host_reads >= 5  # said, never a silent wait
    assert net[1].num_batches_tracked == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts CUDA synchronisations (torch's sync debug mode)")
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["skip", "float16-scaling"])
def test_on_cuda_an_update_never_synchronises(opt_name, mode):
    import warnings

    net = bn_net().cuda()
    opt = OPTIMIZERS[opt_name](net)
    scaling = mode == "float16-scaling"
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 16, growth_interval=4) if scaling else None
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, device="cuda", check_every=10, grad_scaler=scaler,
                     autocast_dtype=torch.float16 if scaling else None, nonfinite="skip", max_nonfinite_steps=3,
                     compute_accuracy=True)
    data = [(x.cuda(), y.cuda()) for x, y in batches(4)]
    for k in range(10):
        step([data[k % 4]], k)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for k in range(10, 50):
                step([poisoned(data[k % 4], k, {25})], k)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert len(seen) <= 40 // 10, [str(w.message)[:80] for w in seen]  # the checks' reads only
