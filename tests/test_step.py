"""TrainStep features against independent references: a float64 copy of the network, gradients of the
whole batch's mean loss, and the optimizer/clipping/EMA updates written out as formulas."""

import copy

import pytest
import torch
from torch import nn

from torchboost.optim.protocol import TrainerProtocol
from torchboost.errors import ConfigError, TrainingError
from torchboost.train.ema import ModelEMA
from torchboost.train.hooks import StepHook
from torchboost.compat.mindspore import DynamicLossScaleManager, FixedLossScaleManager
from torchboost.train.step import TrainStep


def tiny_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def data(n=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 6, 6, generator=g), torch.randint(0, 5, (n,), generator=g)


class Reference:
    """float64 copy of `net`: loss and gradients of the mean cross-entropy over a whole batch."""

    def __init__(self, net):
        self.net = copy.deepcopy(net).double()
        self.params = list(self.net.parameters())

    def grads(self, x, y):
        loss = nn.functional.cross_entropy(self.net(x.double()), y)
        return loss.item(), torch.autograd.grad(loss, self.params)

    def sub_(self, deltas):
        with torch.no_grad():
            for p, d in zip(self.params, deltas):
                p -= d


def assert_weights(net, ref, atol):
    for p, r in zip(net.parameters(), ref.params):
        torch.testing.assert_close(p.detach().double(), r.detach(), rtol=0, atol=atol)


def test_accumulation_equals_one_big_batch_sgd_momentum_formula():
    x, y = data(16)
    net = tiny_net()
    ref = Reference(net)
    lr, m = 0.1, 0.9
    step = TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=lr, momentum=m))
    bufs = None
    for s in range(3):
        out = step([(x[i * 4:(i + 1) * 4], y[i * 4:(i + 1) * 4]) for i in range(4)], s)  # 4 micro-batches
        loss, g = ref.grads(x, y)
        bufs = list(g) if bufs is None else [m * b + gi for b, gi in zip(bufs, g)]  # torch SGD: b1 = g1
        ref.sub_([lr * b for b in bufs])
        assert out.samples == 16
        assert out.loss.item() == pytest.approx(loss, abs=1e-6)
    assert_weights(net, ref, atol=1e-5)


def test_short_last_window_divides_by_its_length():
    x, y = data(8)
    net = tiny_net()
    ref = Reference(net)
    TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.5))(
        [(x[:4], y[:4]), (x[4:], y[4:])], 0)  # a window of 2 (e.g. the last one of an epoch with k=3)
    _, g = ref.grads(x, y)  # the mean over the 8 samples, not twice that
    ref.sub_([0.5 * gi for gi in g])
    assert_weights(net, ref, atol=1e-6)


def test_clipping_matches_the_global_norm_formula_on_unscaled_grads():
    x, y = data(8)
    net = tiny_net()
    ref = Reference(net)
    step = TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=1.0), clip_global_norm=0.05,
                     grad_scaler=FixedLossScaleManager(1024.0, drop_overflow_update=True))
    step([(x, y)], 0)
    _, g = ref.grads(x, y)
    norm = torch.sqrt(sum((gi ** 2).sum() for gi in g))
    assert norm > 0.05  # clipping really happens
    ref.sub_([gi * 0.05 / (norm + 1e-6) for gi in g])  # torch's coefficient: max_norm / (norm + 1e-6)
    assert_weights(net, ref, atol=1e-6)
    assert step.last_grad_norm.item() == pytest.approx(norm.item(), rel=1e-5)


def test_value_clipping():
    x, y = data(8)
    net = tiny_net()
    ref = Reference(net)
    TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=1.0), clip_value=1e-3)([(x, y)], 0)
    _, g = ref.grads(x, y)
    ref.sub_([gi.clamp(-1e-3, 1e-3) for gi in g])
    assert_weights(net, ref, atol=1e-7)


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


class NaNGradLoss(nn.Module):
    """Cross-entropy whose value stays finite but whose gradient is NaN while `bad` (0·d√x/dx at 0):
    a gradient overflow without a non-finite loss, which is the loss scaler's business."""

    bad = True

    def forward(self, logits, y):
        loss = nn.functional.cross_entropy(logits, y)
        if self.bad:
            loss = loss + 0 * torch.sqrt(logits - logits.detach()).sum()
        return loss


def test_dynamic_loss_scale_skips_and_halves_on_gradient_overflow():
    x, y = data(8)
    net = tiny_net()
    before = copy.deepcopy(net.state_dict())
    scaler = DynamicLossScaleManager(init_loss_scale=2.0**10, scale_factor=2, scale_window=1000)
    loss_fn = NaNGradLoss()
    step = TrainStep(net, loss_fn, torch.optim.SGD(net.parameters(), lr=0.1), grad_scaler=scaler)
    out = step([(x, y)], 0)
    assert torch.isfinite(out.loss) and out.skipped and not out.nonfinite
    assert scaler.get_loss_scale() == 2.0**9
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])
    loss_fn.bad = False
    out = step([(x, y)], 1)
    assert not out.skipped and scaler.get_loss_scale() == 2.0**9
    assert not torch.equal(net.state_dict()["3.weight"], before["3.weight"])


