"""The trainer and its optimizers talk through one declared protocol (torchboost.optim.protocol): no attribute
probing, no private torch API, and hooks users register on torch's Optimizer still fire."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from torchboost.boost.dim_reduce import DimReduce
from torchboost.models import create_model
from torchboost.optim.protocol import TrainerProtocol, protocol_of
from torchboost.optim.registry import OPTIMIZERS, OptimizerArgs, build_optimizer
from torchboost.train.step import TrainStep

PACKAGE = Path(__file__).resolve().parents[1] / "torchboost"


def _net() -> nn.Module:
    torch.manual_seed(0)
    return create_model("mnist_cnn", num_classes=10, in_chans=1)


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_registry_entry_speaks_the_protocol(name):
    """Each entry's optimizer answers the trainer's questions: a closure or not, and the loss scale reaches
    whatever uses it (THOR's preconditioner); a plain torch optimizer gets the defaults."""
    net = _net()
    opt = build_optimizer(name, net, OptimizerArgs(lr=0.01))
    scale = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, grad_scaler=scale)
    assert step.protocol.needs_closure is False
    if name.startswith("thor"):
        assert opt.preconditioner.grad_scaler is scale
    else:
        assert protocol_of(opt) is not opt or isinstance(opt, TrainerProtocol)
    out = step([_batch()], 0)
    assert torch.isfinite(out.loss)


def test_a_plain_torch_optimizer_gets_the_defaults_and_dim_reduce_its_closure():
    plain = torch.optim.SGD(_net().parameters(), lr=0.1)
    assert protocol_of(plain).needs_closure is False and not isinstance(plain, TrainerProtocol)
    net = _net()
    params = [p for p in net.parameters()]
    n = sum(p.numel() for p in params)
    dim = DimReduce(params, torch.linalg.qr(torch.randn(n, 2))[0].T.contiguous())
    assert protocol_of(dim).needs_closure is True


def test_the_group_lr_scale_is_read_never_written():
    net = _net()
    groups = [{"params": list(net.fc.parameters()), "lr_scale": 10.0},
              {"params": [p for n, p in net.named_parameters() if not n.startswith("fc.")]}]
    opt = torch.optim.SGD(groups, lr=0.1)
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, lr_schedule=torch.tensor([0.5, 0.25]).numpy())
    assert "lr_scale" not in opt.param_groups[1]  # the trainer adds nothing to a user's groups
    step.set_lr(1)
    assert [g["lr"] for g in opt.param_groups] == [2.5, 0.25]


def test_hooks_registered_on_the_thor_wrapper_fire_and_schedulers_reach_the_inner_groups():
    net = _net()
    opt = build_optimizer("thor_muon", net, OptimizerArgs(lr=0.02))
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = _batch()
    nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
    sched.step()
    assert calls == ["pre", "post"]
    assert opt.param_groups is opt.optimizer.param_groups
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    restored = build_optimizer("thor_muon", _net(), OptimizerArgs(lr=0.02))
    restored.load_state_dict(opt.state_dict())
    assert restored.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_the_lr_has_one_source_the_param_groups_which_one_schedule_writes():
    """THOR's per-update lr array (MindSpore's) is a schedule on torch's step pre-hook that writes the groups'
    lr, read back at the checkpointed update index; a second schedule on the same optimizer is refused."""
    from torchboost.errors import ConfigError
    from torchboost.optim.thor import THOR

    lrs = [0.1, 0.05, 0.025, 0.0125]
    net = _net()
    opt = THOR(net, lr=torch.tensor(lrs, dtype=torch.float64), damping=0.1, frequency=2)
    x, y = _batch()
    seen = []
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append(o.param_groups[0]["lr"]))
    for _ in range(2):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    assert seen == lrs[:2]
    twin_net = _net()
    twin = THOR(twin_net, lr=lambda k: lrs[k], damping=0.1, frequency=2)
    twin.load_state_dict(opt.state_dict())  # a resumed run continues the schedule at update 2
    twin.register_step_post_hook(lambda o, args, kwargs: seen.append(o.param_groups[0]["lr"]))
    nn.functional.cross_entropy(twin_net(x), y).backward()
    twin.step()
    assert seen == lrs[:3]
    with pytest.raises(ConfigError, match="already follows its own per-update lr"):
        TrainStep(net, nn.CrossEntropyLoss(), opt, lr_schedule=[0.1] * 4)
    plain_net = _net()
    plain = THOR(plain_net, lr=0.1, damping=0.1)  # a number: the step's schedule (or torch's schedulers) set it
    step = TrainStep(plain_net, nn.CrossEntropyLoss(), plain, lr_schedule=[0.3, 0.2])
    step([_batch()], 1)
    assert [g["lr"] for g in plain.param_groups] == [0.2] * len(plain.param_groups)


def _probes(tree: ast.AST) -> list[str]:
    """hasattr/getattr calls whose object is an optimizer (a name or attribute containing 'opt')."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") \
                and node.args:
            target = ast.unparse(node.args[0])
            if re.fullmatch(r"opt|optim|optimizer|\w*_optimizer|\w*_opt", target.split(".")[-1].lower()):
                found.append(f"{node.func.id}({target}, ...)")
    return found


def test_no_attribute_probing_of_optimizers_and_no_private_torch_optimizer_api():
    probes, private = [], []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        probes += [f"{path.relative_to(PACKAGE)}: {p}" for p in _probes(ast.parse(text))]
        if "torch.optim.optimizer._" in text or "_optimizer_step_pre_hooks" in text or "_optimizer_state_dict" in text:
            private.append(str(path.relative_to(PACKAGE)))
    assert probes == [] and private == [], (probes, private)
