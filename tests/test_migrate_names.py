"""ResNet weight-name maps (MindSpore zoo <-> torchvision/torchboost), the torch network a conversion
reports, and `convert` across formats (MindSpore <-> Paddle through torch names)."""

import pytest
import torch

from torchboost.errors import CheckpointError, ConfigError
from torchboost.migrate import (convert, detect_arch, layout, load_mindspore_ckpt, load_pdparams, load_torch_state,
                                mindspore_notes, mindspore_to_torch, save_mindspore_ckpt, torch_to_mindspore)
from torchboost.models import create_model

LAYERS = {"resnet18": [2, 2, 2, 2], "resnet34": [3, 4, 6, 3], "resnet50": [3, 4, 6, 3],
          "resnet101": [3, 4, 23, 3], "resnet152": [3, 8, 36, 3]}


def zoo_names(arch, layers):
    """MindSpore model-zoo parameter names, written from official/cv/ResNet/src/resnet.py's structure."""
    bottleneck = arch not in ("resnet18", "resnet34")
    bn = ["gamma", "beta", "moving_mean", "moving_variance"]
    names = ["conv1.weight"] + [f"bn1.{s}" for s in bn]
    for stage, n in enumerate(layers, start=1):
        for i in range(n):
            p = f"layer{stage}.{i}"
            convs = ("conv1", "conv2", "conv3") if bottleneck else ("conv1", "conv2")
            bns = ("bn1", "bn2", "bn3") if bottleneck else ("bn1d", "bn2d")  # ResidualBlockBase uses bn1d/bn2d
            for c, b in zip(convs, bns):
                names += [f"{p}.{c}.weight"] + [f"{p}.{b}.{s}" for s in bn]
            if i == 0 and (bottleneck or stage > 1):
                names += [f"{p}.down_sample_layer.0.weight"] + [f"{p}.down_sample_layer.1.{s}" for s in bn]
    return names + ["end_point.weight", "end_point.bias"]


def randomized_resnet(arch, num_classes=1000):
    """A model whose every state entry is distinct, so a swapped mapping (e.g. mean/var) cannot hide."""
    torch.manual_seed(0)
    m = create_model(arch, num_classes=num_classes)
    with torch.no_grad():
        for k, v in m.state_dict().items():
            if k.endswith("running_mean"):
                v.uniform_(-0.5, 0.5)
            elif k.endswith(("running_var", "bn1.weight", "bn2.weight", "bn3.weight")):
                v.uniform_(0.5, 1.5)
            elif k.endswith("bias"):
                v.uniform_(-0.1, 0.1)
    return m


def test_resnet50_round_trip_identical_and_same_outputs():
    m = randomized_resnet("resnet50")
    sd = m.state_dict()
    ms, rep = torch_to_mindspore(sd, "resnet50")
    assert rep.ok and len(rep.mapped) == 267 and len(ms) == 267
    assert sorted(rep.skipped) == sorted(k for k in sd if k.endswith("num_batches_tracked"))  # 53 counters
    assert list(ms) == zoo_names("resnet50", LAYERS["resnet50"])  # zoo names, nothing left over
    assert torch.equal(ms["layer1.0.bn3.moving_variance"], sd["layer1.0.bn3.running_var"])
    assert torch.equal(ms["layer4.0.down_sample_layer.1.gamma"], sd["layer4.0.downsample.1.weight"])
    back, rep2 = mindspore_to_torch(ms, "resnet50")
    assert rep2.ok and len(rep2.filled) == 53
    assert list(back) == list(sd) and len(back) == 320
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    m2 = create_model("resnet50")
    m2.load_state_dict(back, strict=True)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(m.eval()(x), m2.eval()(x))


@pytest.mark.parametrize("arch", list(LAYERS))
def test_layout_covers_every_entry(arch):
    rows = layout(arch)
    torch_names = [t for t, _, _ in rows]
    with torch.device("meta"):
        sd = create_model(arch).state_dict()
    assert torch_names == list(sd)
    ms = [m for _, m, _ in rows if m is not None]
    assert ms == zoo_names(arch, LAYERS[arch])
    assert [t for t, m, _ in rows if m is None] == [k for k in sd if k.endswith("num_batches_tracked")]
    assert detect_arch(ms) == detect_arch(torch_names) == arch


def test_resnet50_counts():
    rows = layout("resnet50")
    assert len(rows) == 320
    params = [t for t, m, _ in rows if m and not t.endswith(("running_mean", "running_var"))]
    assert len(params) == 161


def test_drop_background_1001_to_1000():
    m = randomized_resnet("resnet18", num_classes=1001)
    ms, _ = torch_to_mindspore(m.state_dict())
    out, rep = mindspore_to_torch(ms, drop_background=True)
    assert rep.ok and out["fc.weight"].shape == (1000, 512)
    assert torch.equal(out["fc.weight"], m.fc.weight[1:]) and torch.equal(out["fc.bias"], m.fc.bias[1:])
    kept, rep_keep = mindspore_to_torch(ms)
    assert rep_keep.ok and kept["fc.weight"].shape == (1001, 512)
    _, bad = mindspore_to_torch(ms, num_classes=1001, drop_background=True)  # expects 1002 rows
    assert not bad.ok and bad.mismatched[0][0] == "end_point.weight" and "end_point.weight" in bad.first_problem()


