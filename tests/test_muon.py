"""Muon + AdamW as one optimizer: the authors' parameter split, updates equal to torch's own Muon (on a 2-D
copy of each conv filter bank) and AdamW, and the trainer's lr schedule reaching both parts at their ratio."""

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from torchboost.models import create_model
from torchboost.optim import muon_optimizer
from torchboost.optim.muon import muon_split
from torchboost.train.step import TrainStep


def names(model: nn.Module, params: list) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_split_mnist_cnn_and_resnet_follow_the_authors():
    cnn = create_model("mnist_cnn", num_classes=10, in_chans=1)
    muon, adamw, no_decay = muon_split(cnn)
    assert names(cnn, muon) == {"conv2.weight"}
    assert names(cnn, adamw) == {"conv1.weight", "fc.weight"}  # input layer and head
    assert names(cnn, no_decay) == {"conv1.bias", "conv2.bias", "fc.bias"}
    muon, adamw, _ = muon_split(cnn, input_layer="muon")  # a shallow CNN's input conv on Muon too
    assert names(cnn, muon) == {"conv1.weight", "conv2.weight"} and names(cnn, adamw) == {"fc.weight"}

    net = create_model("resnet18", num_classes=10, in_chans=3, small_input=True)
    muon, adamw, no_decay = muon_split(net)
    all_names = {n for n, _ in net.named_parameters()}
    assert names(net, adamw) == {"conv1.weight", "fc.weight"}
    assert names(net, no_decay) == {n for n, p in net.named_parameters() if p.ndim == 1}
    assert names(net, muon) == all_names - names(net, adamw) - names(net, no_decay)
    assert "layer1.0.conv1.weight" in names(net, muon) and "layer2.0.downsample.0.weight" in names(net, muon)


def test_embeddings_go_to_adamw():
    net = nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 3))
    muon, adamw, _ = muon_split(net)
    assert names(net, adamw) == {"0.weight", "1.weight", "3.weight"} and names(net, muon) == {"2.weight"}


def test_updates_equal_torch_muon_on_2d_views_and_torch_adamw():
    torch.manual_seed(0)
    net = create_model("mnist_cnn", num_classes=10, in_chans=1)
    ref = copy.deepcopy(net)
    opt = muon_optimizer(net, lr=0.02, momentum=0.9, weight_decay=0.01, adamw_lr=3e-3, adamw_betas=(0.8, 0.9))
    w2d = ref.conv2.weight.detach().reshape(20, -1).clone().requires_grad_()
    ref_muon = torch.optim.Muon([w2d], lr=0.02, momentum=0.9, weight_decay=0.01, nesterov=True)
    head = [ref.conv1.weight, ref.fc.weight]
    biases = [ref.conv1.bias, ref.conv2.bias, ref.fc.bias]
    ref_adamw = torch.optim.AdamW([{"params": head}, {"params": biases, "weight_decay": 0.0}], lr=3e-3,
                                  betas=(0.8, 0.9), weight_decay=0.01)
    for k in range(3):
        g = torch.Generator().manual_seed(k)
        x, y = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
        for m, o in ((net, opt), (ref, None)):
            m.zero_grad()
            F.cross_entropy(m(x), y).backward()
        opt.step()
        w2d.grad = ref.conv2.weight.grad.reshape(20, -1)
        ref_muon.step()
        ref_adamw.step()
        with torch.no_grad():
            ref.conv2.weight.copy_(w2d.view_as(ref.conv2.weight))
        for (n, p), q in zip(net.named_parameters(), ref.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-7, err_msg=n)


def test_trainer_schedule_keeps_the_adamw_ratio():
    net = create_model("mnist_cnn", num_classes=10, in_chans=1)
    opt = muon_optimizer(net, lr=0.02, adamw_lr=0.004)
    step = TrainStep(net, nn.CrossEntropyLoss(), opt, lr_schedule=np.array([0.05, 0.01]))
    step.set_lr(1)
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs["muon (hidden weights)"] == 0.01
    assert lrs["adamw (input layer, head)"] == 0.01 * 0.2 and lrs["adamw no_decay (biases, norms)"] == 0.01 * 0.2
    assert [g["weight_decay"] for g in opt.param_groups][-1] == 0.0
