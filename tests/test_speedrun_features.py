"""The speedrun's techniques as features any recipe sets (issue 56), each against an independent computation:
airbench's whitening stem against the patch covariance in float64, frozen BatchNorm scales and the shifts' lr
multiple against a hand-written SGD step, `data.holdout` reading no test split, and what a wrong combination says."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from torchboost.cli import main
from torchboost.data import build_loader
from torchboost.errors import ConfigError
from torchboost.models.airbench import init_whitening
from torchboost.recipe.build import build_model, optimizer_from_config
from torchboost.recipe.data import load_data
from torchboost.recipe.load import load_config

QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


def test_the_whitening_stem_makes_the_patch_covariance_the_identity_in_float64():
    torch.manual_seed(0)
    noise = torch.randn(400, 3, 10, 10, dtype=torch.float64)
    images = (noise[..., 1:, 1:] + 0.7 * noise[..., :-1, :-1]) * torch.linspace(0.5, 2, 9)  # correlated neighbours
    images[:, 1] += 0.5 * images[:, 0]  # and channels
    conv = nn.Conv2d(3, 24, 2).double()
    init_whitening(conv, images, eps=0.0)
    patches = F.unfold(images, 2).transpose(1, 2).reshape(-1, 12)
    patches = patches - patches.mean(0)
    cov = patches.T @ patches / len(patches)
    out = patches @ conv.weight[:12].reshape(12, 12).T  # the first half of the filters on the centred patches
    assert torch.allclose(out.T @ out / len(out), torch.eye(12, dtype=torch.float64), atol=1e-8)
    assert torch.equal(conv.weight[12:], -conv.weight[:12])  # and their negations
    evals = torch.linalg.eigvalsh(cov)  # eps adds to every eigenvalue: the whitened variances are λ / (λ + eps)
    init_whitening(conv, images, eps=0.5)
    out = patches @ conv.weight[:12].reshape(12, 12).T
    got = torch.linalg.eigvalsh(out.T @ out / len(out))
    assert torch.allclose(got.sort().values, (evals / (evals + 0.5)).sort().values, atol=1e-8)
    with pytest.raises(ConfigError, match="24 2x2 filters"):
        init_whitening(nn.Conv2d(3, 12, 2), images.float())




def test_the_patch_covariance_pools_batches_and_stops_at_its_budget(monkeypatch):
    from torchboost.models import airbench

    torch.manual_seed(1)
    a, b = torch.randn(30, 3, 7, 7, dtype=torch.float64), torch.randn(20, 3, 7, 7, dtype=torch.float64) * 2 + 1
    stats = airbench.PatchCovariance(3, 2)
    stats.add(a)
    stats.add(b)
    patches = torch.cat([F.unfold(x, 2).transpose(1, 2).reshape(-1, 12) for x in (a, b)])
    mean, cov = stats.result()
    torch.testing.assert_close(mean, patches.mean(0))
    torch.testing.assert_close(cov, torch.cov(patches.T, correction=0))
    monkeypatch.setattr(airbench, "MAX_PATCHES", 1000)  # a photo folder's 224-px images: 50,000 patches each
    capped = airbench.PatchCovariance(3, 2)
    for _ in range(3):
        capped.add(torch.randn(4, 3, 224, 224))
    assert capped.count <= 1000 and capped.count > 500


def test_frozen_bn_scales_and_the_shifts_lr_multiple_change_sgds_update_as_written():
    """One SGD step (no momentum, no decay) through the recipe's builder: a scale frozen at 1 stays 1, a shift
    moves by mult x lr x its gradient, every other weight by lr x its gradient."""
    cfg = load_config("mnist-lenet", ["model.name=airbench", "optim.freeze_bn_scale=true", "optim.bn_bias_lr_mult=8",
                                      "optim.momentum=0",
                      "optim.weight_decay=0", "model.num_classes=10", "model.in_chans=1"])
    torch.manual_seed(0)
    net = build_model(cfg)
    opt = optimizer_from_config(cfg, net, lr=0.1)
    before = {n: p.detach().clone().double() for n, p in net.named_parameters()}
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    F.cross_entropy(net(x), y).backward()
    grads = {n: (p.grad.double() if p.grad is not None else None) for n, p in net.named_parameters()}
    opt.step()
    bn = {f"{n}.{k}" for n, m in net.named_modules() if isinstance(m, nn.BatchNorm2d) for k in ("weight", "bias")}
    assert any(n.endswith("bias") for n in bn)
    for n, p in net.named_parameters():
        if n in bn and n.endswith("weight") or n == "whiten.weight":
            assert grads[n] is None and torch.equal(p.double(), before[n]), n  # frozen: no gradient, no move
            continue
        mult = 8 if n in bn else 1
        torch.testing.assert_close(p.double(), before[n] - 0.1 * mult * grads[n], rtol=0, atol=1e-7)


@pytest.mark.parametrize("overrides, says", [
    (["model.name=mnist_cnn", "optim.freeze_bn_scale=true"], "optim.freeze_bn_scale is set but mnist_cnn has no "
                                                              "BatchNorm"),
    (["model.name=mnist_cnn", "optim.bn_bias_lr_mult=4"], "optim.bn_bias_lr_mult is set but mnist_cnn"),
    (["data.dataset=synthetic", "data.flip=alternate"], "data.flip=alternate applies to in-memory sets"),
    (["model.name=airbench"], "airbench needs images of at least 16 px, and these are 8 px"),
])
def test_a_speedrun_key_where_it_cannot_act_is_refused_in_one_line(overrides, says, capsys, tmp_path):
    assert main(["train", "-c", "digits-lenet", *[a for o in overrides for a in ("--set", o)],
                 "-o", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and not (tmp_path / "o").exists()


def test_an_airbench_run_with_every_speedrun_key_holds_out_and_never_reads_the_test_split(tmp_path, capsys,
                                                                                          monkeypatch):
    """`train` on mnist5k with the speedrun's keys and data.holdout: it evaluates on held-out training images each
    epoch, reads no test split (its loader would fail here), its stem is the data's whitening and stays so."""
    from torchboost.recipe import kinds

    real = kinds.load_builtin

    def no_test(name, split="train", *a, **k):
        assert split == "train", f"read the {split} split"
        return real(name, split, *a, **k)

    monkeypatch.setattr(kinds, "load_builtin", no_test)
    out = tmp_path / "run"
    keys = ["model.name=airbench", "data.holdout=500", "data.flip=alternate", "optim.freeze_bn_scale=true",
            "optim.bn_bias_lr_mult=4", "eval.tta=flip_translate", "train.amp_dtype=bfloat16", "model.channels_last=true",
            "model.whiten_images=256", "data.batch_size=64", "train.label_smoothing=0.2"]
    assert main(["train", "-c", "mnist-lenet", "--epochs", "1", *[a for k in keys for a in ("--set", k)], *QUIET,
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "500 images held out of mnist5k, split train" in text and "test split stays unseen" in text
    rows = [json.loads(r) for r in (out / "history.jsonl").read_text().splitlines()]
    assert rows[-1]["val_samples"] == 500 and rows[-1]["val_top_1_accuracy"] > 0.5
    state = torch.load(out / "ckpt" / "airbench-best.pt", weights_only=True)
    assert all(torch.equal(v, torch.ones_like(v)) for k, v in state["model"].items()
               if k.startswith("layers") and k.endswith("weight") and v.ndim == 1)  # BatchNorm scales still 1
    _, train_ds, _ = load_data(load_config("mnist-lenet", keys), log=lambda _: None, holdout=500)
    stem = build_model(load_config("mnist-lenet", [*keys, "model.num_classes=10", "model.in_chans=1"]),
                       build_loader(train_ds, 64, True, seed=0)).whiten.weight
    assert torch.allclose(state["model"]["whiten.weight"], stem, atol=1e-6)  # set from the same images, never trained
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out / "ckpt" / "airbench-best.pt"), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)  # eval reads what the run evaluated: the held-out images
    # eval computes in float32, the run's evaluation under its bfloat16 autocast: a few of 500 images may differ
    assert result["samples"] == 500 and result["top_1_accuracy"] == pytest.approx(rows[-1]["val_top_1_accuracy"],
                                                                                  abs=0.01)
    assert result["evaluated_on"].startswith("500 images held out of mnist5k")


def test_the_speedrun_recipe_loads_with_its_keys():
    cfg = load_config("fashion-speedrun")
    assert (cfg.model.name, cfg.data.flip, cfg.eval.tta, cfg.optim.freeze_bn_scale) == \
        ("airbench", "alternate", "flip_translate", True)
    assert cfg.data.holdout == 0 and cfg.data.train_subset is None  # all 60,000 images, the test split at the end