def test_moments_and_training_state():
    ms, _ = torch_to_mindspore(create_model("resnet18").state_dict())
    extra = {f"moments.{k}": torch.full_like(v, 0.5) for k, v in ms.items() if "moving_" not in k}
    extra.update({"learning_rate": torch.tensor(0.1), "global_step": torch.tensor([5], dtype=torch.int32),
                  "layer1.0.conv1.matrix_a_inv": torch.zeros(3, 3)})
    out, rep = mindspore_to_torch({**ms, **extra})
    assert rep.ok and not any(k.startswith("moments.") for k in out)
    assert sorted(rep.skipped) == sorted(extra)
    out, rep = mindspore_to_torch({**ms, **extra}, convert_moments=True)
    assert rep.ok and torch.equal(out["moments.fc.weight"], torch.full((1000, 512), 0.5))
    assert torch.equal(out["moments.layer2.0.downsample.1.weight"], torch.full((128,), 0.5))
    back, rep_back = torch_to_mindspore(out, convert_moments=True)
    assert rep_back.ok and torch.equal(back["moments.layer2.0.down_sample_layer.1.gamma"], torch.full((128,), 0.5))


def test_unmapped_missing_and_aliases():
    ms, _ = torch_to_mindspore(create_model("resnet18").state_dict())
    ms["head.extra"] = torch.zeros(2)
    del ms["layer3.1.conv2.weight"]
    out, rep = mindspore_to_torch(ms)
    assert rep.unmapped == ["head.extra"] and rep.missing == ["layer3.1.conv2.weight"] and not rep.ok
    assert "SHAPE" not in rep.summary() and "UNMAPPED (1): head.extra" in rep.summary()
    # Some ports spell the basic block's BNs bn1/bn2: accepted on import.
    alias = {k.replace(".bn1d.", ".bn1.").replace(".bn2d.", ".bn2."): v for k, v in ms.items() if k != "head.extra"}
    _, rep_alias = mindspore_to_torch(alias, "resnet18")
    assert rep_alias.missing == ["layer3.1.conv2.weight"] and not rep_alias.unmapped
    with pytest.raises(ConfigError, match="resnet18"):
        detect_arch(["features.0.weight"])
    with pytest.raises(ConfigError):
        layout("vgg16")


def test_notes_report_differences():
    text = " ".join(mindspore_notes("resnet50"))
    assert "1e-4" in text and "same" in text and "1001" in text
    assert "1e-5" in " ".join(mindspore_notes("resnet34"))
    _, rep = mindspore_to_torch(torch_to_mindspore(create_model("resnet18").state_dict())[0])
    assert rep.notes and "note:" in rep.summary()


def test_convert_across_formats(tmp_path):
    m = randomized_resnet("resnet18", num_classes=10)
    sd = m.state_dict()
    torch.save({"model": sd, "epoch": 3}, tmp_path / "train.pt")  # a training checkpoint, not a bare state dict
    rep = convert(tmp_path / "train.pt", tmp_path / "ms.ckpt")
    assert rep.ok and rep.arch == "resnet18"
    ms = load_mindspore_ckpt(tmp_path / "ms.ckpt")
    assert list(ms) == zoo_names("resnet18", LAYERS["resnet18"])
    assert torch.equal(ms["end_point.weight"], sd["fc.weight"])
    convert(tmp_path / "ms.ckpt", tmp_path / "w.safetensors")
    convert(tmp_path / "w.safetensors", tmp_path / "w.pth")
    back = load_torch_state(tmp_path / "w.pth")
    assert sorted(back) == sorted(sd) and all(torch.equal(back[k], sd[k]) for k in sd)  # safetensors sorts names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ms.ckpt", "train.pt", "w.pth", "w.safetensors"]


def test_convert_drop_background_and_errors(tmp_path):
    m = randomized_resnet("resnet18", num_classes=1001)
    save_mindspore_ckpt(tmp_path / "zoo.ckpt", torch_to_mindspore(m.state_dict())[0], crc=True)
    rep = convert(tmp_path / "zoo.ckpt", tmp_path / "out.pt", arch="resnet18", num_classes=1000, drop_background=True)
    assert rep.ok
    net = create_model("resnet18", num_classes=1000)
    net.load_state_dict(load_torch_state(tmp_path / "out.pt"))
    assert torch.equal(net.fc.bias, m.fc.bias[1:])
    with pytest.raises(CheckpointError, match="end_point.weight"):  # forgot drop_background
        convert(tmp_path / "zoo.ckpt", tmp_path / "no.pt", num_classes=1000)
    with pytest.raises(CheckpointError, match="resnet34"):  # wrong arch names a missing tensor
        convert(tmp_path / "zoo.ckpt", tmp_path / "no.pt", arch="resnet34")
    assert not (tmp_path / "no.pt").exists()
    with pytest.raises(ConfigError, match="extension"):
        convert(tmp_path / "zoo.ckpt", tmp_path / "out.onnx")
    with pytest.raises(ConfigError, match="nothing to convert"):
        convert(tmp_path / "zoo.ckpt", tmp_path / "again.ckpt")
    with pytest.raises(ConfigError, match="drop_background"):
        convert(tmp_path / "out.pt", tmp_path / "x.ckpt", drop_background=True)
    lenet = create_model("mnist_cnn", num_classes=10, in_chans=1).state_dict()
    torch.save(lenet, tmp_path / "lenet.pt")
    assert convert(tmp_path / "lenet.pt", tmp_path / "lenet.ckpt", arch="none").mapped == list(lenet)
    assert all(torch.equal(load_mindspore_ckpt(tmp_path / "lenet.ckpt")[k], v) for k, v in lenet.items())
    torch.save({"net": torch.nn.Linear(2, 2)}, tmp_path / "pickled.pt")  # a whole module: needs unpickling
    with pytest.raises(CheckpointError, match="cannot read"):
        convert(tmp_path / "pickled.pt", tmp_path / "p.ckpt")


