"""Mixed precision levels (dtypes of weights and activations, dynamic loss scaling) and EMA evaluation,
against independent references, on a tiny network."""

import copy

import pytest
import torch
from torch import nn

from torchboost.train.ema import ModelEMA
from torchboost.compat import mindspore
from torchboost.compat.mindspore import DynamicLossScaleManager
from torchboost.train.model import Model
from train_tiny import batches, tiny_model, tiny_net


def ms_model(lr: float = 0.1, **kw) -> mindspore.Model:
    """tiny_model's network and optimizer under MindSpore's Model signature (amp_level, loss_scale_manager)."""
    net = tiny_net()
    return mindspore.Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9),
                           device="cpu", **kw)


def activation_dtypes(model):
    """dtype of every Conv2d/Linear output during one training step."""
    seen = []
    layers = {id(m) for m in model.network.modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    for m in model.network.modules():
        if id(m) in layers:  # deep copies (the fp64 reference) carry the hook along: ignore them
            m.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype) if id(mod) in layers else None)
    return seen


def fp64_update(net, x, y, lr):
    ref = copy.deepcopy(net).double()
    loss = nn.functional.cross_entropy(ref(x.double()), y)
    return [-lr * g for g in torch.autograd.grad(loss, list(ref.parameters()))]


def flat(tensors):
    return torch.cat([t.double().flatten() for t in tensors])


def cosine(a, b):
    return float(a @ b / (a.norm() * b.norm()))


def test_o3_casts_the_whole_network_to_bf16():
    model = ms_model(lr=0.1, amp_level="O3")
    assert all(p.dtype == torch.bfloat16 for p in model.network.parameters())
    seen = activation_dtypes(model)
    x, y = batches(1)[0]
    start = [p.detach().clone() for p in model.network.parameters()]
    want = fp64_update(model.network, x, y, 0.1)  # the reference starts from the same (bf16) weights
    model.optimizer.param_groups[0]["momentum"] = 0.0
    model.train_step([(x, y)], 0)
    assert set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.bfloat16 for p in model.network.parameters())
    got = flat(p.detach() - s for p, s in zip(model.network.parameters(), start))
    assert cosine(got, flat(want)) > 0.99  # the same update, at bf16's 8 significant bits


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_o1_o2_bf16_keep_fp32_weights_and_need_no_loss_scale(level):
    model = ms_model(amp_level=level)
    assert model.loss_scale_manager is None and model.autocast_dtype == torch.bfloat16
    seen = activation_dtypes(model)
    model.train(1, batches(2))
    assert set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.network.parameters())


def test_o2_fp16_adds_dynamic_loss_scaling_that_halves_on_each_overflow():
    model = ms_model(lr=0.1, amp_level="O2", amp_dtype="float16")
    scaler = model.loss_scale_manager
    assert isinstance(scaler, DynamicLossScaleManager) and scaler.get_loss_scale() == 2.0**24
    assert model.train_step.grad_scaler is scaler  # the same scaler torch's vocabulary calls grad_scaler
    assert ms_model(amp_level="O1", amp_dtype="float16").loss_scale_manager is None  # O1: MindSpore's rule
    model.optimizer.param_groups[0]["momentum"] = 0.0
    seen = activation_dtypes(model)
    x, y = batches(1)[0]
    skipped = 0
    for step in range(40):  # 2^24 times fp16 gradients overflows: halve until it fits
        before = [p.detach().clone() for p in model.network.parameters()]
        want = fp64_update(model.network, x, y, 0.1)
        out = model.train_step([(x, y)], step)
        after = list(model.network.parameters())
        if not out.skipped:
            break
        skipped += 1
        assert all(torch.equal(b, a) for b, a in zip(before, after))  # a skipped update changes nothing
        assert scaler.get_loss_scale() == 2.0 ** (24 - skipped)
    assert 0 < skipped < 40 and set(seen) == {torch.float16}
    assert all(p.dtype == torch.float32 for p in after)
    got = flat(a.detach() - b for a, b in zip(after, before))
    want = flat(want)
    assert cosine(got, want) > 0.999
    assert got.norm().item() == pytest.approx(want.norm().item(), rel=0.02)  # unscaled: not 2^k times too big


def test_ema_evaluation_equals_evaluating_a_network_with_the_ema_weights():
    net = tiny_net()
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), device="cpu",
                  ema=ModelEMA(net, decay=0.7, warmup=None))
    data = batches(3)
    model.train(2, data)
    got = model.eval(data, use_ema=True)

    ref = tiny_net(seed=42)
    ref.load_state_dict(model.ema.module.state_dict())
    ref.eval()
    with torch.no_grad():
        x, y = map(torch.cat, zip(*data))
        logits = ref(x)
    assert got["loss"] == pytest.approx(nn.functional.cross_entropy(logits, y).item(), rel=1e-6)
    assert got["top_1_accuracy"] == pytest.approx((logits.argmax(1) == y).double().mean().item())
    top5 = (logits.topk(5, 1).indices == y[:, None]).any(1).double().mean().item()
    assert got["top_5_accuracy"] == pytest.approx(top5) and got["samples"] == len(y)
    assert got["loss"] != model.eval(data)["loss"]  # the raw weights give another answer
