"""timm's weight names for the zoo networks whose layout is torchvision's, mapped to torchboost's (torchvision's).

timm cannot be imported here (it imports torchvision, whose wheels fail beside the pinned CPU torch), so a timm
state dict is renamed by rules, written from timm's model code and checked against it: tests/fixtures/timm_zoo.json
holds what timm's own modules give for fixed weights (scripts/make_timm_fixtures.py), and
tests/test_timm_names.py loads the renamed weights strictly and compares the logits.

- ConvNeXt (`convnext_tiny`): `stem.{0,1}` -> `features.0.{0,1}`; `stages.S.downsample.{0,1}` ->
  `features.2S.{0,1}`; `stages.S.blocks.B.{conv_dw,norm,mlp.fc1,mlp.fc2}` -> `features.(2S+1).B.block.{0,2,3,5}`,
  its `gamma` (C) -> `layer_scale` (C×1×1); `head.{norm,fc}` -> `classifier.{0,2}`.
- EfficientNet-B0 and MobileNetV3 (`efficientnet_b0`, `mobilenetv3_{large,small}_100`): `conv_stem`/`bn1` ->
  `features.0.{0,1}`; block `blocks.S.B` -> `features.(S+1).B` (EfficientNet's stages) or `features.K` (MobileNetV3's
  flat list, K counting blocks in order from 1); inside a block its units in timm's order — depthwise-separable:
  dw (`conv_dw`, `bn1`), SE, pw (`conv_pw`, `bn2`); inverted residual: pw (`conv_pw`, `bn1`), dw (`conv_dw`,
  `bn2`), SE, pwl (`conv_pwl`, `bn3`) — are `block.0`, `block.1`, … (a conv unit's conv `.0`, its BatchNorm `.1`;
  SE's `conv_reduce`/`conv_expand` -> `fc1`/`fc2`); a conv-BN-act block (`conv`, `bn1`) -> `features.K.{0,1}`.
  EfficientNet's `conv_head`/`bn2` -> the last `features.N.{0,1}`, `classifier` -> `classifier.1`; MobileNetV3's
  `conv_head` (1×1 conv, C×960×1×1) -> `classifier.0` (Linear, C×960), `classifier` -> `classifier.3`.
- RegNetY-400MF (`regnety_004`): `stem.{conv,bn}` -> `stem.{0,1}`; `sS.bB.{conv1,conv2,conv3}.{conv,bn}` ->
  `trunk_output.blockS.blockS-(B-1).f.{a,b,c}.{0,1}`, `.se.fc{1,2}` -> `.f.se.fc{1,2}`, `.downsample.{conv,bn}` ->
  `.proj.{0,1}`; `head.fc` -> `fc`.

Not mapped, because the layouts differ: timm's `regnetx_004` (other widths and groups than torchvision's
`regnet_x_400mf`), and every family timm has and the zoo does not. timm's MobileNetV3 and EfficientNet
BatchNorm eps (1e-5) vs torchvision's MobileNetV3 (1e-3): the weights load exactly; the logits then differ by what
that eps changes (measured in the test).
"""

from __future__ import annotations

import re

import torch

State = dict[str, torch.Tensor]
CONV_UNITS = {"conv_dw", "conv_pw", "conv_pwl"}


def _convnext(name: str) -> tuple[str, bool] | None:
    """(torchvision name, reshape) of one ConvNeXt tensor."""
    if m := re.fullmatch(r"stem\.([01])\.(\w+)", name):
        return f"features.0.{m[1]}.{m[2]}", False
    if m := re.fullmatch(r"stages\.(\d+)\.downsample\.([01])\.(\w+)", name):
        return f"features.{2 * int(m[1])}.{m[2]}.{m[3]}", False
    if m := re.fullmatch(r"stages\.(\d+)\.blocks\.(\d+)\.(.+)", name):
        where = f"features.{2 * int(m[1]) + 1}.{m[2]}"
        if m[3] == "gamma":
            return f"{where}.layer_scale", True
        part = {"conv_dw": 0, "norm": 2, "mlp.fc1": 3, "mlp.fc2": 5}
        module, _, leaf = m[3].rpartition(".")
        return (f"{where}.block.{part[module]}.{leaf}", False) if module in part else None
    if m := re.fullmatch(r"head\.(norm|fc)\.(\w+)", name):
        return f"classifier.{0 if m[1] == 'norm' else 2}.{m[2]}", False
    return None


def _block_units(keys: list[str]) -> list[str]:
    """A timm MBConv-family block's units in its forward order, from the module names its tensors have."""
    modules = {k.split(".")[0] for k in keys}
    if "conv_pwl" in modules:  # inverted residual
        order = ["conv_pw", "conv_dw", "se", "conv_pwl"]
    else:  # depthwise-separable
        order = ["conv_dw", "se", "conv_pw"]
    return [u for u in order if u in modules]


