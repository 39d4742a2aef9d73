"""Weight-name maps between PaddlePaddle and torchboost/torchvision.

paddle.vision ResNet-18..152 uses torchvision's module names; only two things differ:
    bn*.{_mean,_variance}     <-> bn*.{running_mean,running_var}   (weight/bias keep their names)
    fc.weight  [in, out]      <-> fc.weight [out, in]               (paddle.nn.Linear stores x @ W)
    (none)                    <- bn*.num_batches_tracked            (filled with 0 / dropped)
The beginner tutorial's MNIST CNN (`conv1`, `conv2`, `fc`) is torchboost's `mnist_cnn` with the same
rule for `fc`. Every layout is derived from the real torchboost model on the meta device.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from torchboost.errors import ConfigError
from torchboost.migrate.names import MappingReport, detect_arch
from torchboost.models import create_model
from torchboost.models.resnet import ARCHS

PADDLE_ARCHS = (*ARCHS, "mnist_cnn")
BN_TO_PADDLE = {"weight": "weight", "bias": "bias", "running_mean": "_mean", "running_var": "_variance"}
TRANSPOSED = ("fc.weight",)  # paddle.nn.Linear weights are [in, out]


def _model_kwargs(arch: str, shapes: dict[str, tuple[int, ...]], num_classes: int | None) -> dict:
    """create_model keywords that give the source network's shapes; `shapes` in Paddle's orientation."""
    fc = shapes.get("fc.weight")
    fc_in, classes = fc if fc is not None and len(fc) == 2 else (0, 1000)
    classes = num_classes or classes
    if arch != "mnist_cnn":
        return {"num_classes": classes}
    conv1 = shapes.get("conv1.weight")
    side = math.isqrt(fc_in // 20) if fc_in else 7  # fc sees 20 channels of (image_size // 4)^2
    return {"num_classes": classes, "in_chans": conv1[1] if conv1 and len(conv1) == 4 else 1,
            "image_size": 4 * side}


@functools.lru_cache(maxsize=16)
def paddle_layout(arch: str, kwargs: tuple) -> tuple[tuple[str, str | None, tuple[int, ...]], ...]:
    """(torch name, paddle name or None, torch shape) for every state-dict entry of `arch` built with
    `kwargs`, the sorted create_model keyword items (a tuple, so the result can be cached)."""
    if arch not in PADDLE_ARCHS:
        raise ConfigError(f"no PaddlePaddle name map for {arch!r}", f"use one of {', '.join(PADDLE_ARCHS)}")
    with torch.device("meta"):
        model = create_model(arch, **dict(kwargs))
    bns = {n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    rows = []
    for name, t in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        paddle = name
        if module in bns:
            paddle = f"{module}.{BN_TO_PADDLE[leaf]}" if leaf in BN_TO_PADDLE else None
        rows.append((name, paddle, tuple(t.shape)))
    return tuple(rows)


def detect_paddle_arch(names: list[str]) -> str:
    """mnist_cnn for the tutorial CNN's names, else the ResNet the blocks per stage give."""
    if {"conv1.weight", "conv2.weight", "fc.weight"} <= set(names) and not any(n.startswith("layer") for n in names):
        return "mnist_cnn"
    return detect_arch(names)


def paddle_to_torch(state: dict[str, torch.Tensor], arch: str | None = None, num_classes: int | None = None
                    ) -> tuple[dict[str, torch.Tensor], MappingReport]:
    """Rename a paddle.vision ResNet / tutorial MNIST CNN state to torchboost names; (state, report).
    num_classes (default: from fc) is what the target model must have."""
    arch = arch or detect_paddle_arch(list(state))
    kwargs = _model_kwargs(arch, {k: tuple(v.shape) for k, v in state.items()}, num_classes)
    rows = paddle_layout(arch, tuple(sorted(kwargs.items())))
    lookup = {pd: (tn, shape) for tn, pd, shape in rows if pd is not None}
    report, got = MappingReport(arch=arch, model={"name": arch, **kwargs}), {}
    for key, t in state.items():
        if key not in lookup:
            report.unmapped.append(key)
            continue
        name, shape = lookup[key]
        if name in TRANSPOSED and t.dim() == 2:
            t = t.T.contiguous()
        if tuple(t.shape) != shape:
            report.mismatched.append((key, tuple(state[key].shape), shape[::-1] if name in TRANSPOSED else shape))
            continue
        got[name] = t
    out = {}
    for name, pd, _ in rows:
        if pd is None:
            out[name] = torch.zeros((), dtype=torch.int64)
            report.filled.append(name)
        elif name in got:
            out[name] = got[name]
            report.mapped.append(name)
        else:
            report.missing.append(name)
    if arch == "mnist_cnn":
        report.notes.append("the tutorial's MNIST model applies softmax inside forward; torchboost's returns "
                            "logits (apply softmax to compare probabilities; argmax is the same)")
    return out, report


def torch_to_paddle(state: dict[str, torch.Tensor], arch: str | None = None, num_classes: int | None = None
                    ) -> tuple[dict[str, torch.Tensor], MappingReport]:
    """Rename a torchboost/torchvision state dict to paddle.vision / tutorial names; (state, report).
    num_batches_tracked counters are dropped (reported as skipped)."""
    arch = arch or detect_paddle_arch(list(state))
    kwargs = _model_kwargs(arch, {k: tuple(v.shape)[::-1] if k in TRANSPOSED else tuple(v.shape)
                                  for k, v in state.items()}, num_classes)
    rows = paddle_layout(arch, tuple(sorted(kwargs.items())))
    lookup = {tn: (pd, shape) for tn, pd, shape in rows}
    report, got = MappingReport(arch=arch, model={"name": arch, **kwargs}), {}
    for key, t in state.items():
        if key not in lookup:
            report.unmapped.append(key)
            continue
        pd, shape = lookup[key]
        if pd is None:
            report.skipped.append(key)
        elif tuple(t.shape) != shape:
            report.mismatched.append((key, tuple(t.shape), shape))
        else:
            got[pd] = t.T.contiguous() if key in TRANSPOSED else t
            report.mapped.append(key)
    report.missing = [tn for tn, pd, _ in rows if pd is not None and pd not in got]
    return got, report

