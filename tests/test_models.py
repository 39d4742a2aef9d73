"""Model zoo tests: parameter counts, torchvision state-dict layout, v1.5 strides, shapes, init schemes,
and a float64 functional re-implementation of the forward pass as an independent reference."""

import math

import pytest
import torch
import torch.nn.functional as F

from torchboost.errors import ConfigError
from torchboost.models import create_model, list_models

# torchvision's published parameter counts (torchvision.models docs, 1000 classes).
COUNTS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
          "resnet101": 44_549_160, "resnet152": 60_192_808}
LAYERS = {"resnet18": [2, 2, 2, 2], "resnet34": [3, 4, 6, 3], "resnet50": [3, 4, 6, 3],
          "resnet101": [3, 4, 23, 3], "resnet152": [3, 8, 36, 3]}


def expected_keys(layers, bottleneck, num_classes=1000, in_chans=3):
    """torchvision's ResNet state-dict, in order, derived from the architecture description alone."""
    out = {}

    def conv(name, cout, cin, k):
        out[f"{name}.weight"] = (cout, cin, k, k)

    def bn(name, c):
        for s in ("weight", "bias", "running_mean", "running_var"):
            out[f"{name}.{s}"] = (c,)
        out[f"{name}.num_batches_tracked"] = ()

    exp = 4 if bottleneck else 1
    conv("conv1", 64, in_chans, 7)
    bn("bn1", 64)
    cin = 64
    for stage, (n, planes) in enumerate(zip(layers, [64, 128, 256, 512]), start=1):
        for i in range(n):
            p = f"layer{stage}.{i}"
            if bottleneck:
                conv(f"{p}.conv1", planes, cin, 1); bn(f"{p}.bn1", planes)
                conv(f"{p}.conv2", planes, planes, 3); bn(f"{p}.bn2", planes)
                conv(f"{p}.conv3", planes * 4, planes, 1); bn(f"{p}.bn3", planes * 4)
            else:
                conv(f"{p}.conv1", planes, cin, 3); bn(f"{p}.bn1", planes)
                conv(f"{p}.conv2", planes, planes, 3); bn(f"{p}.bn2", planes)
            if i == 0 and (stage > 1 or cin != planes * exp):
                conv(f"{p}.downsample.0", planes * exp, cin, 1); bn(f"{p}.downsample.1", planes * exp)
            cin = planes * exp
    out["fc.weight"] = (num_classes, 512 * exp)
    out["fc.bias"] = (num_classes,)
    return out


@pytest.mark.parametrize("name", list(COUNTS))
def test_param_counts_and_layout(name):
    with torch.device("meta"):  # shapes only: no memory, no init cost
        m = create_model(name)
    assert sum(p.numel() for p in m.parameters()) == COUNTS[name]
    exp = expected_keys(LAYERS[name], bottleneck=name not in ("resnet18", "resnet34"))
    got = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert list(got) == list(exp)  # same names in the same order as torchvision
    assert got == exp


def test_resnet50_layout_counts():
    with torch.device("meta"):
        sd = create_model("resnet50").state_dict()
    assert len(sd) == 320
    assert sum(not k.endswith(("running_mean", "running_var", "num_batches_tracked")) for k in sd) == 161


def test_v15_stride_on_3x3():
    m = create_model("resnet50")
    for stage in (m.layer2, m.layer3, m.layer4):
        blk = stage[0]
        assert blk.conv1.stride == (1, 1) and blk.conv2.stride == (2, 2) and blk.conv3.stride == (1, 1)
        assert blk.downsample[0].stride == (2, 2)
    sizes = {}
    hooks = [getattr(m.layer2[0], c).register_forward_hook(
        lambda mod, i, o, c=c: sizes.__setitem__(c, o.shape[-1])) for c in ("conv1", "conv2")]
    with torch.no_grad():
        m.eval()(torch.zeros(1, 3, 64, 64))  # stem /4 -> 16 px into layer2; only conv2 halves it
    assert sizes == {"conv1": 16, "conv2": 8}
    for h in hooks:
        h.remove()


def test_output_shapes():
    with torch.no_grad():
        m = create_model("resnet50", num_classes=1001).eval()
        assert m.fc.weight.shape == (1001, 2048)
        assert m(torch.randn(1, 3, 224, 224)).shape == (1, 1001)
        s = create_model("resnet18", num_classes=10, small_input=True).eval()
        assert s.conv1.kernel_size == (3, 3) and s.conv1.stride == (1, 1)
        assert isinstance(s.maxpool, torch.nn.Identity)
        assert s(torch.randn(2, 3, 32, 32)).shape == (2, 10)
        assert s.forward_features(torch.randn(1, 3, 32, 32)).shape == (1, 512, 4, 4)
        g = create_model("resnet18", num_classes=7, in_chans=1).eval()
        assert g.conv1.weight.shape == (64, 1, 7, 7) and g(torch.randn(1, 1, 64, 64)).shape == (1, 7)