def test_add_background_1000_to_1001_keeps_predictions(tmp_path):
    m = randomized_resnet("resnet18", num_classes=1000).eval()
    torch.save(m.state_dict(), tmp_path / "tv.pt")
    rep = convert(tmp_path / "tv.pt", tmp_path / "zoo.ckpt", add_background=True)
    assert rep.ok
    zoo = load_mindspore_ckpt(tmp_path / "zoo.ckpt")
    assert zoo["end_point.weight"].shape == (1001, 512) and zoo["end_point.bias"].shape == (1001,)
    ms_net = create_model("resnet18", num_classes=1001).eval()  # what MindSpore's zoo network computes
    ms_net.load_state_dict(mindspore_to_torch(zoo)[0])
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        p_ms, p_tv = ms_net(x).softmax(1), m(x).softmax(1)
    assert torch.all(p_ms[:, 0] == 0)  # the background class is never predicted
    torch.testing.assert_close(p_ms[:, 1:], p_tv)  # and the 1000 real classes keep their probabilities
    back = convert(tmp_path / "zoo.ckpt", tmp_path / "back.pt", drop_background=True)  # and the way back
    assert back.ok and torch.equal(load_torch_state(tmp_path / "back.pt")["fc.weight"], m.fc.weight)
    with pytest.raises(ConfigError, match="add_background"):
        convert(tmp_path / "zoo.ckpt", tmp_path / "x.pt", add_background=True)


def test_reports_name_the_matching_torch_network():
    _, rep = mindspore_to_torch(torch_to_mindspore(randomized_resnet("resnet50", 1001).state_dict())[0],
                                drop_background=True)
    assert rep.model == {"name": "resnet50", "num_classes": 1000, "init": "mindspore", "padding": "same"}
    text = rep.summary()
    assert "torch model: create_model('resnet50', num_classes=1000, init='mindspore', padding='same')" in text
    assert ("recipe keys: --set model.name=resnet50 --set model.num_classes=1000 --set model.init=mindspore "
            "--set model.padding=same") in text
    _, rep18 = mindspore_to_torch(torch_to_mindspore(create_model("resnet18").state_dict())[0])
    assert rep18.model == {"name": "resnet18", "num_classes": 1000, "init": "mindspore"}  # res_base: torch padding
    _, back = torch_to_mindspore(create_model("resnet50").state_dict(), add_background=True)
    assert back.model["padding"] == "same" and back.model["num_classes"] == 1000


def test_convert_between_mindspore_and_paddle_goes_through_torch_names(tmp_path):
    sd = randomized_resnet("resnet18", num_classes=7).state_dict()
    save_mindspore_ckpt(tmp_path / "zoo.ckpt", torch_to_mindspore(sd)[0])
    rep = convert(tmp_path / "zoo.ckpt", tmp_path / "pd.pdparams")
    assert rep.ok and rep.arch == "resnet18"
    pd = load_pdparams(tmp_path / "pd.pdparams")
    assert torch.equal(pd["fc.weight"], sd["fc.weight"].T) and torch.equal(pd["bn1._variance"], sd["bn1.running_var"])
    convert(tmp_path / "pd.pdparams", tmp_path / "again.ckpt")
    zoo, again = load_mindspore_ckpt(tmp_path / "zoo.ckpt"), load_mindspore_ckpt(tmp_path / "again.ckpt")
    assert list(again) == list(zoo) and all(torch.equal(again[k], zoo[k]) for k in zoo)
    with pytest.raises(ConfigError, match="both files"):
        convert(tmp_path / "pd.pdparams", tmp_path / "x.pdparams")
    with pytest.raises(ConfigError, match="drop_background"):
        convert(tmp_path / "pd.pdparams", tmp_path / "x.pt", drop_background=True)
    with pytest.raises(ConfigError, match="no MindSpore name map for 'mnist_cnn'"):
        convert(tmp_path / "zoo.ckpt", tmp_path / "x.pt", arch="mnist_cnn")
    with pytest.raises(CheckpointError, match="does not convert cleanly"):
        convert(tmp_path / "pd.pdparams", tmp_path / "x.pt", arch="resnet50")
