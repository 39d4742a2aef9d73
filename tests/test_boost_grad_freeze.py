"""grad_freeze: layer groups, schedule statistics against their formulas, truly frozen parameters,
and the backward work actually skipped (counted in FLOPs, not timed: the machine is shared)."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from torchboost.boost import GradFreeze, freeze_schedule, layer_groups
from torchboost.boost.options import GradFreezeOptions
from torchboost.models import create_model


pytestmark = pytest.mark.usefixtures("one_thread")


def _resnet18():
    return create_model("resnet18", num_classes=10, in_chans=1, small_input=True)


def test_layer_groups_resnet18():
    # expected, written out: the stem conv+BN, each conv with its BN, each shortcut conv with its BN, the fc
    expected = [["conv1.weight", "bn1.weight", "bn1.bias"]]
    for s in range(1, 5):
        for b in range(2):
            pre = f"layer{s}.{b}"
            expected += [[f"{pre}.conv{i}.weight", f"{pre}.bn{i}.weight", f"{pre}.bn{i}.bias"] for i in (1, 2)]
            if s > 1 and b == 0:
                ds = f"{pre}.downsample"
                expected.append([f"{ds}.0.weight", f"{ds}.1.weight", f"{ds}.1.bias"])
    expected.append(["fc.weight", "fc.bias"])
    assert [[n for n, _ in g] for g in layer_groups(_resnet18())] == expected


def test_layer_groups_mnist_cnn():
    groups = [[n for n, _ in g] for g in layer_groups(create_model("mnist_cnn", num_classes=10, in_chans=1))]
    assert groups == [["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"], ["fc.weight", "fc.bias"]]


@pytest.mark.parametrize("n, p, z", [(10, 0.7, 21), (4, 0.5, 3), (5, 0.2, 1)])
def test_freeze_type0_cycle(n, p, z):
    assert z == int(p * (n - 1) / (1 - p) + 0.5)
    sched = freeze_schedule(n, 0, p, 1000)
    cycle = [0] * z + list(range(1, n))
    assert list(sched[: len(cycle)]) == cycle
    assert all(sched[i] == sched[i % len(cycle)] for i in range(1000))  # repeats with the cycle's period


def test_freeze_type1_statistics():
    n, p, steps = 10, 0.7, 30000
    sched = freeze_schedule(n, 1, p, steps, seed=3)
    assert sched[0] == 0
    # share of full-network steps = freeze_p, and the greedy rule keeps every prefix on target
    assert abs((sched == 0).mean() - p) < 1e-3
    frozen_share = np.cumsum(sched > 0) / np.arange(1, steps + 1)
    assert (frozen_share[10:] <= (1 - p) + 1.0 / np.arange(11, steps + 1)).all()
    # P(k) = (n - k) / (n (n - 1) / 2) for k = 1..n-1, within 4 binomial standard deviations
    draws = sched[sched > 0]
    for k in range(1, n):
        pk = (n - k) / (n * (n - 1) / 2)
        count = (draws == k).sum()
        assert abs(count - pk * len(draws)) < 4 * np.sqrt(len(draws) * pk * (1 - pk)), k


def test_freeze_type1_seeded():
    a, b = freeze_schedule(10, 1, 0.7, 500, seed=1), freeze_schedule(10, 1, 0.7, 500, seed=1)
    assert np.array_equal(a, b) and not np.array_equal(a, freeze_schedule(10, 1, 0.7, 500, seed=2))


def test_training_sets_freeze_group_prefixes():
    model = _resnet18()
    hook = GradFreeze(model, GradFreezeOptions(param_groups=10))
    groups = layer_groups(model)
    stride = len(groups) // 10  # 21 groups -> stride 2
    assert stride == 2 and hook.frozen_names(0) == []
    assert hook.frozen_names(3) == [n for g in groups[:6] for n, _ in g]


def test_frozen_parameters_do_not_move_even_with_momentum_and_decay():
    torch.manual_seed(0)
    model = create_model("mnist_cnn", num_classes=10, in_chans=1, image_size=8)
    hook = GradFreeze(model, GradFreezeOptions(param_groups=2))
    hook.schedule = np.array([0, 1])  # a full step (fills momentum buffers), then set 1 (convs frozen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    for step in range(2):
        hook.before_update(step)
        nn.functional.cross_entropy(model(x), y).backward()
        if step == 1:
            assert model.conv1.weight.grad is None and model.conv2.bias.grad is None
            assert model.fc.weight.grad is not None
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        hook.after_optimizer(model)
        opt.zero_grad(set_to_none=False)  # zeros, not None: the hook must still keep frozen weights still
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == n.startswith("conv"), n
        assert p.requires_grad  # restored after the update


def _backward_flops(model, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    return counter.get_total_flops()


def test_frozen_prefix_skips_its_backward_work():
    torch.manual_seed(0)
    model = _resnet18()
    hook = GradFreeze(model, GradFreezeOptions(param_groups=10))
    hook.schedule = np.array([0, 4])
    x, y = torch.randn(2, 1, 8, 8), torch.randint(0, 10, (2,))
    hook.before_update(0)
    full = _backward_flops(model, x, y)
    model.zero_grad(set_to_none=True)
    hook.before_update(1)
    part = _backward_flops(model, x, y)
    frozen = set(hook.frozen_names(4))
    assert all((p.grad is None) == (n in frozen) for n, p in model.named_parameters())
    # independent count: each frozen conv saves its weight gradient and its input gradient (2 x forward
    # FLOPs each), except the stem, whose input gradient is never computed
    frozen_convs = [m for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and f"{n}.weight" in frozen]
    outs = {}
    handles = [m.register_forward_hook(lambda m, i, o: outs.__setitem__(m, o.numel())) for m in frozen_convs]
    model(x)
    for h in handles:
        h.remove()
    fwd = [2 * m.in_channels * m.kernel_size[0] * m.kernel_size[1] * outs[m] for m in frozen_convs]
    saved = 2 * sum(fwd) - fwd[0]
    assert len(frozen_convs) == 8 and full - part >= saved
    assert part < 0.6 * full


def test_o1_hooks_through_trainstep():
    from torchboost.boost import build_boost, resolve_boost
    from torchboost.train.step import TrainStep

    torch.manual_seed(0)
    plan = resolve_boost("O1", {"grad_freeze": {"param_groups": 2}})
    model, hooks = build_boost(plan, create_model("mnist_cnn", num_classes=10, in_chans=1, image_size=8))
    hooks[0].schedule = np.array([0, 1, 1])  # one full update, then two with the convs frozen
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    step = TrainStep(model, nn.functional.cross_entropy, opt, hooks=hooks)
    batch = [(torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))]
    step(batch, 0)
    convs = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("conv")}
    fc = model.fc.weight.detach().clone()
    step(batch, 1)
    step(batch, 2)
    assert all(torch.equal(p, convs[n]) for n, p in model.named_parameters() if n.startswith("conv"))
    assert not torch.equal(model.fc.weight, fc)
    assert all(p.requires_grad for p in model.parameters())
