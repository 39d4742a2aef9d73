"""Racers a user would pick today, from their own packages: schedule-free SGD/AdamW (schedulefree) and SOAP
(heavyball). Each registered entry against the package's optimizer used directly (float64 where the package
computes in the parameters' dtype), and schedule-free's evaluation: the average of its iterates swapped in
through the trainer protocol, with BatchNorm's statistics recomputed there."""

import copy

import pytest
import torch
from torch import nn

from torchboost.optim.groups import param_groups
from torchboost.optim.registry import OptimizerArgs, build_optimizer
from torchboost.train import Model
from torchboost.train.eval_weights import recompute_batchnorm

schedulefree = pytest.importorskip("schedulefree")


def net(dtype=torch.float64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 3)).to(dtype)


def batches(n: int, dtype=torch.float64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 1, 6, 6, generator=g).to(dtype), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def steps(model: nn.Module, opt: torch.optim.Optimizer, data: list) -> None:
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


ARGS = OptimizerArgs(lr=0.05, momentum=0.9, weight_decay=1e-3)


@pytest.mark.parametrize("name, reference", [
    ("sgd_schedulefree", lambda groups: schedulefree.SGDScheduleFree(groups, lr=0.05, momentum=0.9)),
    ("adamw_schedulefree", lambda groups: schedulefree.AdamWScheduleFree(groups, lr=0.05)),
])
def test_schedule_free_entries_step_as_the_package_does(name, reference):
    """Three updates in float64, then the evaluation weights: the registered entry and the package's optimizer
    used directly (in train mode, the package's own groups) agree to the last bit."""
    mine, theirs = net(), net()
    opt = build_optimizer(name, mine, ARGS if name.startswith("sgd") else OptimizerArgs(lr=0.05, weight_decay=1e-3))
    ref = reference(param_groups(theirs, 1e-3))
    ref.train()
    data = batches(3)
    steps(mine, opt, data)
    steps(theirs, ref, data)
    for a, b in zip(mine.parameters(), theirs.parameters()):
        assert a.dtype == torch.float64 and torch.equal(a, b)
    opt.eval_weights()
    ref.eval()
    for a, b in zip(mine.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
    opt.train_weights()  # back to the iterate the step moves: the next update continues as before
    ref.train()
    steps(mine, opt, batches(1))
    steps(theirs, ref, batches(1))
    assert all(torch.equal(a, b) for a, b in zip(mine.parameters(), theirs.parameters()))


def test_soap_steps_as_heavyball_does():
    heavyball = pytest.importorskip("heavyball")
    import heavyball.utils

    from torchboost.optim.soap import PRECONDITION_FREQUENCY

    mine, theirs = net(torch.float32), net(torch.float32)
    opt = build_optimizer("soap", mine, OptimizerArgs(lr=0.003, weight_decay=1e-3))
    heavyball.utils.compile_mode = None
    ref = heavyball.SOAP(param_groups(theirs, 1e-3), lr=0.003, precondition_frequency=PRECONDITION_FREQUENCY)
    data = batches(4, torch.float32)
    steps(mine, opt, data)
    steps(theirs, ref, data)
    for a, b in zip(mine.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
    assert not any(torch.equal(a, b) for a, b in zip(mine.parameters(), net(torch.float32).parameters()))


def test_recomputed_batchnorm_statistics_are_the_plain_average_over_the_batches():
    bn = nn.BatchNorm2d(2, momentum=0.1).double()
    inputs = [torch.randn(5, 2, 3, 3, dtype=torch.float64) + k for k in range(3)]
    assert recompute_batchnorm(bn, inputs) == 3 and bn.momentum == 0.1 and bn.training
    means = torch.stack([x.mean((0, 2, 3)) for x in inputs]).mean(0)
    vars_ = torch.stack([x.var((0, 2, 3), unbiased=True) for x in inputs]).mean(0)
    assert torch.allclose(bn.running_mean, means) and torch.allclose(bn.running_var, vars_)
    assert recompute_batchnorm(nn.Linear(2, 2), inputs) == 0  # no BatchNorm: nothing run


def test_model_train_evaluates_and_saves_the_averaged_weights():
    """After each epoch the parameters are schedule-free's average (the optimizer in eval mode) with BatchNorm's
    statistics recomputed there, and the next epoch steps again from the training iterate (its step refuses to
    run otherwise); the evaluation Model.train reports is that of those weights."""
    model = net(torch.float32)
    opt = build_optimizer("sgd_schedulefree", model, ARGS)
    data = batches(6, torch.float32)
    state = Model(model, nn.CrossEntropyLoss(), opt).train(2, data, eval_data=data[:2], log_fn=lambda s: None)
    assert opt.param_groups[0]["train_mode"] is False  # the weights in the model are the average
    averaged = copy.deepcopy(model)
    recompute_batchnorm(averaged, [x for x, _ in data])  # the statistics the trainer computed at these weights
    bn, again = model[1], averaged[1]
    assert torch.allclose(bn.running_mean, again.running_mean) and torch.allclose(bn.running_var, again.running_var)
    evaluated = Model(averaged, nn.CrossEntropyLoss()).eval(data[:2])
    assert state.eval_results["val_top_1_accuracy"] == evaluated["top_1_accuracy"]


def test_a_schedule_free_racer_holds_its_lr_after_the_warm_up():
    """In a race, schedule-free racers keep the recipe's warm-up and then hold the peak lr (their average replaces
    the decay); a racer that anneals ends its cosine near 0."""
    from torchboost.recipe import load_resolved
    from torchboost.race.lanes import builtin_racer, run_race

    cfg, train_ds, eval_ds = load_resolved("digits-lenet", ["data.batch_size=128"])
    racers = [builtin_racer("sgd_schedulefree", cfg, (0.5,)), builtin_racer("sgd", cfg, (0.05,))]
    assert racers[0].hold_lr and not racers[1].hold_lr
    lanes = run_race(cfg, train_ds, eval_ds, racers, [0], (0.999,), epochs=2, log=lambda s: None)
    last = {l.racer: l.optimizer.param_groups[0]["lr"] for l in lanes}
    assert last["sgd_schedulefree"] == pytest.approx(0.5) and last["sgd"] < 0.01
    assert all(l.history[-1]["val_top_1_accuracy"] > 0.2 for l in lanes)


def test_a_soap_run_is_not_resumed_and_says_why(tmp_path, capsys):
    pytest.importorskip("heavyball")
    from torchboost.cli import main

    out = tmp_path / "run"
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-b", "512", "--set", "optim.name=soap",
                 "--set", "optim.momentum=null", "-o", str(out), "--set", "train.progress_bar=false"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--epochs", "2", "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert "optim.name=soap keeps optimizer state torchboost cannot check" in err and "\n" not in err
    assert "unmodified checkpoint" not in err and "train.init_weights=" in err
