"""MindSpore side of the real-client migration checks; runs in a MindSpore 2.10 venv (numpy<2), never in
the project's.

    python mindspore_side.py export ARCH CLASSES SIZE OUT_DIR   # zoo-style net -> OUT_DIR/{net.ckpt,x.npy,logits.npy}
    python mindspore_side.py logits ARCH CLASSES CKPT X.npy OUT.npy   # load a .ckpt strictly, write logits

ARCH: resnet18/resnet50 (the model-zoo structure: official/cv/ResNet/src/resnet.py, res_base for 18,
pad_mode='same' for 50) or "tiny" (the zoo stem + one strided bottleneck at small width, for the CI
fixture). BN statistics are randomised so a wrong eps or a mis-mapped BN shows in the logits.
"""

from __future__ import annotations

import sys

import mindspore as ms
import numpy as np
from mindspore import nn, ops

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


def conv(cin, cout, k, stride=1, res_base=False):
    if res_base:
        return nn.Conv2d(cin, cout, k, stride=stride, pad_mode="pad", padding=k // 2, has_bias=False)
    return nn.Conv2d(cin, cout, k, stride=stride, pad_mode="same", has_bias=False)


def bn(c, res_base=False):
    return nn.BatchNorm2d(c, eps=1e-5 if res_base else 1e-4, momentum=0.1 if res_base else 0.9)


class Bottleneck(nn.Cell):
    """The zoo's ResidualBlock (v1.5: stride on the 3x3 conv)."""

    def __init__(self, cin, cout, stride=1, expansion=4):
        super().__init__()
        mid = cout // expansion
        self.conv1, self.bn1 = conv(cin, mid, 1), bn(mid)
        self.conv2, self.bn2 = conv(mid, mid, 3, stride), bn(mid)
        self.conv3, self.bn3 = conv(mid, cout, 1), bn(cout)
        self.relu = nn.ReLU()
        self.down_sample = stride != 1 or cin != cout
        if self.down_sample:
            self.down_sample_layer = nn.SequentialCell([conv(cin, cout, 1, stride), bn(cout)])

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = self.down_sample_layer(x) if self.down_sample else x
        return self.relu(out + identity)


class BasicBlock(nn.Cell):
    """The zoo's ResidualBlockBase (res_base: explicit padding, bn1d/bn2d)."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1, self.bn1d = conv(cin, cout, 3, stride, True), bn(cout)
        self.conv2, self.bn2d = conv(cout, cout, 3, 1, True), bn(cout)
        self.relu = nn.ReLU()
        self.down_sample = stride != 1 or cin != cout
        if self.down_sample:
            self.down_sample_layer = nn.SequentialCell([conv(cin, cout, 1, stride, True), bn(cout, True)])

    def construct(self, x):
        out = self.relu(self.bn1d(self.conv1(x)))
        out = self.bn2d(self.conv2(out))
        identity = self.down_sample_layer(x) if self.down_sample else x
        return self.relu(out + identity)


class ZooResNet(nn.Cell):
    def __init__(self, block, layers, ins, outs, classes, res_base, stem=64):
        super().__init__()
        self.res_base = res_base
        self.conv1, self.bn1 = conv(3, stem, 7, 2, res_base), bn(stem, res_base)
        self.relu = nn.ReLU()
        if res_base:
            self.pad = nn.Pad(paddings=((0, 0), (0, 0), (1, 1), (1, 1)))
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="valid")
        else:
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same")
        stages = []
        for i, (n, cin, cout) in enumerate(zip(layers, ins, outs)):
            blocks = [block(cin, cout, 1 if i == 0 else 2)] + [block(cout, cout) for _ in range(1, n)]
            stages.append(nn.SequentialCell(blocks))
        self.layers = len(stages)
        for i, s in enumerate(stages, start=1):
            setattr(self, f"layer{i}", s)
        self.mean = ops.ReduceMean(keep_dims=True)
        self.flatten = nn.Flatten()
        self.end_point = nn.Dense(outs[-1], classes)

    def construct(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        if self.res_base:
            x = self.pad(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        if self.layers > 1:
            x = self.layer4(self.layer3(self.layer2(x)))
        return self.end_point(self.flatten(self.mean(x, (2, 3))))


def build(arch: str, classes: int) -> nn.Cell:
    if arch == "resnet18":
        return ZooResNet(BasicBlock, [2, 2, 2, 2], [64, 64, 128, 256], [64, 128, 256, 512], classes, True)
    if arch == "resnet50":
        return ZooResNet(Bottleneck, [3, 4, 6, 3], [64, 256, 512, 1024], [256, 512, 1024, 2048], classes, False)
    if arch == "tiny":  # stem 8 channels, then one stride-2 bottleneck 8 -> 16
        net = ZooResNet(Bottleneck, [1], [8], [16], classes, False, stem=8)
        net.layer1 = nn.SequentialCell([Bottleneck(8, 16, 2)])
        return net
    raise SystemExit(f"unknown arch {arch}")


def randomize(net: nn.Cell, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        shape = p.data.shape
        if p.name.endswith("moving_mean") or p.name.endswith("beta"):
            v = rng.uniform(-0.1, 0.1, shape)
        elif p.name.endswith("moving_variance"):
            v = rng.uniform(0.5, 1.5, shape)
        elif p.name.endswith("gamma"):
            v = rng.uniform(0.5, 1.0, shape)
        elif p.name.endswith("bias"):
            v = rng.uniform(-0.1, 0.1, shape)
        else:  # conv/dense weights: variance-preserving so 50 layers keep a useful signal
            fan_in = int(np.prod(shape[1:]))
            v = rng.normal(0, np.sqrt(1.0 / fan_in), shape)
        p.set_data(ms.Tensor(v.astype(np.float32)))


def logits(net: nn.Cell, x: np.ndarray) -> np.ndarray:
    net.set_train(False)
    return net(ms.Tensor(x)).asnumpy()


def main() -> None:
    cmd, arch, classes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    net = build(arch, classes)
    if cmd == "export":
        size, out = sys.argv[4], sys.argv[5]
        h, w = (int(v) for v in size.split("x")) if "x" in size else (int(size), int(size))
        randomize(net)
        x = np.random.default_rng(1).standard_normal((2, 3, h, w)).astype(np.float32)
        ms.save_checkpoint(net, f"{out}/net.ckpt")
        np.save(f"{out}/x.npy", x)
        np.save(f"{out}/logits.npy", logits(net, x))
    elif cmd == "logits":
        ckpt, xfile, out = sys.argv[4], sys.argv[5], sys.argv[6]
        not_loaded, unused = ms.load_param_into_net(net, ms.load_checkpoint(ckpt), strict_load=True)
        if not_loaded or unused:
            raise SystemExit(f"checkpoint does not fit the zoo network: not loaded {not_loaded}, unused {unused}")
        np.save(out, logits(net, np.load(xfile)))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
