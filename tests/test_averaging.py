"""train.average: SWA and Lookahead around any optimizer, against float64 references computed by hand from the
plain optimizer's own trajectory; evaluation through the trainer protocol (SWA's average swapped in, BatchNorm
recomputed at it); checkpoints that resume the live weights; the config's refusals."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from torchboost.errors import ConfigError
from torchboost.optim.averaging import SWA, Lookahead, averaged
from torchboost.train.eval_weights import to_eval_weights, to_train_weights


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).double()


def batch(k: int):
    g = torch.Generator().manual_seed(k)
    return torch.randn(16, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,), generator=g)


def update(model: nn.Module, opt: torch.optim.Optimizer, k: int) -> None:
    x, y = batch(k)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_swa_averages_the_plain_trajectory_from_start_every_n_and_leaves_it_unchanged():
    plain, wrapped = net(), net()
    ref_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    swa = SWA(torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9), start=4, every=2)
    snapshots = []
    for k in range(11):
        update(plain, ref_opt, k)
        update(wrapped, swa, k)
        if k + 1 > 4 and (k + 1 - 5) % 2 == 0:  # after updates 5, 7, 9, 11
            snapshots.append(flat(plain).clone())
    assert torch.equal(flat(plain), flat(wrapped))  # averaging never touches the trained weights
    assert len(snapshots) == 4 and swa.swaps_weights
    swa.eval_weights()
    torch.testing.assert_close(flat(wrapped), torch.stack(snapshots).mean(0), rtol=0, atol=1e-14)
    swa.train_weights()
    assert torch.equal(flat(plain), flat(wrapped))


def test_lookahead_matches_the_slow_fast_recursion():
    model, ref = net(), net()
    la = Lookahead(torch.optim.SGD(model.parameters(), lr=0.1), k=3, alpha=0.4)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    slow = flat(ref).clone()
    for k in range(10):
        update(model, la, k)
        update(ref, ref_opt, k)
        if (k + 1) % 3 == 0:  # slow <- slow + alpha (fast - slow); fast <- slow
            slow = slow + 0.4 * (flat(ref) - slow)
            with torch.no_grad():  # copied in: vector_to_parameters would make the weights views of `slow`
                offset = 0
                for p in ref.parameters():
                    p.copy_(slow[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
    torch.testing.assert_close(flat(model), flat(ref), rtol=0, atol=1e-14)
    assert not la.swaps_weights  # the fast weights are evaluated as they are


def test_evaluation_sees_the_average_with_batchnorm_recomputed_at_it():
    model = net()
    swa = SWA(torch.optim.SGD(model.parameters(), lr=0.2), start=2)
    for k in range(6):
        update(model, swa, k)
    inputs = [batch(100 + i)[0] for i in range(3)]
    to_eval_weights(swa, model, lambda: iter(inputs))
    bn = model[1]
    with torch.no_grad():  # the statistics the averaged weights give, by hand
        h = torch.cat([model[0](x) for x in inputs])
    torch.testing.assert_close(bn.running_mean, h.mean(0), rtol=0, atol=1e-12)
    averaged_weights = flat(model).clone()
    to_train_weights(swa)
    assert not torch.equal(flat(model), averaged_weights)


def test_a_checkpoint_taken_while_the_average_is_in_resumes_the_trained_weights():
    model = net()
    swa = SWA(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), start=1)
    for k in range(4):
        update(model, swa, k)
    live = flat(model).clone()
    swa.eval_weights()  # as before a checkpoint
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(swa.state_dict())
    swa.train_weights()
    update(model, swa, 4)
    resumed = net()
    resumed.load_state_dict(saved_model)
    again = SWA(torch.optim.SGD(resumed.parameters(), lr=0.1, momentum=0.9), start=1)
    again.load_state_dict(saved_opt)
    again.train_weights()  # the trainer's first call of an epoch
    assert torch.equal(flat(resumed), live)
    update(resumed, again, 4)
    assert torch.equal(flat(resumed), flat(model))
    again.eval_weights(), swa.eval_weights()
    assert torch.equal(flat(resumed), flat(model))


def test_what_averaging_refuses():
    model = net()
    with pytest.raises(ConfigError, match="k >= 1"):
        Lookahead(torch.optim.SGD(model.parameters(), lr=0.1), k=0)
    with pytest.raises(ConfigError, match="already evaluates other weights"):
        SWA(SWA(torch.optim.SGD(model.parameters(), lr=0.1), start=1), start=1)
    with pytest.raises(ConfigError, match="train.average"):
        averaged(torch.optim.SGD(model.parameters(), lr=0.1), "polyak", 10)
    from torchboost.recipe import load_config
    with pytest.raises(ConfigError, match="averaging step is not compiled"):
        load_config("digits-lenet", ["train.average=swa", "train.compile=default"])


@pytest.mark.slow
def test_a_recipe_trains_with_swa_and_evaluates_the_average(tmp_path):
    """`train --set train.average=swa`: the optimizer is the average around the recipe's; the run's evaluation
    is of the averaged weights (the saved weights are the average, BatchNorm recomputed)."""
    from torchboost.cli import main
    out = tmp_path / "run"
    assert main(["train", "-c", "digits-lenet", "--epochs", "2", "--set", "train.average=swa",
                 "--set", "train.average_start=0.5", "--set", "train.test_at_end=false", "-o", str(out)]) == 0
    from torchboost.recipe import load_config
    assert load_config(str(out / "config.yaml")).train.average == "swa"


def test_a_race_evaluates_the_swa_average_and_trains_on_from_the_live_weights():
    """`race --set train.average=swa`: each evaluation sees the average (BatchNorm-free LeNet: the weights alone),
    and the next epoch trains on from the trained weights, not from the average."""
    from torchboost.recipe import load_resolved
    from torchboost.recipe.load import recipe_with_data
    from torchboost.race.lanes import _lane, builtin_racer

    built, _, _ = recipe_with_data("digits-lenet", ["train.average=swa", "train.average_start=0", "train.epochs=2"],
                                   None)
    cfg, train_ds, _ = load_resolved(built=built)
    lane = _lane(cfg, builtin_racer("sgd", cfg, (0.05,)), 0.05, 0, train_ds, torch.device("cpu"))
    lane.train_epoch(0)
    params = [p for p in lane.model.parameters()]
    state = lane.optimizer.state
    assert all(torch.equal(p, state[p]["swa_average"]) for p in params)  # evaluated at the average
    live = [state[p]["swa_live"].clone() for p in params]
    assert any(not torch.equal(a, b) for a, b in zip(live, params))
    lane.train_epoch(1)  # back to the live weights first: the average moved on from them
    assert all(torch.equal(p, state[p]["swa_average"]) for p in params)
    assert int(state[params[0]]["swa_count"]) == 2 * len(lane.loader)