def test_fixed_loss_scale_keeps_scale_and_unscales():
    x, y = data(8)
    net = tiny_net()
    ref = Reference(net)
    scaler = FixedLossScaleManager(128.0)
    TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), grad_scaler=scaler)([(x, y)], 0)
    _, g = ref.grads(x, y)
    ref.sub_([0.1 * gi for gi in g])  # the update of the unscaled gradient
    assert scaler.get_loss_scale() == 128.0
    assert_weights(net, ref, atol=1e-6)


def test_bf16_autocast_step_on_cpu_is_close_to_the_fp64_update():
    x, y = data(64)
    net = tiny_net()
    ref = Reference(net)
    start = [p.detach().double().clone() for p in net.parameters()]
    step = TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.2),
                     autocast_dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert step.forward_loss(x, y)[1].dtype == torch.bfloat16
    step([(x, y)], 0)
    _, g = ref.grads(x, y)
    assert all(p.dtype == torch.float32 for p in net.parameters())  # master weights stay fp32
    got = torch.cat([(s - p.detach().double()).flatten() for s, p in zip(start, net.parameters())])
    want = torch.cat([0.2 * gi.flatten() for gi in g])
    assert (got - want).norm() / want.norm() < 0.05  # bf16 has 8 significant bits
    assert not torch.equal(got, want)  # and the forward really ran in low precision


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
    want, _ = Reference(net).grads(x, y)

    class ClosureSGD(TrainerProtocol, torch.optim.SGD):  # declares its need (torchboost.optim.protocol)
        needs_closure = True
        seen = None

        def step(self, closure=None):
            self.seen = closure()
            return super().step()

    opt = ClosureSGD(net.parameters(), lr=0.0)
    TrainStep(net, nn.CrossEntropyLoss(), opt)([(x, y)], 0)
    assert opt.seen.item() == pytest.approx(want, abs=1e-6)


def _poisoned(x):
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    return bad


def test_nonfinite_loss_stops_before_touching_weights_or_optimizer():
    x, y = data(8)
    net = tiny_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    step = TrainStep(net, nn.CrossEntropyLoss(), opt)
    step([(x, y)], 0)
    weights, opt_state = copy.deepcopy(net.state_dict()), copy.deepcopy(opt.state_dict())
    with pytest.raises(TrainingError, match="loss became nan at update 2"):
        step([(_poisoned(x), y)], 1)
    assert all(torch.equal(v, weights[k]) for k, v in net.state_dict().items())
    bufs = [s["momentum_buffer"] for s in opt.state_dict()["state"].values()]
    assert all(torch.equal(b, o["momentum_buffer"]) for b, o in zip(bufs, opt_state["state"].values()))


def test_nonfinite_skip_leaves_state_unchanged_and_stops_after_the_allowed_streak():
    x, y = data(8)
    net = tiny_net()
    ema = ModelEMA(net, decay=0.5, warmup=None)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, ema=ema, nonfinite="skip", max_nonfinite_steps=2)
    step([(x, y)], 0)
    weights, opt_state = copy.deepcopy(net.state_dict()), copy.deepcopy(opt.state_dict())
    for s in (1, 2):  # two skipped in a row are allowed
        out = step([(_poisoned(x), y)], s)
        assert out.skipped and out.nonfinite and step.nonfinite_streak == s
    assert all(torch.equal(v, weights[k]) for k, v in net.state_dict().items())
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], opt_state["state"][0]["momentum_buffer"])
    assert ema.updates == 1
    assert not step([(x, y)], 3).skipped and step.nonfinite_streak == 0  # a finite update resets the streak
    step([(_poisoned(x), y)], 4)
    step([(_poisoned(x), y)], 5)
    with pytest.raises(TrainingError, match="update 7: 3 non-finite updates in a row"):
        step([(_poisoned(x), y)], 6)


def test_bad_options_are_config_errors():
    net = tiny_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="'skip' or 'stop'|'stop' or 'skip'"):
        TrainStep(net, nn.CrossEntropyLoss(), opt, nonfinite="ignore")
    with pytest.raises(ConfigError, match="would never skip"):
        TrainStep(net, nn.CrossEntropyLoss(), opt, nonfinite="skip")
    step = TrainStep(net, nn.CrossEntropyLoss(), opt)
    with pytest.raises(ConfigError, match="input_norm"):
        step([(torch.zeros(2, 1, 6, 6, dtype=torch.uint8), torch.zeros(2, dtype=torch.long))], 0)


def test_step_options_are_stated_once_and_checked_by_name():
    """StepOptions is the one list of the update's options: TrainStep and Model take it (or its keywords)
    without restating its fields, and a misspelt option is a one-line error with the closest name."""
    import dataclasses
    import inspect

    from torchboost.train.model import Model
    from torchboost.train.step import StepOptions

    fields = {f.name for f in dataclasses.fields(StepOptions)}
    for cls in (TrainStep, Model):
        assert not fields & set(inspect.signature(cls.__init__).parameters), cls
    net = tiny_net()
    with pytest.raises(ConfigError, match="clip_global_norm"):
        TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), clip_global_nrom=1.0)
    base = StepOptions(clip_value=0.5)
    step = TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), base, clip_global_norm=2.0)
    assert (step.clip_value, step.clip_global_norm) == (0.5, 2.0) and base.clip_global_norm is None
