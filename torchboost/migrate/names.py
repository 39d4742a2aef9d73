"""Weight-name maps between MindSpore model-zoo ResNets and torchvision / torchboost ResNets.

torchboost's ResNet state dict is torchvision's, name for name (tests/test_models.py), so one map serves
both. Zoo (official/cv/ResNet/src/resnet.py) -> torchvision:
    conv1.weight                         -> conv1.weight
    bn1.{gamma,beta,moving_mean,moving_variance}
                                         -> bn1.{weight,bias,running_mean,running_var}
    layerN.i.conv{1,2,3}.weight          -> same name
    layerN.i.bn{1,2,3}.*  (ResNet-50/101/152 ResidualBlock)
    layerN.i.bn{1,2}d.*   (ResNet-18/34 ResidualBlockBase; "bn1"/"bn2" also accepted on import)
                                         -> layerN.i.bn{1,2,3}.*
    layerN.0.down_sample_layer.{0,1}.*   -> layerN.0.downsample.{0,1}.*
    end_point.{weight,bias}              -> fc.{weight,bias}   (Dense and Linear are both out x in)
    (none)                               <- bn*.num_batches_tracked (MindSpore has no counter: filled with 0)
`moments.<name>` entries are Momentum's velocity; they equal torch SGD's `momentum_buffer` (dampening 0,
no Nesterov) and are converted only on request, renamed `moments.<torch name>`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from torchboost.errors import CheckpointError, ConfigError, printable
from torchboost.models import create_model
from torchboost.models.resnet import ARCHS, Bottleneck

BN_TO_MS = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
# Training-loop state MindSpore saves next to the weights (optimizer slots, loss scale, counters, THOR's
# per-layer inverse factors); never part of the model, so skipped rather than reported as unmapped.
TRAINING_STATE = re.compile(r"^(moments|accu_grads|adam_m|adam_v)\.|\.matrix_\w+$|(^|\.)(learning_rate|"
                            r"global_step|momentum|scale_sense|current_iterator_step|"
                            r"last_overflow_iterator_step|epoch_num|step_num|random_op)$")


@dataclass
class MappingReport:
    """What a conversion did. `ok` means the target layout is complete and nothing was left unexplained."""

    arch: str
    mapped: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)  # source entries with no place in the target
    missing: list[str] = field(default_factory=list)  # target entries no source entry provided
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # (source name, got, expected)
    skipped: list[str] = field(default_factory=list)  # optimizer/training state and dropped counters
    filled: list[str] = field(default_factory=list)  # num_batches_tracked set to 0
    notes: list[str] = field(default_factory=list)
    model: dict | None = None  # create_model keywords (name first) that rebuild the source network

    @property
    def ok(self) -> bool:
        return not (self.unmapped or self.missing or self.mismatched)

    def first_problem(self) -> str | None:
        if self.mismatched:
            name, got, want = self.mismatched[0]
            return f"tensor {name} has shape {list(got)}, {self.arch} expects {list(want)}"
        if self.missing:
            return f"no tensor for {self.missing[0]} ({len(self.missing)} missing)"
        if self.unmapped:
            return f"tensor {self.unmapped[0]} has no place in {self.arch} ({len(self.unmapped)} unmapped)"
        return None

    def summary(self) -> str:
        def few(names: list) -> str:
            return ", ".join(map(printable, names[:5])) + (f", ... (+{len(names) - 5})" if len(names) > 5 else "")
        lines = [f"{self.arch}: mapped {len(self.mapped)} tensors"]
        for label, items in (("filled with 0", self.filled), ("skipped", self.skipped),
                             ("UNMAPPED", self.unmapped), ("MISSING", self.missing),
                             ("SHAPE MISMATCH", [f"{n} {list(g)} vs {list(w)}" for n, g, w in self.mismatched])):
            if items:
                lines.append(f"{label} ({len(items)}): {few(items)}")
        lines += [f"note: {n}" for n in self.notes]
        if self.model:
            lines += rebuild_lines(self.model)
        return "\n".join(lines)


# create_model keyword -> recipe key (mnist_cnn takes its image size from the data section)
RECIPE_KEYS = {"name": "model.name", "num_classes": "model.num_classes", "in_chans": "model.in_chans",
               "init": "model.init", "padding": "model.padding", "image_size": "data.image_size"}


def rebuild_lines(model: dict) -> list[str]:
    """The create_model call and recipe overrides of the torch network that computes what the other
    framework's network computes (for either direction of a conversion)."""
    kw = {k: v for k, v in model.items() if k != "name"}
    call = ", ".join([repr(model["name"]), *(f"{k}={v!r}" for k, v in kw.items())])
    sets = " ".join(f"--set {RECIPE_KEYS[k]}={v}" for k, v in model.items())
    return [f"torch model: create_model({call})", f"recipe keys: {sets}"]


