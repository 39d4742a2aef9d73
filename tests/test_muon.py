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
                                  betas=(0.8, 0.9), weight_decay=0.01, fused=True)  # as Muon runs it
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


def test_normuon_matches_a_float64_formula_and_keeps_muons_step_norm():
    """NorMuon (row_beta): momentum, Nesterov, Newton-Schulz (torch's own, which iterates in bf16), rows
    divided by the root of their running mean square, rescaled to the orthogonalised update's norm, decoupled
    decay, torch's lr adjustment — three steps against the formula in float64, on a wide and a tall weight."""
    from torch.optim import _muon

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 12, bias=False), nn.Linear(12, 5, bias=False),
                        nn.Linear(5, 9, bias=False), nn.Linear(9, 3, bias=False)).double()
    lr, mom, wd, beta = 0.05, 0.9, 0.01, 0.8
    opt = muon_optimizer(net, lr=lr, momentum=mom, weight_decay=wd, row_beta=beta)
    hidden = {1: net[1].weight, 2: net[2].weight}  # muon_split: first and last Linear go to AdamW
    w = {i: p.detach().numpy().copy() for i, p in hidden.items()}
    buf = {i: np.zeros_like(v) for i, v in w.items()}
    ms = {i: np.zeros(v.shape[0]) for i, v in w.items()}
    for k in range(3):
        g = torch.Generator().manual_seed(k)
        x, y = torch.randn(16, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,), generator=g)
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        grads = {i: p.grad.numpy().copy() for i, p in hidden.items()}
        opt.step()
        for i in w:
            buf[i] = mom * buf[i] + (1 - mom) * grads[i]
            o = _muon._zeropower_via_newtonschulz(torch.from_numpy((1 - mom) * grads[i] + mom * buf[i]),
                                                  (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C), 5,
                                                  _muon.EPS).double().numpy()
            ms[i] = beta * ms[i] + (1 - beta) * (o**2).mean(axis=1)
            n = o / (np.sqrt(ms[i])[:, None] + 1e-8)
            n *= np.linalg.norm(o) / np.linalg.norm(n)
            rows, cols = w[i].shape
            w[i] = w[i] * (1 - lr * wd) - lr * max(1, rows / cols) ** 0.5 * n
            np.testing.assert_allclose(hidden[i].detach().numpy(), w[i], rtol=1e-9, atol=1e-12)
    state = opt.state[net[1].weight]["row_mean_square"]
    assert state.shape == (5,) and state.dtype == torch.float64
    # the normalisation changes the step's direction, not its size: the same norm as plain Muon's step
    assert not np.allclose(n, o) and np.isclose(np.linalg.norm(n), np.linalg.norm(o))


def test_a_channels_last_network_gets_the_update_of_its_contiguous_copy():
    """model.channels_last: a conv weight in NHWC memory is flattened in its own memory order; Muon's update does
    not depend on the order of the columns, so from the same gradients it equals the update of the same network in
    NCHW memory (the Muon-and-channels_last run crashed before: a view across the permuted strides). Newton-Schulz
    runs in bfloat16, whose sums the column order changes: the tolerance is bf16's."""
    for row_beta in (None, 0.95):  # Muon, then NorMuon (its row statistics per output channel)
        torch.manual_seed(0)
        net = create_model("resnet20", num_classes=10, in_chans=1)
        nhwc = copy.deepcopy(net).to(memory_format=torch.channels_last)
        start = net.layer1[0].conv1.weight.detach().clone()
        kw = dict(lr=0.02, momentum=0.9, weight_decay=0.01) | ({} if row_beta is None else {"row_beta": row_beta})
        opts = [muon_optimizer(m, **kw) for m in (net, nhwc)]
        for k in range(2):
            g = torch.Generator().manual_seed(k)
            for p, q in zip(net.parameters(), nhwc.parameters()):
                p.grad = torch.randn(p.shape, generator=g)
                q.grad = p.grad.clone().to(memory_format=torch.channels_last) if q.ndim == 4 else p.grad.clone()
            for o in opts:
                o.step()
        conv = nhwc.layer1[0].conv1.weight
        assert not conv.is_contiguous() and conv.is_contiguous(memory_format=torch.channels_last)  # still NHWC
        for (n, p), q in zip(net.named_parameters(), nhwc.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=2e-4, err_msg=n)
        assert (net.layer1[0].conv1.weight - start).abs().max() > 1e-3  # a step was compared, not a no-op
