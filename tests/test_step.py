"""TrainStep features against independent references."""

import copy

import pytest
import torch
from torch import nn

from torchboost.train.ema import ModelEMA
from torchboost.train.hooks import StepHook
from torchboost.train.loss_scale import DynamicLossScaleManager, FixedLossScaleManager
from torchboost.train.step import TrainStep


def tiny_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def data(n=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 6, 6, generator=g), torch.randint(0, 5, (n,), generator=g)


def test_accumulation_equals_one_big_batch():
    x, y = data(16)
    a, b = tiny_net(), tiny_net()
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    step_a = TrainStep(a, nn.CrossEntropyLoss(), opt_a)
    step_b = TrainStep(b, nn.CrossEntropyLoss(), opt_b)
    for s in range(3):
        out_a = step_a([(x[i * 4:(i + 1) * 4], y[i * 4:(i + 1) * 4]) for i in range(4)], s)  # 4 micro-batches
        out_b = step_b([(x, y)], s)
        assert out_a.samples == out_b.samples == 16
        assert torch.allclose(out_a.loss, out_b.loss, atol=1e-6)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_short_last_window_divides_by_its_length():
    x, y = data(8)
    a, b = tiny_net(), tiny_net()
    step_a = TrainStep(a, nn.CrossEntropyLoss(), torch.optim.SGD(a.parameters(), lr=0.5))
    step_b = TrainStep(b, nn.CrossEntropyLoss(), torch.optim.SGD(b.parameters(), lr=0.5))
    step_a([(x[:4], y[:4]), (x[4:], y[4:])], 0)  # a window of 2 (e.g. the last one of an epoch with k=3)
    step_b([(x, y)], 0)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_clipping_matches_clip_grad_norm_on_unscaled_grads():
    x, y = data(8)
    a, b = tiny_net(), tiny_net()
    opt_a = torch.optim.SGD(a.parameters(), lr=1.0)
    step = TrainStep(a, nn.CrossEntropyLoss(), opt_a, clip_global_norm=0.05,
                     loss_scale=FixedLossScaleManager(1024.0, drop_overflow_update=True))
    step([(x, y)], 0)
    # Reference: plain fp32 backward, torch's clip_grad_norm_, plain SGD.
    loss = nn.CrossEntropyLoss()(b(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.05)
    assert norm > 0.05  # clipping really happened
    with torch.no_grad():
        for p in b.parameters():
            p -= 1.0 * p.grad
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)
    assert step.last_grad_norm == pytest.approx(norm.item(), rel=1e-5)


def test_value_clipping():
    x, y = data(8)
    a, b = tiny_net(), tiny_net()
    TrainStep(a, nn.CrossEntropyLoss(), torch.optim.SGD(a.parameters(), lr=1.0), clip_value=1e-3)([(x, y)], 0)
    nn.CrossEntropyLoss()(b(x), y).backward()
    with torch.no_grad():
        for p in b.parameters():
            p -= p.grad.clamp(-1e-3, 1e-3)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-7)


def test_ema_matches_hand_sequence():
    x, y = data(8)
    net = tiny_net()
    ema = ModelEMA(net, decay=0.9, warmup="timm", warmup_gamma=1.0, warmup_power=1.0)
    step = TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), ema=ema)
    shadow = [p.detach().clone().double() for p in net.parameters()]
    for t in range(5):
        step([(x, y)], t)
        d = min(0.9, 1 - (1 + t / 1.0) ** -1.0)  # timm warmup with gamma 1, power 1: 0, 0.5, 0.667, ...
        shadow = [d * e + (1 - d) * p.detach().double() for e, p in zip(shadow, net.parameters())]
    for e, p in zip(shadow, ema.module.parameters()):
        assert torch.allclose(e.float(), p, atol=1e-6)
    assert ema.updates == 5


def test_dynamic_loss_scale_skips_and_halves_on_inf():
    x, y = data(8)
    net = tiny_net()
    before = copy.deepcopy(net.state_dict())
    scaler = DynamicLossScaleManager(init_loss_scale=2.0**10, scale_factor=2, scale_window=1000)
    step = TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), loss_scale=scaler)
    x_bad = x.clone()
    x_bad[0, 0, 0, 0] = float("inf")
    out = step([(x_bad, y)], 0)
    assert out.skipped and scaler.get_loss_scale() == 2.0**9
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])
    out = step([(x, y)], 1)
    assert not out.skipped and scaler.get_loss_scale() == 2.0**9
    assert not torch.equal(net.state_dict()["3.weight"], before["3.weight"])


def test_fixed_loss_scale_keeps_scale_and_unscales():
    x, y = data(8)
    a, b = tiny_net(), tiny_net()
    scaler = FixedLossScaleManager(128.0)
    TrainStep(a, nn.CrossEntropyLoss(), torch.optim.SGD(a.parameters(), lr=0.1), loss_scale=scaler)([(x, y)], 0)
    TrainStep(b, nn.CrossEntropyLoss(), torch.optim.SGD(b.parameters(), lr=0.1))([(x, y)], 0)
    assert scaler.get_loss_scale() == 128.0
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_bf16_autocast_step_on_cpu_learns():
    torch.manual_seed(0)
    x, y = data(64)
    net = tiny_net()
    step = TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9),
                     autocast_dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert step.forward_loss(x, y)[1].dtype == torch.bfloat16
    losses = [step([(x, y)], s).loss.item() for s in range(30)]
    assert all(p.dtype == torch.float32 for p in net.parameters())  # master weights stay fp32
    assert losses[-1] < 0.5 * losses[0]


def test_hooks_order_and_lr_schedule():
    calls = []

    class Recorder(StepHook):
        def before_update(self, step): calls.append(("before_update", step))
        def on_gradients(self, model): calls.append(("on_gradients", next(model.parameters()).grad is not None))
        def before_optimizer(self, model): calls.append(("before_optimizer",))
        def after_optimizer(self, model): calls.append(("after_optimizer",))

    x, y = data(4)
    net = tiny_net()
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, hooks=[Recorder()], lr_schedule=[0.3, 0.2])
    step([(x, y)], 1)
    assert opt.param_groups[0]["lr"] == 0.2
    assert calls == [("before_update", 1), ("on_gradients", True), ("before_optimizer",), ("after_optimizer",)]
    assert all(p.grad is None for p in net.parameters())  # zero_grad(set_to_none=True)


def test_closure_optimizer_gets_loss_of_current_batch():
    x, y = data(4)
    net = tiny_net()

    class ClosureSGD(torch.optim.SGD):
        needs_closure = True
        seen = None

        def step(self, closure=None):
            self.seen = closure()
            return super().step()

    opt = ClosureSGD(net.parameters(), lr=0.0)
    out = TrainStep(net, nn.CrossEntropyLoss(), opt)([(x, y)], 0)
    assert torch.allclose(opt.seen, out.loss, atol=1e-6)
