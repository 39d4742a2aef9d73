"""Each optimizer, schedule and boost path through the recipe layer, checked against what it must do
(independent references: the config's own formula, the objects' types and states), not just "it runs"."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchboost.migrate import convert
from torchboost.models import create_model
from torchboost.migrate.formats import all_suffixes
from torchboost.recipe.build import build_schedule, effective_lr, optimizer_from_config
from torchboost.recipe.infer import evaluate_checkpoint
from torchboost.recipe.load import load_config, load_resolved
from torchboost.recipe.run import train_from_config
from torchboost.train.checkpoint import classifier_head, load_checkpoint
from torchboost.train.model import Model

FAST = ["train.progress_bar=false", "train.log_every=1000"]


def _run(tmp, *extra):
    return train_from_config(load_config("digits-lenet", FAST + [f"output={tmp}", *extra]))


def test_thor_checkpoint_holds_thor_state_that_continues_the_run(tmp_path):
    run = _run(tmp_path / "thor", "train.epochs=2", "optim.name=thor", "optim.lr=0.02",
               "optim.thor={damping: 0.03, frequency: 20}")
    assert run.eval_results["val_top_1_accuracy"] >= 0.9
    ckpt = load_checkpoint(run.last_checkpoint)
    thor = ckpt["optimizer"]["thor"]  # an SGD checkpoint has no such entry
    assert set(thor["layers"]) == {"conv1", "conv2", "fc"}  # every Conv2d/Linear of the MNIST CNN
    assert thor["update"] == ckpt["global_step"] == 2 * 44


@pytest.mark.slow
def test_less_bn_boost_run_reloads_for_evaluation(tmp_path):
    """O1 on a BatchNorm ResNet removes BNs and swaps the head: evaluation must rebuild that structure."""
    run = _run(tmp_path / "o1", "train.epochs=1", "model.name=resnet18", "model.small_input=true",
               "model.num_classes=4", "data.dataset=synthetic", "data.synthetic_size=128", "data.image_size=16",
               "data.eval_batch_size=16", "boost.level=O1", "boost.config={grad_freeze: {param_groups: 2}}",
               "data.batch_size=32")
    state = load_checkpoint(run.last_checkpoint)["model"]
    assert "fc.multiplier" in state and "layer1.0.bn1.weight" not in state  # FN head, branch BN gone
    assert evaluate_checkpoint(str(run.last_checkpoint))["top_1_accuracy"] == pytest.approx(
        run.eval_results["val_top_1_accuracy"])


@pytest.mark.parametrize("name,cls", [("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD)])
@pytest.mark.slow
def test_first_order_optimizers_train_and_carry_the_config(tmp_path, name, cls):
    unset = ["optim.momentum=null"] if name == "adamw" else []  # the recipe's SGD momentum does not apply
    cfg = load_config("digits-lenet", [f"optim.name={name}", "optim.lr=0.002" if name == "adamw" else "optim.lr=0.05",
                                       "optim.weight_decay=0.01", *unset])
    cfg_run, _, _ = load_resolved("digits-lenet", [f"optim.name={name}", *unset])
    opt = optimizer_from_config(cfg, __import__("torchboost").create_model("mnist_cnn", 10, 1, image_size=8), cfg.optim.lr)
    assert isinstance(opt, cls) and opt.param_groups[0]["lr"] == cfg.optim.lr
    decays = sorted({g["weight_decay"] for g in opt.param_groups})
    assert decays == [0.0, 0.01]  # BN/bias groups are not decayed (decay_bn_and_bias=false)
    run = _run(tmp_path / name, "train.epochs=2", f"optim.name={name}",
               "optim.lr=0.002" if name == "adamw" else "optim.lr=0.05", *unset)
    assert run.eval_results["val_top_1_accuracy"] >= 0.9 and cfg_run.optim.name == name


def test_muon_through_the_recipe(tmp_path):
    run = _run(tmp_path / "muon", "train.epochs=2", "optim.name=muon", "optim.lr=0.02", "optim.momentum=0.95")
    assert run.eval_results["val_top_1_accuracy"] >= 0.9
    assert load_checkpoint(run.last_checkpoint)["config"]["optim"]["name"] == "muon"


def test_lr_reference_batch_scales_linearly():
    cfg = load_config("digits-lenet", ["optim.lr=0.256", "optim.lr_reference_batch=256", "data.batch_size=32",
                                       "train.accumulation_steps=2"])
    assert effective_lr(cfg, world_size=4) == pytest.approx(0.256 * 32 * 2 * 4 / 256)
    assert effective_lr(load_config("digits-lenet", ["optim.lr=0.1"]), 8) == 0.1  # no reference: as given


def test_thor_schedule_mode_follows_mindspores_formula():
    cfg = load_config("digits-lenet", ["schedule.mode=thor", "optim.lr=0.05", "schedule.lr_decay=4",
                                       "schedule.lr_end_epoch=10", "schedule.decay_epochs=100", "train.epochs=3"])
    steps = 7
    lrs = build_schedule(cfg, 0.05, steps)
    assert len(lrs) == 3 * steps
    for i in (0, 5, 20):  # lr(i) = lr * (1 - e/lr_end_epoch)^lr_decay with e = (i + 1) / steps_per_epoch
        e = (i + 1) / steps
        assert lrs[i] == pytest.approx(0.05 * (1 - e / 10) ** 4, rel=1e-6)


@pytest.mark.parametrize("suffix", [None, *all_suffixes()])
@pytest.mark.slow
def test_init_weights_starts_from_given_weights_only(tmp_path, suffix):
    """From a training checkpoint, or its weights in any registered format (torch names in every container)."""
    first = _run(tmp_path / "a", "train.epochs=1")
    weights = first.last_checkpoint
    if suffix is not None:
        weights = tmp_path / f"w{suffix}"
        convert(first.last_checkpoint, weights, arch="none")
    cfg = load_config("digits-lenet", FAST + [f"output={tmp_path / 'b'}", "train.epochs=1",
                                             f"train.init_weights={weights}", "optim.lr=1e-12",
                                             "schedule.mode=constant"])
    second = train_from_config(cfg)
    w0 = load_checkpoint(first.last_checkpoint)["model"]
    w1 = load_checkpoint(second.last_checkpoint)["model"]
    for k, v in w0.items():  # a negligible lr: the second run ends where the given weights started
        if v.dtype.is_floating_point and "running" not in k:
            assert torch.allclose(v, w1[k], atol=1e-6), k
    assert load_checkpoint(second.last_checkpoint)["global_step"] == 44  # a new run, not a resume


def test_resolved_config_is_what_the_run_saved(tmp_path):
    run = _run(tmp_path / "r", "train.epochs=1")
    saved = load_checkpoint(run.last_checkpoint)["config"]
    assert saved == run.config.to_dict()
    assert (saved["model"]["num_classes"], saved["model"]["in_chans"], saved["data"]["image_size"]) == (10, 1, 8)
    assert np.allclose(saved["data"]["mean"], [0.3049], atol=1e-3) and math.isfinite(saved["data"]["std"][0])


@pytest.mark.parametrize("name,mom,nest", [("sgd", 0.9, False), ("thor", 0.9, False), ("muon", 0.95, True),
                                           ("thor_muon", 0.95, True), ("normuon", 0.95, True),
                                           ("thor_normuon", 0.95, True)])
def test_unset_momentum_is_each_optimizers_own_default(name, mom, nest):
    cfg, _, _ = load_resolved(None, ["data.dataset=digits", f"optim.name={name}"])
    assert (cfg.optim.momentum, cfg.optim.nesterov) == (mom, nest)  # recorded in config.yaml and checkpoints
    cfg, _, _ = load_resolved(None, ["data.dataset=digits", f"optim.name={name}", "optim.momentum=0.5"])
    assert cfg.optim.momentum == 0.5


def test_thor_muon_through_the_recipe(tmp_path):
    from torchboost.optim import ThorPreconditioned

    cfg = load_config("digits-lenet", FAST + [f"output={tmp_path}", "train.epochs=1", "optim.name=thor_muon",
                                              "optim.lr=0.02", "optim.momentum=null", "optim.thor={damping: 0.1, frequency: 10}"])
    resolved, _, _ = load_resolved("digits-lenet", ["optim.name=thor_muon", "optim.momentum=null"])
    opt = optimizer_from_config(resolved, __import__("torchboost").create_model("mnist_cnn", 10, 1, image_size=8), 0.02)
    assert isinstance(opt, ThorPreconditioned)
    assert train_from_config(cfg).eval_results["val_top_1_accuracy"] >= 0.85


@pytest.mark.parametrize("name", ["sgd", "adamw", "muon", "thor", "thor_muon", "normuon", "thor_normuon"])
def test_head_lr_mult_scales_only_the_head_through_the_schedule(name):
    """Every optimizer: the classifier head's groups carry mult x the lr of the group they came from, at every
    step of a schedule, and nothing else moves between groups."""
    torch.manual_seed(0)
    net = create_model("mnist_cnn", 10, 1)
    head = {id(p) for n, p in net.named_parameters() if n in classifier_head(net)}
    plain = optimizer_from_config(load_config(None, [f"optim.name={name}"]), create_model("mnist_cnn", 10, 1), 0.1, 10)
    opt = optimizer_from_config(load_config(None, [f"optim.name={name}", "optim.head_lr_mult=10"]), net, 0.1, 10)
    assert sum(len(g["params"]) for g in opt.param_groups) == sum(len(g["params"]) for g in plain.param_groups)
    model = Model(net, torch.nn.CrossEntropyLoss(), opt, lr_schedule=np.array([0.5, 0.25]))
    base = {g.get("name"): g.get("lr_scale", 1.0) for g in plain.param_groups}  # Muon's AdamW ratio stays
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    for step, lr in enumerate([0.5, 0.25]):
        model.train_step([(x, y)], step)
        for g in opt.param_groups:
            in_head = [id(p) in head for p in g["params"]]
            assert all(in_head) or not any(in_head)  # a group is all head or no head
            origin = g.get("name", "group").removesuffix(" (classifier head)")
            want = lr * base.get(origin if g.get("name") else None, 1.0) * (10 if all(in_head) else 1)
            assert g["lr"] == pytest.approx(want, rel=1e-12)


def test_head_lr_mult_sgd_step_is_the_dense_formula():
    """Plain SGD (no momentum): w <- w - lr x mult x grad on the head, w - lr x grad elsewhere (float64)."""
    torch.manual_seed(0)
    net = create_model("mnist_cnn", 10, 1).double()
    cfg = load_config(None, ["optim.momentum=0", "optim.head_lr_mult=4"])
    opt = optimizer_from_config(cfg, net, 0.05, 1)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    x, y = torch.randn(4, 1, 28, 28, dtype=torch.float64), torch.tensor([0, 1, 2, 3])
    torch.nn.functional.cross_entropy(net(x), y).backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    opt.step()
    head = classifier_head(net)
    for n, p in net.named_parameters():
        assert torch.allclose(p, before[n] - 0.05 * (4 if n in head else 1) * grads[n], rtol=0, atol=1e-15), n
