"""CIFAR-style ResNet-20/32/44/56 (He et al. 2016, section 4.2): parameter counts from the architecture
description, a float64 functional forward with the option-A shortcut written out independently, and
bit-exact save/load through every registered weight format."""

import pytest
import torch
import torch.nn.functional as F

from torchboost.errors import ConfigError
from torchboost.migrate.formats import FORMATS, read_weights, write_weights
from torchboost.models import create_model, list_models

DEPTH_N = {"resnet20": 3, "resnet32": 5, "resnet44": 7, "resnet56": 9}


def paper_count(n: int, classes: int = 10, cin: int = 3) -> int:
    """Weights of a 6n+2 CIFAR ResNet with option-A shortcuts: 3x3 convs, BN gamma/beta, the classifier."""
    total = cin * 16 * 9 + 2 * 16  # stem conv + BN
    prev = 16
    for w in (16, 32, 64):
        for b in range(n):
            total += (prev if b == 0 else w) * w * 9 + w * w * 9 + 4 * w
        prev = w
    return total + 64 * classes + classes


@pytest.mark.parametrize("name", list(DEPTH_N))
def test_parameter_count_matches_the_paper(name):
    model = create_model(name, num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == paper_count(DEPTH_N[name])


def test_exact_counts_round_to_the_paper_table():
    # He et al. 2016 Table 6: ResNet-20 0.27M, ResNet-32 0.46M, ResNet-44 0.66M, ResNet-56 0.85M
    exact = {name: sum(p.numel() for p in create_model(name, num_classes=10).parameters()) for name in DEPTH_N}
    assert exact == {"resnet20": 269_722, "resnet32": 464_154, "resnet44": 658_586, "resnet56": 853_018}
    assert [round(v / 1e6, 2) for v in exact.values()] == [0.27, 0.46, 0.66, 0.85]


def test_listed_and_options_refused():
    assert {"resnet20", "resnet56"} <= set(list_models())
    with pytest.raises(ConfigError):
        create_model("resnet20", init="mindspore")
    with pytest.raises(ConfigError):
        create_model("resnet20", padding="same")
    with pytest.raises(ConfigError):
        create_model("resnet20", image_size=28)


def test_zero_init_last_bn_makes_each_block_the_shortcut():
    model = create_model("resnet20", num_classes=10, zero_init_last_bn=True).double().eval()
    block = model.layer2[0]  # the stride-2, 16 -> 32 block: output = relu(shortcut(x))
    x = torch.randn(2, 16, 8, 8, dtype=torch.float64).relu()
    out = block(x)
    assert torch.equal(out[:, :16], x[:, :, ::2, ::2]) and torch.equal(out[:, 16:], torch.zeros_like(out[:, 16:]))


def _bn(x, state, prefix):
    return F.batch_norm(x, state[f"{prefix}.running_mean"], state[f"{prefix}.running_var"],
                        state[f"{prefix}.weight"], state[f"{prefix}.bias"], False, 0.0, 1e-5)


def reference_forward(state, x, n):
    """The network from its description: per block relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)), the
    shortcut subsampling by 2 and appending zero channels where the width doubles."""
    x = F.relu(_bn(F.conv2d(x, state["conv1.weight"], padding=1), state, "bn1"))
    for s, width in enumerate((16, 32, 64), start=1):
        for b in range(n):
            p = f"layer{s}.{b}"
            stride = 2 if s > 1 and b == 0 else 1
            out = F.relu(_bn(F.conv2d(x, state[f"{p}.conv1.weight"], stride=stride, padding=1), state, f"{p}.bn1"))
            out = _bn(F.conv2d(out, state[f"{p}.conv2.weight"], padding=1), state, f"{p}.bn2")
            short = x[:, :, ::stride, ::stride]
            if short.shape[1] != width:
                zeros = torch.zeros(short.shape[0], width - short.shape[1], *short.shape[2:], dtype=short.dtype)
                short = torch.cat([short, zeros], dim=1)
            x = F.relu(out + short)
    return x.mean(dim=(2, 3)) @ state["fc.weight"].T + state["fc.bias"]


@pytest.mark.parametrize("size", [28, 32])
def test_float64_forward_matches_the_reference(size):
    torch.manual_seed(0)
    model = create_model("resnet20", num_classes=10, in_chans=1).double()
    with torch.no_grad():  # non-trivial BN statistics so the check sees every term
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.2, 0.2)
    model.eval()
    x = torch.randn(3, 1, size, size, dtype=torch.float64)
    ref = reference_forward(model.state_dict(), x, 3)
    torch.testing.assert_close(model(x), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_weights_round_trip_every_format_bit_exactly(fmt, tmp_path):
    torch.manual_seed(1)
    model = create_model("resnet20", num_classes=10, in_chans=1)
    model.train()(torch.randn(4, 1, 28, 28))  # running statistics and num_batches_tracked move off their init
    state = {k: v for k, v in model.state_dict().items() if v.dtype in FORMATS[fmt].dtypes}
    assert len(state) >= len(list(model.parameters()))  # every weight is holdable
    path = tmp_path / f"w{FORMATS[fmt].suffixes[0]}"
    write_weights(path, state)
    back = read_weights(path)
    assert set(back) == set(state)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    fresh = create_model("resnet20", num_classes=10, in_chans=1)
    missing, unexpected = fresh.load_state_dict(back, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(fresh.eval()(x), model.eval()(x))
