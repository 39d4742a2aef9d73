"""A compiled training step (StepOptions.compile, train.compile): after N updates with a changing lr, the weights
match the eager step's (float64, inductor on the CPU), without recompiling for each new lr; THOR compiles its
update between refreshes (a refresh runs eagerly); optimizers that cannot be compiled are refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

from torchboost.errors import ConfigError
from torchboost.optim.registry import OptimizerArgs, build_optimizer
from torchboost.optim.thor import ThorOptions
from torchboost.train.step import TrainStep


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 8 * 8, 10)).double()


def _batch(k: int):
    g = torch.Generator().manual_seed(k)
    return torch.randn(8, 1, 12, 12, generator=g, dtype=torch.float64), torch.randint(0, 10, (8,), generator=g)


# Muon orthogonalises in bf16 (torch's Newton-Schulz), whose rounding differs between the compiled and eager
# kernels: its updates agree to bf16's ~0.4% per step, the others' to float64's
THOR = ThorOptions(frequency=4)  # refreshes (eager) at updates 0, 4 and 8; the others compiled


@pytest.mark.parametrize("name, lr, rtol, options", [
    ("sgd", 0.1, 1e-7, None), ("adamw", 1e-3, 1e-6, None), ("muon", 0.02, 3e-2, None), ("thor", 0.05, 1e-7, THOR),
    ("thor", 0.02, 1e-7, ThorOptions(frequency=4, graft="muon_step"))], ids=["sgd", "adamw", "muon", "thor",
                                                                            "thor-graft"])
@pytest.mark.slow
def test_a_compiled_step_trains_like_the_eager_one(name, lr, rtol, options):
    torch._dynamo.reset()
    schedule = [lr * 0.8**k for k in range(10)]
    runs = {}
    for mode in ("none", "default"):
        net = _net()
        opt = build_optimizer(name, net, OptimizerArgs(lr=lr, weight_decay=1e-3, options=options))
        step = TrainStep(net, nn.CrossEntropyLoss(), opt, lr_schedule=schedule, compile=mode)
        for k in range(10):
            step([_batch(k)], k)
        runs[mode] = (net, opt)
    (eager, eager_opt), (compiled, compiled_opt) = runs["none"], runs["default"]
    start = list(_net().parameters())
    with torch.no_grad():
        for p, q, w0 in zip(eager.parameters(), compiled.parameters(), start):  # what the 6 updates changed
            moved = (p - w0).norm()  # (a conv bias before a BatchNorm has no gradient: only weight decay moves it)
            assert (q - p).norm() <= rtol * moved + 1e-10, (name, float((q - p).norm()), float(moved))
    assert [g["lr"] for g in compiled_opt.param_groups] == [g["lr"] for g in eager_opt.param_groups]
    assert all(type(g["lr"]) is float for g in compiled_opt.param_groups)  # checkpoints hold plain numbers


@pytest.mark.slow
def test_a_changing_lr_does_not_recompile_the_step():
    torch._dynamo.reset()
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, lr_schedule=[0.1 / (k + 1) for k in range(12)],
                     compile="default")
    for k in range(2):  # the first two updates compile: without, then with the momentum buffers
        step([_batch(k)], k)
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for k in range(2, 12):
        step([_batch(k % 3)], k)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before


@pytest.mark.slow
def test_thor_compiles_once_and_refreshes_eagerly():
    torch._dynamo.reset()
    net = _net()
    opt = build_optimizer("thor", net, OptimizerArgs(lr=0.05, options=THOR))
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, lr_schedule=[0.05 / (k + 1) for k in range(16)],
                     compile="default")
    for k in range(6):  # refresh at 0 and 4 (eager), compiled forward and update at the others
        step([_batch(k)], k)
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for k in range(6, 15):  # a refresh at 8 and 12, new lrs at every update: nothing new to compile
        step([_batch(k % 3)], k)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before
    assert opt.counters["refreshes"] == 4 * sum(1 for _ in opt.layers)  # every layer at 0, 4, 8 and 12
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in net.modules())  # none between refreshes


def test_what_cannot_be_compiled_and_unknown_modes_are_refused_in_one_line():
    net = _net()
    with pytest.raises(ConfigError, match="cannot be compiled"):
        TrainStep(net, nn.CrossEntropyLoss(), build_optimizer("thor_muon", net, OptimizerArgs(lr=0.1)),
                  compile="default")
    with pytest.raises(ConfigError, match="cannot be compiled"):
        TrainStep(net, nn.CrossEntropyLoss(), build_optimizer("thor_ekfac", net, OptimizerArgs(lr=0.1)),
                  compile="default")
    with pytest.raises(ConfigError, match="is not a mode"):
        TrainStep(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), compile="fast")
    with pytest.raises(ConfigError, match="CUDA graphs.*static buffers"):  # THOR's fresh gradients and inverses
        TrainStep(net, nn.CrossEntropyLoss(), build_optimizer("thor", net, OptimizerArgs(lr=0.1)),
                  compile="cudagraphs")


def test_gradient_freezing_under_compile_is_refused_in_one_line():
    """Freezing flips requires_grad on a schedule: one graph per trainable set, then eager past dynamo's cache."""
    from torchboost.recipe import load_config

    with pytest.raises(ConfigError, match="gradient freezing .* would compile a graph of its own") as e:
        load_config("digits-lenet", ["train.compile=default", "boost.level=O1"])  # validated as it loads
    assert "train.compile=none" in e.value.fix
    load_config("digits-lenet", ["train.compile=default", "boost.level=O0"])  # no freezing: compiled
    load_config("digits-lenet", ["train.compile=none", "boost.level=O1"])  # freezing, eager


@pytest.mark.slow
def test_a_compiled_run_reports_its_graphs_and_each_recompile_with_its_reason():
    """Model.train says at each epoch's end how many graphs it compiled and how many recompiles it met: none for
    a steady run; a batch of another size (the last, without drop_last) is a recompile, named with its guard."""
    from torchboost.train.model import Model

    def fit(sizes: list[int]) -> tuple[list[str], tuple]:
        torch._dynamo.reset()
        net = _net()
        model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.05), compile="default")
        data = [(_batch(k)[0][:n], _batch(k)[1][:n]) for k, n in enumerate(sizes)]
        said: list[str] = []
        state = model.train(2, data, log_fn=said.append)
        return [s for s in said if s.startswith("compile=default: ") and "graph" in s], state.compile_stats

    lines, (graphs, recompiles) = fit([8, 8, 8])
    assert recompiles == 0 and graphs >= 1 and lines == [f"compile=default: {graphs} graph(s) compiled, 0 recompile(s) so far"]
    lines, (graphs, recompiles) = fit([8, 8, 5])
    assert recompiles >= 1 and "recompile(s) so far (latest: " in lines[0] and "size" in lines[0]
