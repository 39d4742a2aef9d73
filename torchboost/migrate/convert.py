"""`torchboost convert IN OUT`: weights between MindSpore .ckpt, PaddlePaddle .pdparams, torch state dicts
(.pt/.pth) and .safetensors.

The direction comes from the file extensions. Leaving a framework's format renames its weights to torch
names (torchboost.migrate.names / paddle_names), entering one renames them back, so .ckpt <-> .pdparams
goes through torch names; torch <-> safetensors only changes the container. `arch="none"` keeps names as
they are (a pure container change).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from torchboost.errors import CheckpointError, ConfigError
from torchboost.fileio import atomic_path
from torchboost.train.checkpoint import is_torch_file
from torchboost.migrate.mindspore_ckpt import load_mindspore_ckpt, save_mindspore_ckpt
from torchboost.migrate.names import MappingReport, mindspore_to_torch, torch_to_mindspore
from torchboost.migrate.paddle_names import paddle_to_torch, torch_to_paddle
from torchboost.migrate.pdparams import load_pdparams, save_pdparams

KINDS = {".ckpt": "ckpt", ".pdparams": "pdparams", ".pt": "torch", ".pth": "torch", ".safetensors": "safetensors"}
FRAMEWORKS = {"ckpt": "MindSpore .ckpt", "pdparams": "PaddlePaddle .pdparams"}  # formats with their own names


def file_kind(path: str | os.PathLike) -> str:
    if Path(path).suffix.lower() == ".pdopt":
        raise ConfigError(f"{path} is PaddlePaddle optimizer state (.pdopt), which has no torch counterpart here",
                          "convert the model's .pdparams; the optimizer starts fresh in torch")
    kind = KINDS.get(Path(path).suffix.lower())
    if kind is None:
        raise ConfigError(f"cannot tell the format of {path} from its extension",
                          f"use one of {', '.join(KINDS)}")
    return kind


def load_torch_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a .pt/.pth (weights_only: never unpickles code) or .safetensors file into {name: tensor}.

    Accepts a bare state dict or a training checkpoint holding one under "model"/"state_dict", and strips
    DDP's "module." prefix.
    """
    try:
        if file_kind(path) == "safetensors":
            from safetensors.torch import load_file
            obj = load_file(str(path))
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except ConfigError:
        raise
    except Exception as e:  # unpickling/safetensors errors have many types; all mean "unreadable"
        raise CheckpointError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                              "check that it is a torch state dict / safetensors file") from None
    if isinstance(obj, dict):
        for key in ("model", "state_dict"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors", "save model.state_dict() instead")
    if all(k.startswith("module.") for k in obj):
        obj = {k.removeprefix("module."): v for k, v in obj.items()}
    return obj


def save_torch_state(path: str | os.PathLike, state: dict[str, torch.Tensor]) -> None:
    """Write {name: tensor} as .pt/.pth or .safetensors, atomically."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        if file_kind(path) == "safetensors":
            from safetensors.torch import save_file

            try:  # safetensors refuses tensors sharing storage; contiguous clones are independent.
                save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(tmp))
            except KeyError as e:  # its dtype table has no such dtype (complex, ...): name the tensor
                bad = next((k for k, v in state.items() if v.dtype == e.args[0]), "a tensor")
                raise CheckpointError(f"{bad} is {str(e.args[0]).removeprefix('torch.')}, which safetensors cannot "
                                      "store", "write a .pt file instead, or convert that tensor") from None
        else:
            with open(tmp, "wb") as f:  # a file object: a full disk surfaces as OSError, not RuntimeError
                torch.save(state, f)


def source_kind(path: str | os.PathLike) -> str:
    """The format of a file to read: its extension, except that a torch file named .ckpt (what torchboost
    called its training checkpoints before they became .pt) is read as the torch file it is."""
    kind = file_kind(path)
    if kind == "ckpt" and Path(path).is_file() and is_torch_file(path):
        return "torch"
    return kind


def load_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """{name: tensor} from any supported file, with the names it was saved with."""
    kind = source_kind(path)
    if kind == "ckpt":
        return load_mindspore_ckpt(path)
    if kind == "pdparams":
        return load_pdparams(path)
    return load_torch_state(path)


def save_state(path: str | os.PathLike, state: dict[str, torch.Tensor]) -> None:
    """Write {name: tensor} in the format `path`'s extension names, atomically, names as given."""
    kind = file_kind(path)
    if kind == "ckpt":
        save_mindspore_ckpt(path, state)
    elif kind == "pdparams":
        save_pdparams(state, path)
    else:
        save_torch_state(path, state)


def _chain(first: MappingReport, second: MappingReport) -> MappingReport:
    """framework -> torch -> framework: the source side's report, plus any problem of the second step."""
    first.unmapped += second.unmapped
    first.missing += second.missing
    first.mismatched += second.mismatched
    first.notes += [n for n in second.notes if n not in first.notes]
    return first


def convert(in_path: str | os.PathLike, out_path: str | os.PathLike, arch: str | None = None,
            num_classes: int | None = None, drop_background: bool = False, convert_moments: bool = False,
            strict: bool = True, add_background: bool = False) -> MappingReport:
    """Convert weights from `in_path` to `out_path` and return what was mapped.

    arch: resnet18..resnet152, mnist_cnn (PaddlePaddle only); None: detected from the names; "none" keeps
    names untouched. The report's `model` is the create_model call of the matching torch network.
    drop_background: when reading a 1001-class MindSpore checkpoint, drop class 0 -> 1000 classes.
    add_background: when writing a MindSpore .ckpt, add the zoo's class 0 -> 1001 classes.
    strict: refuse (CheckpointError naming the first problem) unless every tensor maps cleanly.
    """
    src, dst = source_kind(in_path), file_kind(out_path)
    if src == dst and src in FRAMEWORKS:
        raise ConfigError(f"both files are {FRAMEWORKS[src]}: nothing to convert", "write a .pt/.safetensors")
    if drop_background and src != "ckpt":
        raise ConfigError("drop_background only applies when reading a MindSpore .ckpt",
                          "drop --drop-background or convert from the .ckpt")
    if add_background and not (dst == "ckpt" and src != "ckpt" and arch != "none"):
        raise ConfigError("add_background only applies when writing a ResNet to a MindSpore .ckpt",
                          "drop --add-background or convert a .pt/.safetensors/.pdparams ResNet to .ckpt")
    state = load_state(in_path)
    if arch == "none" or (src not in FRAMEWORKS and dst not in FRAMEWORKS):
        report = MappingReport(arch="none", mapped=list(state))
    else:
        report = None
        if src == "ckpt":
            state, report = mindspore_to_torch(state, arch, num_classes, drop_background, convert_moments)
        elif src == "pdparams":
            state, report = paddle_to_torch(state, arch, num_classes)
        if dst in FRAMEWORKS and (report is None or report.ok):
            arch = arch or (report.arch if report else None)
            if dst == "ckpt":
                state, second = torch_to_mindspore(state, arch, num_classes, convert_moments, add_background)
            else:
                state, second = torch_to_paddle(state, arch, num_classes)
            report = second if report is None else _chain(report, second)
    if strict and not report.ok:
        raise CheckpointError(f"{in_path} does not convert cleanly to {report.arch}: {report.first_problem()}",
                              "pick the right arch/num_classes (drop_background for 1001-class MindSpore "
                              "weights) or convert non-strictly")
    if not state:
        raise CheckpointError(f"no tensors of {in_path} map to {report.arch}", "pick the right arch")
    save_state(out_path, state)
    return report
