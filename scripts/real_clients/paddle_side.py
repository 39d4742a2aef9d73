"""PaddlePaddle side of the real-client migration checks; runs in a PaddlePaddle 3.3.1 venv, never in the
project's.

    python paddle_side.py export ARCH CLASSES SIZE PROTOCOL OUT_DIR  # -> OUT_DIR/{net.pdparams,x.npy,out.npy}
    python paddle_side.py outputs ARCH CLASSES PARAMS X.npy OUT.npy  # load a .pdparams strictly, write outputs
    python paddle_side.py keys OUT.json                              # paddle.vision ResNet state-dict layouts

ARCH: resnet18..resnet152 (paddle.vision.models) or mnist_cnn (the beginner tutorial's MNIST class, whose
forward ends in softmax: its outputs are probabilities). PROTOCOL 4 is paddle.save's default (Paddle 2.x/3.x);
2 is what Paddle 1.x fluid.save_dygraph wrote. BN statistics are randomised so a mis-mapped BN shows.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

paddle.set_device("cpu")


class MNIST(nn.Layer):
    """The tutorial network: conv 20@5x5 pad 2, max-pool 2, twice, then Linear(980, 10) and softmax."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2D(in_channels=1, out_channels=20, kernel_size=5, stride=1, padding=2)
        self.max_pool1 = nn.MaxPool2D(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2D(in_channels=20, out_channels=20, kernel_size=5, stride=1, padding=2)
        self.max_pool2 = nn.MaxPool2D(kernel_size=2, stride=2)
        self.fc = nn.Linear(in_features=980, out_features=classes)

    def forward(self, inputs):
        x = self.max_pool1(F.relu(self.conv1(inputs)))
        x = self.max_pool2(F.relu(self.conv2(x)))
        x = paddle.reshape(x, [x.shape[0], 980])
        return F.softmax(self.fc(x))


def build(arch: str, classes: int) -> nn.Layer:
    if arch == "mnist_cnn":
        return MNIST(classes)
    return getattr(paddle.vision.models, arch)(num_classes=classes)


def randomize(net: nn.Layer, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for name, t in net.state_dict().items():
        shape = t.shape
        if name.endswith("_mean") or (name.endswith("bias") and len(shape) == 1):
            v = rng.uniform(-0.1, 0.1, shape)
        elif name.endswith("_variance"):
            v = rng.uniform(0.5, 1.5, shape)
        elif len(shape) == 1:  # BN weight
            v = rng.uniform(0.5, 1.0, shape)
        else:  # conv [out, in, k, k] / linear [in, out]: variance-preserving
            fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
            v = rng.normal(0, np.sqrt(1.0 / fan_in), shape)
        t.set_value(v.astype(np.float32))


def outputs(net: nn.Layer, x: np.ndarray) -> np.ndarray:
    net.eval()
    with paddle.no_grad():
        return net(paddle.to_tensor(x)).numpy()


def main() -> None:
    cmd = sys.argv[1]
    if cmd == "keys":
        layouts = {a: [[k, list(v.shape)] for k, v in build(a, 1000).state_dict().items()]
                   for a in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")}
        with open(sys.argv[2], "w") as f:
            json.dump(layouts, f, separators=(",", ":"))
        return
    arch, classes = sys.argv[2], int(sys.argv[3])
    net = build(arch, classes)
    if cmd == "export":
        size, protocol, out = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        randomize(net)
        chans = 1 if arch == "mnist_cnn" else 3
        x = np.random.default_rng(1).standard_normal((2, chans, size, size)).astype(np.float32)
        paddle.save(net.state_dict(), f"{out}/net.pdparams", protocol=protocol)
        np.save(f"{out}/x.npy", x)
        np.save(f"{out}/out.npy", outputs(net, x))
    elif cmd == "outputs":
        params, xfile, out = sys.argv[4], sys.argv[5], sys.argv[6]
        state = paddle.load(params)
        want = net.state_dict()
        if set(state) != set(want) or any(list(state[k].shape) != list(want[k].shape) for k in want):
            raise SystemExit(f"{params} does not fit paddle {arch}: {sorted(set(state) ^ set(want))[:5]}")
        net.set_state_dict(state)
        np.save(out, outputs(net, np.load(xfile)))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
