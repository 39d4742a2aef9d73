"""One generator over the zoo: every network `create_model` knows — those timm's layouts share starting from a
timm-named weights file — trains through the CLI for an epoch on a small generated image folder, evaluates,
exports to every format, and each export gives the checkpoint's predictions. So a network cannot land again
that crashes in `train` (the memory probe builds each on the meta device) or whose .onnx `predict` refuses.

Sizes: 3 classes of 32 px RGB images, 4 each to train on and 2 to evaluate, batch 4, one thread: the network's
layers and the tool's paths are what is checked, not learning (tests/test_zoo_defaults.py measures that).
Training starts from weights whose BatchNorm layers are far from their initial state (random affine parameters,
running statistics of two noise batches; timm's fixture weights for the networks timm shares): a zero-initialised
last BatchNorm of a residual block would hide a wrongly exported branch. Every network goes the user's path: train,
export, `predict` on the .onnx against `predict` on the checkpoint. A family's first member also runs `eval`, has its
.pt2 and .ts archives run and ONNX Runtime's logits compared with torch's: how a network traces (and loads) differs
between block families, not between depths, so a sibling (SIBLINGS: the same blocks, stacked deeper or wider) exports
to ONNX only. One sibling of each family trains at 100 px instead (ResNet-34, -101, CIFAR ResNet-32, MobileNetV3-Large):
their last feature maps are larger than 1×1, which changes the ops an export holds (the allow-list test below).

Tolerance rule: an export matches when max|exported − torch| ≤ 1e-4 · max|torch| over the batch's logits (relative
to the largest logit, so a logit near zero cannot inflate the error), at batch 1 and at the 6 evaluation images
(the tracers ran 2: the batch dimension is free); the archives' probabilities within 1e-4 of `predict`'s. The seconds
each network takes (CPU time of this process) are printed; `pytest -s` shows them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

from test_timm_names import timm_state
from torchboost.cli import main
from torchboost.data import read_image
from torchboost.deploy.metadata import META_FILE, DeployInfo
from torchboost.deploy.onnxcheck import ZOO_OPS, check_graph
from torchboost.migrate.timm_names import TIMM_LAYOUTS
from torchboost.models import create_model, has_batchnorm, list_models, training_bytes
from torchboost.models.resnet import ARCHS
from torchboost.recipe.data import small_stem

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`torch.jit.(load|save)` is deprecated:DeprecationWarning")]
SIZE, TRAIN, VAL = 32, 4, 2  # px, images per class
COLOURS = ((220, 40, 40), (40, 200, 40), (40, 40, 220))
QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]
FORMATS = ("m.onnx", "m.pt2", "m.ts")
# sibling -> its family's first member, whose blocks it stacks deeper or wider: ONNX only (the archives and the logits
# comparison run on the first member)
SIBLINGS = {"resnet32": "resnet20", "resnet44": "resnet20", "resnet56": "resnet20", "resnet34": "resnet18",
            "resnet101": "resnet50", "resnet152": "resnet50", "mobilenet_v3_large": "mobilenet_v3_small",
            "airbench_wide": "airbench"}
TOL = 1e-4  # probabilities: the exports run the checkpoint's network on the same preprocessed images
LOGITS_TOL = 1e-4  # ONNX Runtime against torch, relative to the largest logit (seen: at most 1e-5)


def make_colours(root: Path, size: int = SIZE, train: int = TRAIN, val: int = VAL, noise: float = 25.0) -> Path:
    """train/ and val/ of RGB images, one colour per class with pixel noise."""
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("val", val)):
        for k, colour in enumerate(COLOURS):
            (root / split / f"c{k}").mkdir(parents=True, exist_ok=True)
            for i in range(n):
                pixels = np.clip(rng.normal(colour, noise, (size, size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels, "RGB").save(root / split / f"c{k}" / f"{i}.png")
    return root


# the siblings trained at 100 px: the ops their exports hold when the last maps are larger than 1×1 (a ResNet's
# 4×4; the CIFAR ResNet's 25×25; MobileNetV3's 4×4), their family's other members' at 32 px, where they are 1×1
AT_100 = ("resnet34", "resnet101", "resnet32", "mobilenet_v3_large")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("zoo")
    return {size: make_colours(root / str(size), size) for size in (SIZE, 100)}


def _probabilities(capsys, argv: list[str]) -> dict[str, list[float]]:
    """`predict --format json` of every class, as {file: probabilities in class order}."""
    capsys.readouterr()
    assert main(["predict", *argv, "--topk", str(len(COLOURS)), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    return {row["file"]: [p for _, p in sorted((t["class"], t["probability"]) for t in row["top"])] for row in rows}


def _archive_probabilities(path: Path, files: list[str]) -> dict[str, list[float]]:
    """What a deployer's code gets from a .pt2 or .ts archive (predict refuses them: loading runs their code),
    preprocessed as the archive records."""
    extra = {META_FILE: ""}
    if path.suffix == ".ts":
        net = torch.jit.load(str(path), _extra_files=extra)
    else:
        net = torch.export.load(path, extra_files=extra).module()
    info = DeployInfo.from_props(json.loads(extra[META_FILE]), str(path))
    with torch.no_grad():
        batch = torch.stack([read_image(f, info.transform()) for f in files])
        probs, alone = net(batch).softmax(dim=1), net(batch[:1]).softmax(dim=1)
    assert (alone - probs[:1]).abs().max() <= TOL, f"{path.name}: batch 1 differs from batch {len(files)}"
    order = sorted(range(len(info.classes)), key=lambda i: info.classes[i])
    return {f: [float(p[i]) for i in order] for f, p in zip(files, probs)}


def _onnx_logits_error(ckpt: str, onnx_path: Path, files: list[str]) -> float:
    """The largest difference between ONNX Runtime's logits and torch's (the checkpoint's network, eval mode) on the
    same preprocessed images, at batch 1 and at all of them, relative to the largest logit: the figure the README's
    export row quotes."""
    from torchboost.deploy.onnxrun import OnnxClassifier
    from torchboost.recipe.infer import model_from_weights

    onnx_model = OnnxClassifier(onnx_path, threads=1)
    try:
        batch = torch.stack([read_image(f, onnx_model.info.transform()) for f in files])
        got = [torch.as_tensor(onnx_model.logits(x.numpy())) for x in (batch[:1], batch)]
    finally:
        onnx_model.close()
    with torch.no_grad():
        want = model_from_weights(ckpt)[0].network.eval()(batch)
    return max(float((g - want[:len(g)]).abs().max() / want[:len(g)].abs().max()) for g in got)


def perturbed_state(name: str, size: int) -> dict[str, torch.Tensor]:
    """A fresh 3-class network's state with its BatchNorm layers moved off their initial values: affine parameters
    drawn at random, running statistics from two training batches of noise."""
    torch.manual_seed(0)
    kw = {"image_size": size} if name == "mnist_cnn" else {}
    if name in ARCHS:  # an ImageNet ResNet trains a 32 px image with its 3×3 stem, as `train` chooses
        kw["small_input"] = small_stem(name, size)
    net = create_model(name, len(COLOURS), 3, **kw)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
        net.train()
        for _ in range(2):
            net(torch.randn(4, 3, size, size) * 2 + 0.5)
    return net.state_dict()


def _agree(got: dict[str, list[float]], want: dict[str, list[float]], what: str) -> None:
    assert got.keys() == want.keys(), what
    worst = max(abs(a - b) for f in want for a, b in zip(got[f], want[f]))
    assert worst <= TOL, f"{what}: probabilities differ by {worst:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list_models())
def test_every_zoo_model_trains_evaluates_exports_and_predicts_the_same(name, folders, tmp_path, capsys):
    start = time.process_time()
    size = 100 if name in AT_100 else SIZE
    folder = folders[size]
    out = tmp_path / "run"
    argv = ["train", "--data", str(folder), "--set", f"model.name={name}", "--epochs", "1", "-b", "4", "-o", str(out),
            *QUIET]
    # timm's weights where timm shares the layout (renamed on load, a fresh 3-class head), else perturbed BatchNorm
    torch.save(timm_state(name) if name in TIMM_LAYOUTS else perturbed_state(name, size), tmp_path / "init.pth")
    argv += ["--set", f"train.init_weights={tmp_path / 'init.pth'}"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "final: top-1 " in capsys.readouterr().out
    ckpt = str(out / "ckpt" / f"{name}-best.pt")
    if name not in SIBLINGS:  # `eval` reads a sibling's checkpoint as its first member's (predict reads it below)
        assert main(["eval", "--checkpoint", ckpt, "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["samples"] == len(COLOURS) * VAL
    want = _probabilities(capsys, ["--checkpoint", ckpt, str(folder / "val")])
    formats = FORMATS[:1] if name in SIBLINGS else FORMATS
    assert main(["export", ckpt, *(str(tmp_path / export) for export in formats)]) == 0, capsys.readouterr().err
    ops = {node.op_type for node in onnx.load(tmp_path / "m.onnx").graph.node}
    assert ops <= ZOO_OPS, f"{name} exports to ops off the zoo's list: {sorted(ops - ZOO_OPS)}"
    _agree(_probabilities(capsys, ["--checkpoint", str(tmp_path / "m.onnx"), str(folder / "val")]), want, "onnx")
    if name in SIBLINGS:
        print(f"{name}: {time.process_time() - start:.1f} s CPU (a sibling of {SIBLINGS[name]})")
        return
    logits_error = _onnx_logits_error(ckpt, tmp_path / "m.onnx", sorted(want))
    assert logits_error <= LOGITS_TOL, f"{name}: ONNX Runtime's logits differ from torch's by {logits_error:.1e}"
    for archive in formats[1:]:
        _agree(_archive_probabilities(tmp_path / archive, sorted(want)), want, archive)
    print(f"{name}: {time.process_time() - start:.1f} s CPU; ONNX Runtime vs torch logits {logits_error:.1e} relative")


def test_every_sibling_is_a_zoo_network_built_of_its_first_members_blocks():
    """SIBLINGS' claim, checked: each sibling and its family's first member are zoo networks whose layers are of the
    same kinds (module classes), so the archives and logits checked on the first member cover the sibling's code."""
    for sibling, first in SIBLINGS.items():
        assert {sibling, first} <= set(list_models()) and first not in SIBLINGS
        with torch.device("meta"):
            kinds = [{type(m) for m in create_model(n, 3, 3).modules()} for n in (sibling, first)]
        assert kinds[0] == kinds[1], (sibling, first, kinds[0] ^ kinds[1])


# the families the generator trains at one size only (no sibling in AT_100), here at the second
FAMILIES = ("efficientnet_b0", "convnext_tiny", "regnet_y_400mf", "regnet_x_400mf", "mnist_cnn")


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_the_onnx_allow_list_holds_every_op_the_zoo_exports_to(name):
    """`onnxcheck.ZOO_OPS` is what `torchboost export` makes of the zoo's networks. Which ops a graph holds
    depends on the input size only through which feature maps come out 1×1 (pooling a 1×1 map is elided;
    ConvNeXt's average pool of a larger map is exported through Shape, Range and Gather): the generator above
    exports every network at 32 px (ConvNeXt's, MobileNet's, EfficientNet's and RegNet's last map 1×1) but one of
    each family with a sibling, at 100 px (AT_100); here the other families at 100 px, odd maps larger than 1×1
    to the end (ConvNeXt's 3×3, EfficientNet's and RegNet's 4×4)."""
    from torchboost.deploy import DeployInfo, export_program, onnx_bytes

    c = 1 if name == "mnist_cnn" else 3
    net = create_model(name, 3, c, **({"image_size": 100} if name == "mnist_cnn" else {})).eval()
    info = DeployInfo(name, ("a", "b", "c"), c, 100, 100, (0.5,) * c, (0.25,) * c, "test")
    proto = onnx.load_model_from_string(onnx_bytes(export_program(net, info), info))
    check_graph(proto, name)  # what `predict` checks first: ConvNeXt's was refused for its Shape op
    ops = {node.op_type for node in proto.graph.node}
    assert ops <= ZOO_OPS, f"{name} at 100 px exports to ops off the zoo's list: {sorted(ops - ZOO_OPS)}"


@pytest.mark.parametrize("name", list_models())
def test_the_memory_probe_builds_every_zoo_model(name):
    """`training_bytes` (a shape-only build on the meta device, before every `train`) for every network: the
    bytes of its weights, gradients and two optimizer states."""
    kw = {"image_size": SIZE} if name == "mnist_cnn" else {}
    params = sum(p.numel() * p.element_size() for p in create_model(name, 3, 3, **kw).parameters())
    assert training_bytes(name, 3, 3, **kw) == 4 * params
    with torch.device("meta"):
        batchnorm = any(isinstance(m, torch.nn.BatchNorm2d) for m in create_model(name, 3, 3, **kw).modules())
    assert has_batchnorm(name) == batchnorm  # what train's and race's batch advice assume of it