def _mbconv(state: State, flat: bool) -> dict[str, tuple[str, bool]] | None:
    """Names for EfficientNet (`flat` False: stages kept) and MobileNetV3 (`flat`: one list of blocks)."""
    blocks: dict[tuple[int, int], list[str]] = {}
    for name in state:
        if m := re.fullmatch(r"blocks\.(\d+)\.(\d+)\.(.+)", name):
            blocks.setdefault((int(m[1]), int(m[2])), []).append(m[3])
    if not blocks:
        return None
    out: dict[str, tuple[str, bool]] = {}
    for k, ((s, b), keys) in enumerate(sorted(blocks.items())):
        where = f"features.{k + 1}" if flat else f"features.{s + 1}.{b}"
        units = _block_units(keys)
        if not units:  # conv-BN-act: conv, bn1 (any other name stays unmapped, so nothing is)
            for key in keys:
                module, _, leaf = key.partition(".")
                if module in ("conv", "bn1"):
                    out[f"blocks.{s}.{b}.{key}"] = (f"{where}.{0 if module == 'conv' else 1}.{leaf}", False)
            continue
        # which BatchNorm follows which conv: timm numbers them in the block's forward order
        convs = [u for u in units if u in CONV_UNITS]
        bns = {f"bn{i + 1}": conv for i, conv in enumerate(convs)}
        for key in keys:
            module, _, leaf = key.partition(".")
            if module == "se":
                sub, _, leaf = leaf.partition(".")
                fc = {"conv_reduce": "fc1", "conv_expand": "fc2"}.get(sub)
                if fc is not None:
                    out[f"blocks.{s}.{b}.{key}"] = (f"{where}.block.{units.index('se')}.{fc}.{leaf}", False)
            elif module in CONV_UNITS:
                out[f"blocks.{s}.{b}.{key}"] = (f"{where}.block.{units.index(module)}.0.{leaf}", False)
            elif module in bns:
                out[f"blocks.{s}.{b}.{key}"] = (f"{where}.block.{units.index(bns[module])}.1.{leaf}", False)
    last = len(blocks) + 1 if flat else max(s for s, _ in blocks) + 2
    for name in state:
        if name.startswith("blocks."):
            continue
        module, _, leaf = name.partition(".")
        if module == "conv_stem":
            out[name] = (f"features.0.0.{leaf}", False)
        elif module == "bn1":
            out[name] = (f"features.0.1.{leaf}", False)
        elif module == "conv_head":
            out[name] = (f"classifier.0.{leaf}", True) if flat else (f"features.{last}.0.{leaf}", False)
        elif module == "bn2" and not flat:
            out[name] = (f"features.{last}.1.{leaf}", False)
        elif module == "classifier":
            out[name] = (f"classifier.{3 if flat else 1}.{leaf}", False)
    return out


def _regnet(name: str) -> tuple[str, bool] | None:
    if m := re.fullmatch(r"stem\.(conv|bn)\.(\w+)", name):
        return f"stem.{0 if m[1] == 'conv' else 1}.{m[2]}", False
    if m := re.fullmatch(r"s(\d+)\.b(\d+)\.(.+)", name):
        where = f"trunk_output.block{m[1]}.block{m[1]}-{int(m[2]) - 1}"
        if c := re.fullmatch(r"conv([123])\.(conv|bn)\.(\w+)", m[3]):
            return f"{where}.f.{'abc'[int(c[1]) - 1]}.{0 if c[2] == 'conv' else 1}.{c[3]}", False
        if c := re.fullmatch(r"se\.(fc[12])\.(\w+)", m[3]):
            return f"{where}.f.se.{c[1]}.{c[2]}", False
        if c := re.fullmatch(r"downsample\.(conv|bn)\.(\w+)", m[3]):
            return f"{where}.proj.{0 if c[1] == 'conv' else 1}.{c[2]}", False
        return None
    if m := re.fullmatch(r"head\.fc\.(\w+)", name):
        return f"fc.{m[1]}", False
    return None


# torchboost architecture -> how its timm counterpart's names map
TIMM_LAYOUTS = {"convnext_tiny": "convnext_tiny", "efficientnet_b0": "efficientnet_b0",
                "mobilenet_v3_large": "mobilenetv3_large_100", "mobilenet_v3_small": "mobilenetv3_small_100",
                "regnet_y_400mf": "regnety_004"}


def from_timm(state: State, arch: str | None, network: dict[str, torch.Tensor]) -> State | None:
    """`state` renamed from timm's names to `network`'s (the torchvision layout of `arch`), or None when `arch`
    has no timm counterpart with its layout or `state` is not every tensor of that counterpart: every name
    mapped, every network tensor given once, every shape equal (a 1×1 conv head read as a Linear, a ConvNeXt
    layer scale as C×1×1) but the classifier's, whose class count may differ (a fresh head for fine-tuning:
    `load_backbone` decides)."""
    if arch not in TIMM_LAYOUTS:
        return None
    if arch.startswith(("efficientnet", "mobilenet")):
        names = _mbconv(state, flat=arch.startswith("mobilenet"))
    else:
        rule = _convnext if arch.startswith("convnext") else _regnet
        names = {}
        for name in state:
            if (target := rule(name)) is not None:
                names[name] = target
    if not names or set(names) != set(state):
        return None
    out: State = {}
    head = list(network)[-2:]  # the classifier's weight and bias: every zoo network ends with them
    for name, (target, reshape) in names.items():
        want = network.get(target)
        if want is None or target in out:
            return None
        tensor = state[name]
        if reshape:  # C -> C×1×1, or a classifier's O×I×1×1 -> O×I: only ones added or taken away, checked first
            # (a 4-D conv_head of 3×3 kernels made reshape raise)
            if tensor.ndim == 0 or [d for d in tensor.shape[1:] if d != 1] != [d for d in want.shape[1:] if d != 1]:
                return None
            tensor = tensor.reshape(tensor.shape[0], *want.shape[1:])
        if tensor.shape != want.shape and not (target in head and tensor.shape[1:] == want.shape[1:]):
            return None
        out[target] = tensor
    return out if out.keys() == network.keys() else None
