"""The skip policy and loss-scale overflow checks on the device (check_every > 1): an update to drop is applied
and undone (`train.undo`) without a host read, with exactly the result of the host-read path (check_every=1,
which decides before applying): weights, optimizer state, BatchNorm statistics, EMA and loss scale. Under DDP
the verdict rides on the gradient all-reduce: no collective is added per update."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as tdist
from torch import nn

from torchboost.errors import TrainingError
from torchboost.optim.muon import muon_optimizer
from torchboost.train.ema import ModelEMA
from torchboost.train.model import Model
from torchboost.train.step import TrainStep
from test_host_syncs import host_reads  # noqa: F401  (the fixture)
from test_thor_dist import finish_rank, spawn_ranks
from train_tiny import batches


@pytest.fixture(autouse=True)
def undo_on_cpu(monkeypatch):  # the device path, checked here on the CPU (by default it runs on accelerators)
    monkeypatch.setattr(TrainStep, "undo_on_cpu", True)


def bn_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 5))


OPTIMIZERS = {
    "sgd": lambda net: torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adamw": lambda net: torch.optim.AdamW(net.parameters(), lr=0.01),
    "muon": lambda net: muon_optimizer(net, lr=0.02, weight_decay=1e-3),
}


def poisoned(batch, k: int, bad: set[int]):
    x, y = batch
    return (x * float("nan"), y) if k in bad else (x, y)


def run(opt_name: str, check_every: int, bad: set[int], updates: int = 12, scaler=None, ema: bool = True,
        loss_fn=nn.CrossEntropyLoss(), **options):
    net = bn_net()
    opt = OPTIMIZERS[opt_name](net)
    shadow = ModelEMA(net, decay=0.7, warmup=None) if ema else None
    step = TrainStep(net, loss_fn, opt, ema=shadow, check_every=check_every, grad_scaler=scaler,
                     compute_accuracy=True, **options)
    data = batches(4)
    outs = [step([poisoned(data[k % 4], k, bad)], k) for k in range(updates)]
    return net, opt, shadow, step, outs


def same_state(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    return all(same_state(a[k], b[k]) if isinstance(a[k], dict) else
               torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("bad", [{0}, {3}, {3, 4, 9}], ids=["first", "one", "several"])
def test_an_update_undone_on_the_device_equals_one_never_applied(opt_name, bad):
    host = run(opt_name, 1, bad, nonfinite="skip", max_nonfinite_steps=3)
    device = run(opt_name, 4, bad, nonfinite="skip", max_nonfinite_steps=3)
    assert device[3].masks_on_device and not host[3].masks_on_device
    assert same_state(host[0].state_dict(), device[0].state_dict())  # weights and BatchNorm statistics
    assert same_state(host[1].state_dict()["state"], device[1].state_dict()["state"])
    assert same_state(host[2].module.state_dict(), device[2].module.state_dict())
    assert all(torch.isfinite(t).all() for t in device[0].state_dict().values())
    flags = [bool(o.nonfinite) for o in device[4]]
    assert flags == [k in bad for k in range(12)] == [bool(o.skipped) for o in device[4]]


def test_host_reads_per_check_not_per_update_with_skip_and_with_loss_scaling(host_reads):
    # (SGD: torch's AdamW reads its step counter on the host itself unless built capturable or fused)
    for lr, bad, options in ((0.05, {15}, {"nonfinite": "skip", "max_nonfinite_steps": 3}),
                             (1e-8, set(), {"scaler": torch.amp.GradScaler("cpu", init_scale=2.0 ** 116, growth_interval=4),
                                            "loss_fn": huge})):
        net = bn_net()
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
        step = TrainStep(net, options.pop("loss_fn", nn.CrossEntropyLoss()), opt,
                         check_every=10, grad_scaler=options.pop("scaler", None), **options)
        assert step.masks_on_device
        data = batches(4)
        for k in range(10):  # updates that create optimizer state are decided on the host (the first applied)
            step([data[k % 4]], k)
        host_reads.clear()
        skipped = [step([poisoned(data[k % 4], k, bad)], k).skipped for k in range(10, 50)]
        assert len(host_reads) <= 40 // 10, (options, host_reads)  # one per check, none per update
        if bad:
            assert [bool(s) for s in skipped] == [k in bad for k in range(10, 50)]
        else:  # the scale grows every 4 updates until it overflows again: undone on the device
            assert 4 <= sum(bool(s) for s in skipped) <= 20


def huge(logits, y):  # gradients that overflow at a scale of 2^118 (AdamW does not mind their size)
    return nn.functional.cross_entropy(logits, y) * 1e6


def test_loss_scaling_overflows_are_undone_like_grad_scalers_own_skip():
    def scaler():
        return torch.amp.GradScaler("cpu", init_scale=2.0 ** 118, growth_interval=3)

    host = run("adamw", 1, set(), updates=16, scaler=scaler(), loss_fn=huge)
    device = run("adamw", 8, set(), updates=16, scaler=scaler(), loss_fn=huge)
    skipped = [bool(o.skipped) for o in device[4]]
    assert skipped == [o.skipped for o in host[4]] and 2 <= sum(skipped) < 16  # overflows, then it trains
    assert not any(bool(o.nonfinite) for o in device[4])  # an overflow is not a non-finite loss
    assert same_state(host[0].state_dict(), device[0].state_dict())
    assert same_state(host[1].state_dict()["state"], device[1].state_dict()["state"])
    assert host[3].grad_scaler.get_scale() == device[3].grad_scaler.get_scale()


def test_the_streak_limit_is_decided_at_the_check_and_names_the_update():
    with pytest.raises(TrainingError, match=r"more than max_nonfinite_steps=2 updates in a row at update 7 "
                                            r"\(checked at update 8, every 4 updates\)"):
        run("sgd", 4, {4, 5, 6}, max_nonfinite_steps=2, nonfinite="skip")


def test_model_epoch_sums_leave_out_skipped_updates_without_reading_them():
    data = batches(6)
    data[2] = (data[2][0] * float("nan"), data[2][1])
    results = {}
    for check_every in (1, 3):
        net = bn_net()
        model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                      metrics=["acc"], device="cpu", nonfinite="skip", max_nonfinite_steps=2,
                      check_every=check_every, compute_accuracy=True)
        results[check_every] = model.train(1, data, log_fn=lambda line: None).eval_results
    assert results[1]["train_loss"] == pytest.approx(results[3]["train_loss"], rel=1e-6)
    assert results[1]["train_top_1_accuracy"] == results[3]["train_top_1_accuracy"]


def test_the_skip_policy_restores_batchnorm_statistics_on_the_host_path_too():
    net, *_ = run("sgd", 1, {2}, updates=3, nonfinite="skip", max_nonfinite_steps=1)
    assert torch.isfinite(net[1].running_mean).all() and torch.isfinite(net[1].running_var).all()


def test_the_cpu_keeps_the_host_decision_unless_told(monkeypatch):
    monkeypatch.setattr(TrainStep, "undo_on_cpu", False)
    net = bn_net()
    step = TrainStep(net, nn.CrossEntropyLoss(), OPTIMIZERS["sgd"](net), check_every=8, nonfinite="skip",
                     max_nonfinite_steps=2)
    assert not step.masks_on_device


def test_thor_and_boost_hooks_keep_the_host_decision():
    from torchboost.optim.thor import THOR
    net = bn_net()
    opt = THOR(net, lr=0.05)
    assert not TrainStep(net, nn.CrossEntropyLoss(), opt, check_every=8, nonfinite="skip",
                         max_nonfinite_steps=2).masks_on_device


# --- two ranks under DDP: the same verdict, no extra collective ------------------------------------------

def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    TrainStep.undo_on_cpu = True  # a spawned process: the fixture's patch is not here
    calls = []
    original = tdist.all_reduce

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    tdist.all_reduce = counting  # torchboost's own collectives go through it; DDP's reducer does not
    net = nn.parallel.DistributedDataParallel(bn_net())
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, check_every=5, nonfinite="skip", max_nonfinite_steps=2)
    data = batches(8)
    skipped = []
    for k in range(10):
        x, y = data[2 * (k % 4) + rank]
        if k == 3 and rank == 1:  # a non-finite loss on one rank only
            x = x * float("nan")
        skipped.append(bool(step([(x, y)], k).skipped))
    tdist.all_reduce = original
    finish_rank(out, rank, {"weights": net.module.state_dict(), "skipped": skipped,
                            "masked": step.masks_on_device, "calls": len(calls)})


@pytest.mark.slow
def test_under_ddp_every_rank_skips_the_same_update_with_no_extra_collective(tmp_path):
    ranks = spawn_ranks(_ddp_worker, tmp_path)
    assert all(r["masked"] for r in ranks)
    assert ranks[0]["skipped"] == ranks[1]["skipped"] == [k == 3 for k in range(10)]
    weights = [{k: v for k, v in r["weights"].items() if "running" not in k and "batches" not in k} for r in ranks]
    assert same_state(*weights)  # (BatchNorm's running statistics are each rank's own)
    assert all(torch.isfinite(v).all() for v in ranks[0]["weights"].values())
    assert ranks[0]["calls"] == ranks[1]["calls"] == 2  # one per check (updates 5 and 10), none per update


def test_a_restored_state_resumes_with_the_streak():
    *_, step, _ = run("sgd", 4, {10, 11}, updates=12, nonfinite="skip", max_nonfinite_steps=3)
    saved = copy.deepcopy(step.state_dict())
    assert saved["nonfinite_streak"] == 2


def test_the_step_clock_times_updates_between_marks():
    from torchboost.train.device import StepClock
    clock = StepClock(torch.device("cpu"))
    assert clock.per_update_s() is None
    clock.mark()
    first = clock.first
    for _ in range(3):
        clock.mark()
    assert clock.updates == 3 and clock.per_update_s() == pytest.approx((clock.last - first) / 3)


def test_clipping_by_global_norm_gives_the_host_paths_weights():
    host = run("sgd", 1, {3}, nonfinite="skip", max_nonfinite_steps=3, clip_global_norm=0.05)
    device = run("sgd", 4, {3}, nonfinite="skip", max_nonfinite_steps=3, clip_global_norm=0.05)
    assert device[3].masks_on_device
    for k, v in host[0].state_dict().items():  # the norm computed once and reused by the clip: same result
        torch.testing.assert_close(device[0].state_dict()[k], v, rtol=1e-6, atol=1e-7)