def tf_same_pads(size: int, k: int, s: int) -> tuple[int, int]:
    """TensorFlow/MindSpore 'same': output ceil(size/s), the odd pixel of the total pad goes after."""
    total = max((math.ceil(size / s) - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def conv_ref(x, w, stride=1, same=False):
    """A conv with torch's symmetric k//2 padding, or explicitly 'same'-padded then valid."""
    k = w.shape[-1]
    if not same:
        return F.conv2d(x, w, stride=stride, padding=k // 2)
    (top, bottom), (left, right) = tf_same_pads(x.shape[2], k, stride), tf_same_pads(x.shape[3], k, stride)
    return F.conv2d(F.pad(x, (left, right, top, bottom)), w, stride=stride)


def maxpool_ref(x, same=False):
    if not same:
        return F.max_pool2d(x, 3, 2, 1)
    (top, bottom), (left, right) = tf_same_pads(x.shape[2], 3, 2), tf_same_pads(x.shape[3], 3, 2)
    return F.max_pool2d(F.pad(x, (left, right, top, bottom), value=-math.inf), 3, 2)


def reference_forward(sd, x, layers, bottleneck, small_input=False, eps=1e-5, same=False):
    """Eval-mode ResNet written with torch.nn.functional from the state dict only (float64);
    `same` pads every conv and the stem max-pool the MindSpore pad_mode='same' way."""
    def bn(p, t):
        return F.batch_norm(t, sd[f"{p}.running_mean"], sd[f"{p}.running_var"], sd[f"{p}.weight"],
                            sd[f"{p}.bias"], training=False, eps=eps)

    if small_input:
        x = F.relu(bn("bn1", conv_ref(x, sd["conv1.weight"], same=same)))
    else:
        x = F.relu(bn("bn1", conv_ref(x, sd["conv1.weight"], 2, same)))
        x = maxpool_ref(x, same)
    for stage, n in enumerate(layers, start=1):
        for i in range(n):
            p = f"layer{stage}.{i}"
            s = 2 if (i == 0 and stage > 1) else 1
            idn = x
            if f"{p}.downsample.0.weight" in sd:
                idn = bn(f"{p}.downsample.1", conv_ref(x, sd[f"{p}.downsample.0.weight"], s, same))
            if bottleneck:
                y = F.relu(bn(f"{p}.bn1", conv_ref(x, sd[f"{p}.conv1.weight"], same=same)))
                y = F.relu(bn(f"{p}.bn2", conv_ref(y, sd[f"{p}.conv2.weight"], s, same)))
                y = bn(f"{p}.bn3", conv_ref(y, sd[f"{p}.conv3.weight"], same=same))
            else:
                y = F.relu(bn(f"{p}.bn1", conv_ref(x, sd[f"{p}.conv1.weight"], s, same)))
                y = bn(f"{p}.bn2", conv_ref(y, sd[f"{p}.conv2.weight"], same=same))
            x = F.relu(y + idn)
    return x.mean((2, 3)) @ sd["fc.weight"].T + sd["fc.bias"]


def randomize_bn(m):
    """Non-trivial BN statistics so a mis-wired BN would show."""
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1); mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.0); mod.bias.uniform_(-0.1, 0.1)


@pytest.mark.parametrize("name,small", [("resnet18", True), ("resnet50", False)])
def test_forward_matches_functional_reference(name, small):
    torch.manual_seed(0)
    m = create_model(name, num_classes=5, small_input=small).double().eval()
    randomize_bn(m)
    x = torch.randn(2, 3, 32 if small else 64, 32 if small else 64, dtype=torch.float64)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        got = m(x)
    want = reference_forward(sd, x, LAYERS[name], name == "resnet50", small_input=small)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_same_padding_matches_functional_reference(name):
    """MindSpore pad_mode='same' vs explicit F.pad + valid conv/pool, on an odd height and an even width
    (so both the symmetric and the asymmetric case of every strided layer run)."""
    torch.manual_seed(0)
    m = create_model(name, num_classes=5, padding="same").double().eval()
    randomize_bn(m)
    x = torch.randn(2, 3, 41, 48, dtype=torch.float64)  # H odd at 4 of 5 strided layers, W even at 4
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        got = m(x)
    want = reference_forward(sd, x, LAYERS[name], name == "resnet50", same=True)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torchlike = reference_forward(sd, x, LAYERS[name], name == "resnet50")
    assert (got - torchlike).abs().max() > 1e-3  # the two paddings really differ on these sizes


def test_same_and_torch_padding_share_the_state_dict():
    torch.manual_seed(0)
    same = create_model("resnet50", padding="same")
    torch.manual_seed(0)
    plain = create_model("resnet50")
    a, b = same.state_dict(), plain.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    plain.load_state_dict(a, strict=True)


def test_zero_init_last_bn():
    m = create_model("resnet50", zero_init_last_bn=True)
    for stage in (m.layer1, m.layer2, m.layer3, m.layer4):
        for b in stage:
            assert torch.all(b.bn3.weight == 0) and torch.all(b.bn2.weight == 1) and torch.all(b.bn1.weight == 1)
    r = create_model("resnet18", zero_init_last_bn=True)
    assert all(torch.all(b.bn2.weight == 0) and torch.all(b.bn1.weight == 1) for b in r.layer3)
    assert torch.all(create_model("resnet18").layer1[0].bn2.weight == 1)


def test_torchvision_init_statistics():
    torch.manual_seed(0)
    m = create_model("resnet50")
    w = m.layer3[0].conv2.weight  # 256x256x3x3: fan_out = 256*9
    assert w.mean().abs() < 1e-3
    assert w.std().item() == pytest.approx(math.sqrt(2 / (256 * 9)), rel=0.02)
    w1 = m.layer4[0].conv3.weight  # 2048x512x1x1: fan_out = 2048
    assert w1.std().item() == pytest.approx(math.sqrt(2 / 2048), rel=0.02)
    assert torch.all(m.bn1.weight == 1) and torch.all(m.bn1.bias == 0) and m.bn1.eps == 1e-5
    bound = 1 / math.sqrt(2048)  # nn.Linear default (kaiming_uniform a=sqrt(5)) as torchvision keeps it
    assert m.fc.weight.abs().max() <= bound and m.fc.weight.abs().max() > 0.95 * bound
    assert m.fc.bias.abs().max() <= bound


def test_mindspore_init_statistics():
    torch.manual_seed(0)
    m = create_model("resnet50", init="mindspore")
    w = m.layer3[0].conv2.weight  # Xavier uniform: bound sqrt(6/(fan_in+fan_out)), fan = 256*9 each
    bound = math.sqrt(6 / (2 * 256 * 9))
    assert w.abs().max() <= bound and w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    # Truncated normal sigma 0.01 cut at 2 sigma has std 0.01 * 0.87962566 (the zoo's own constant).
    assert m.fc.weight.abs().max() <= 0.02
    assert m.fc.weight.std().item() == pytest.approx(0.01 * 0.87962566, rel=0.02)
    assert torch.all(m.fc.bias == 0)
    assert all(b.eps == 1e-4 for b in m.modules() if isinstance(b, torch.nn.BatchNorm2d))
    r = create_model("resnet18", init="mindspore")
    assert r.bn1.eps == 1e-5 and r.layer2[0].downsample[1].eps == 1e-5 and r.layer2[0].bn1.eps == 1e-4


def test_mnist_cnn():
    m = create_model("mnist_cnn", num_classes=10, in_chans=1)
    assert sum(p.numel() for p in m.parameters()) == 20 * 1 * 25 + 20 + 20 * 20 * 25 + 20 + 980 * 10 + 10
    assert m.conv1.padding == (2, 2) and m.fc.in_features == 980
    assert m(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    m32 = create_model("mnist_cnn", num_classes=10, in_chans=1, image_size=32)
    assert m32.fc.in_features == 20 * 8 * 8 and m32(torch.randn(1, 1, 32, 32)).shape == (1, 10)
    torch.manual_seed(0)
    w = create_model("mnist_cnn", in_chans=1, num_classes=10).conv2.weight  # Paddle: N(0, sqrt(2/fan_in))
    assert w.std().item() == pytest.approx(math.sqrt(2 / (20 * 25)), rel=0.05)


def test_errors_and_listing():
    assert list_models() == ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
                             "resnet20", "resnet32", "resnet44", "resnet56", "mobilenet_v3_small",
                             "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf",
                             "regnet_x_400mf", "mnist_cnn", "airbench", "airbench_wide"]
    with pytest.raises(ConfigError, match="resnet50"):
        create_model("resnet51")
    with pytest.raises(ConfigError, match="image_size"):
        create_model("resnet18", image_size=3)
    with pytest.raises(ConfigError, match="init"):
        create_model("resnet18", init="xavier")
    with pytest.raises(ConfigError, match="padding"):
        create_model("resnet18", padding="valid")
    with pytest.raises(ConfigError, match="padding"):
        create_model("mnist_cnn", padding="same")