def check_arch(arch: str) -> None:
    """MindSpore zoo names are mapped for the ResNets; other networks convert with their torch names."""
    if arch not in ARCHS:
        raise ConfigError(f"no MindSpore name map for {arch!r} (maps exist for {', '.join(ARCHS)})",
                          "convert with --arch none to write the tensors under their torch names")


@functools.lru_cache(maxsize=16)
def layout(arch: str, num_classes: int = 1000) -> tuple[tuple[str, str | None, tuple[int, ...]], ...]:
    """(torch name, MindSpore name or None, shape) for every state-dict entry of `arch`, in order.

    Derived from the real torchboost model built on the meta device (no memory, no init cost), so the map
    can never drift from the model.
    """
    check_arch(arch)
    with torch.device("meta"):
        model = create_model(arch, num_classes=num_classes)
    bns = {n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    basic = ARCHS[arch][0] is not Bottleneck
    rows = []
    for name, t in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        ms = None
        if module == "fc":
            ms = f"end_point.{leaf}"
        elif module in bns and leaf in BN_TO_MS:
            ms_module = module + "d" if basic and re.fullmatch(r"layer\d\.\d+\.bn[12]", module) else module
            ms = f"{ms_module}.{BN_TO_MS[leaf]}"
        elif module not in bns:
            ms = name
        if ms is not None:
            ms = ms.replace(".downsample.", ".down_sample_layer.")
        rows.append((name, ms, tuple(t.shape)))
    return tuple(rows)


def detect_arch(names: Iterable[str]) -> str:
    """Tell which ResNet a set of weight names (either convention) belongs to, from blocks per stage."""
    blocks, bottleneck = [0, 0, 0, 0], False
    for n in names:
        m = re.match(r"(?:moments\.)?layer([1-4])\.(\d+)\.(conv3)?", n)
        if m:
            blocks[int(m[1]) - 1] = max(blocks[int(m[1]) - 1], int(m[2]) + 1)
            bottleneck |= m[3] is not None
    for arch, (block, layers) in ARCHS.items():
        if layers == blocks and (block is Bottleneck) == bottleneck:
            return arch
    raise ConfigError(f"these weights are not a ResNet the MindSpore name map knows (blocks per stage {blocks})",
                      f"pass --arch (one of {', '.join(ARCHS)}), or --arch none to keep the torch names "
                      "(e.g. for mnist_cnn)")


def zoo_model(arch: str, num_classes: int) -> dict:
    """create_model keywords of the zoo network: its BN eps (init="mindspore") and, for ResNet-50/101/152,
    pad_mode='same' (ResNet-18/34 use res_base's explicit symmetric padding, torch's)."""
    kw = {"name": arch, "num_classes": num_classes, "init": "mindspore"}
    if ARCHS[arch][0] is Bottleneck:
        kw["padding"] = "same"
    return kw


def mindspore_notes(arch: str) -> list[str]:
    """Differences between the zoo network and a default torchboost one that renaming cannot fix."""
    if ARCHS[arch][0] is Bottleneck:
        return ["the zoo network uses BatchNorm eps 1e-4 and pad_mode='same' (its stride-2 layers pad the extra "
                "pixel bottom/right only): build the torch model with init='mindspore', padding='same' (below) "
                "or the logits differ (6e-2 to 8e-2 relative measured on ResNet-50)",
                "zoo recipes use 1001 classes with class 0 = background; pass drop_background to get 1000"]
    return ["MindSpore zoo ResNet-18/34 BatchNorm: eps 1e-4 in the blocks but 1e-5 in the stem and "
            "downsample BNs (torch: 1e-5 everywhere; init='mindspore' reproduces it); the stem/downsample "
            "BNs use MindSpore momentum 0.1 = torch momentum 0.9, which only affects further training",
            "ResNet-18/34 use explicit symmetric padding (res_base), so padding matches torch"]


def _classes(state: dict, key: str, minus: int = 0) -> int:
    return state[key].shape[0] - minus if key in state and state[key].dim() >= 1 else 1000


def mindspore_to_torch(state: dict[str, torch.Tensor], arch: str | None = None, num_classes: int | None = None,
                       drop_background: bool = False, convert_moments: bool = False
                       ) -> tuple[dict[str, torch.Tensor], MappingReport]:
    """Rename a MindSpore zoo ResNet state to torchvision names; returns (state_dict, report).

    drop_background removes row 0 (MindSpore's background class) of end_point: 1001 -> 1000 classes.
    num_batches_tracked entries are filled with 0 so the result loads with strict=True.
    """
    arch = arch or detect_arch(state)
    check_arch(arch)
    num_classes = num_classes or _classes(state, "end_point.weight", int(drop_background))
    rows = layout(arch, num_classes)
    lookup = {ms: (tn, shape) for tn, ms, shape in rows if ms is not None}
    for ms in list(lookup):  # the "bn1"/"bn2" spelling some ports use for the basic block's bn1d/bn2d
        if re.search(r"\.bn[12]d\.", ms):
            lookup[re.sub(r"\.bn([12])d\.", r".bn\1.", ms)] = lookup[ms]
    report, got = MappingReport(arch=arch, notes=mindspore_notes(arch), model=zoo_model(arch, num_classes)), {}
    for key, t in state.items():
        moment = key.startswith("moments.")
        base = key.removeprefix("moments.")
        if (moment and not convert_moments) or (base not in lookup and TRAINING_STATE.search(key)):
            report.skipped.append(key)
            continue
        if base not in lookup:
            report.unmapped.append(key)
            continue
        name, shape = lookup[base]
        if drop_background and name.startswith("fc."):
            if t.shape[0] != num_classes + 1:
                report.mismatched.append((key, tuple(t.shape), (num_classes + 1, *shape[1:])))
                continue
            t = t[1:].clone()
        if tuple(t.shape) != shape:
            report.mismatched.append((key, tuple(t.shape), shape))
            continue
        got[("moments." if moment else "") + name] = t
    out = {}
    for name, ms, _ in rows:  # torchvision order, then the optional moments
        if ms is None:
            out[name] = torch.zeros((), dtype=torch.int64)
            report.filled.append(name)
        elif name in got:
            out[name] = got.pop(name)
            report.mapped.append(name)
        else:
            report.missing.append(name)
    report.mapped += list(got)
    out.update(got)
    return out, report


# Logit bias of an added background class: exp(-1e4) is exactly 0 in fp16/fp32, so the 1000 real classes keep
# their probabilities, and -1e4 is still representable in fp16.
BACKGROUND_BIAS = -1e4


def add_background_row(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """1000 -> 1001 classes the MindSpore zoo way: a class 0 (background) that is never predicted (zero
    weights, bias BACKGROUND_BIAS) in front of the fc rows; other tensors are shared, not copied."""
    out = dict(state)
    w, b = state["fc.weight"], state.get("fc.bias")
    out["fc.weight"] = torch.cat([w.new_zeros(1, *w.shape[1:]), w])
    if b is not None:
        out["fc.bias"] = torch.cat([b.new_full((1,), BACKGROUND_BIAS), b])
    return out


def torch_to_mindspore(state: dict[str, torch.Tensor], arch: str | None = None, num_classes: int | None = None,
                       convert_moments: bool = False, add_background: bool = False
                       ) -> tuple[dict[str, torch.Tensor], MappingReport]:
    """Rename a torchvision/torchboost ResNet state dict to MindSpore zoo names; returns (state, report).

    num_batches_tracked counters are dropped (reported as skipped); `moments.<torch name>` entries are
    converted when convert_moments is set. add_background prepends MindSpore's class 0 (see
    add_background_row): 1000 -> 1001 classes, as the zoo's ImageNet recipes expect.
    """
    arch = arch or detect_arch(state)
    check_arch(arch)
    num_classes = num_classes or _classes(state, "fc.weight")  # the torch side's, as in mindspore_to_torch
    report = MappingReport(arch=arch, notes=mindspore_notes(arch), model=zoo_model(arch, num_classes))
    if add_background:
        if "fc.weight" not in state:
            raise CheckpointError("add_background needs an fc.weight to extend", "convert a classifier state dict")
        state, num_classes = add_background_row(state), num_classes + 1
    rows = layout(arch, num_classes)
    lookup = {tn: (ms, shape) for tn, ms, shape in rows}
    got = {}
    for key, t in state.items():
        moment = key.startswith("moments.")
        base = key.removeprefix("moments.")
        if base not in lookup:
            report.unmapped.append(key)
            continue
        ms, shape = lookup[base]
        if ms is None or (moment and not convert_moments):
            report.skipped.append(key)
        elif tuple(t.shape) != shape:
            report.mismatched.append((key, tuple(t.shape), shape))
        else:
            got[("moments." if moment else "") + ms] = t
            report.mapped.append(key)
    report.missing = [tn for tn, ms, _ in rows if ms is not None and ms not in got]
    return got, report
