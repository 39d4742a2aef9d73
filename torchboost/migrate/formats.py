"""The weight-format registry: every file format torchboost reads or writes weights in, defined once.

An entry holds everything about one format: its file suffixes, a reader `read(path) -> {name: tensor}` and a
writer `write(path, tensors)` (one argument order for all), the dtypes it can hold, and for a foreign
framework's format its name maps into and out of torch names. `convert`, `eval`/`predict` (weights files)
and `init_weights` read this table; nothing else lists the suffixes. Adding a format: write its reader and
writer module in `torchboost.migrate`, add one `register(WeightFormat(...))` line here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import torch

from torchboost.errors import CheckpointError, ConfigError
from torchboost.migrate.mindspore_ckpt import DTYPE_NAMES, load_mindspore_ckpt, save_mindspore_ckpt
from torchboost.migrate.names import MappingReport, mindspore_to_torch, torch_to_mindspore
from torchboost.migrate.paddle_names import paddle_to_torch, torch_to_paddle
from torchboost.migrate.pdparams import TORCH_TO_NUMPY, load_pdparams, save_pdparams
from torchboost.migrate.timm_names import from_timm
from torchboost.migrate.torch_files import SAFETENSORS_DTYPES, TORCH_DTYPES, is_torch_file, load_torch_state
from torchboost.migrate.torch_files import save_safetensors, save_torch
from torchboost.train.checkpoint import CHECKPOINT_SUFFIX

State = dict[str, torch.Tensor]
# (state, arch, num_classes, options) -> (renamed state, report); options: drop_background, convert_moments, ...
NameMap = Callable[..., tuple[State, MappingReport]]


@dataclass(frozen=True)
class WeightFormat:
    name: str
    description: str
    suffixes: tuple[str, ...]
    read: Callable[[str | os.PathLike], State]
    write: Callable[[str | os.PathLike, State], None]
    dtypes: frozenset[torch.dtype]  # what the format can hold
    to_torch: NameMap | None = None  # a framework's own weight names -> torch names (None: torch names already)
    from_torch: NameMap | None = None


FORMATS: dict[str, WeightFormat] = {}
# Files that look like weights but are not: refused with one line, wherever a weights file is read.
REFUSED = {".pdopt": ("PaddlePaddle optimizer state (.pdopt), which has no torch counterpart here",
                      "convert the model's .pdparams; the optimizer starts fresh in torch")}


def register(fmt: WeightFormat) -> WeightFormat:
    taken = [s for s in fmt.suffixes if any(s in f.suffixes for f in FORMATS.values())]
    if fmt.name in FORMATS or taken:
        raise ValueError(f"weight format {fmt.name!r} (or its suffix {taken}) is registered twice")
    FORMATS[fmt.name] = fmt
    return fmt


def all_suffixes() -> list[str]:
    return [s for f in FORMATS.values() for s in f.suffixes]


def format_of(path: str | os.PathLike) -> WeightFormat:
    """The format `path`'s suffix names (for writing, and for reading foreign formats)."""
    suffix = Path(path).suffix.lower()
    if suffix in REFUSED:
        what, fix = REFUSED[suffix]
        raise ConfigError(f"{path} is {what}", fix)
    for fmt in FORMATS.values():
        if suffix in fmt.suffixes:
            return fmt
    raise ConfigError(f"cannot tell the weight format of {path} from its extension",
                      f"use one of {', '.join(all_suffixes())}")


def source_format(path: str | os.PathLike) -> WeightFormat:
    """The format of a file to read: its suffix, except that a torch file named like a MindSpore checkpoint
    (PyTorch Lightning and others name torch checkpoints .ckpt) is read as the torch file it is, by content."""
    fmt = format_of(path)
    if fmt.name == MINDSPORE and Path(path).is_file() and is_torch_file(path):
        return FORMATS[TORCH]
    return fmt


def read_weights(path: str | os.PathLike) -> State:
    """{name: tensor} from any registered format, with the names it was saved with."""
    return source_format(path).read(path)


def write_weights(path: str | os.PathLike, state: State) -> None:
    """Write {name: tensor} in the format `path`'s suffix names, atomically, names as given."""
    fmt = format_of(path)
    bad = next((k for k, v in state.items() if isinstance(v, torch.Tensor) and v.dtype not in fmt.dtypes), None)
    if bad is not None:
        raise CheckpointError(f"{bad} is {str(state[bad].dtype).removeprefix('torch.')}, which {fmt.description} "
                              "cannot hold", "convert that tensor (e.g. to float32) or write a .pt file")
    fmt.write(path, state)


def read_torch_named(path: str | os.PathLike, arch: str | None = None, num_classes: int | None = None,
                     network: Mapping[str, torch.Tensor] | None = None) -> State:
    """{torch name: tensor} from any registered format: a framework's names are mapped (strictly) to torch's.

    `network`: the state dict of the network the weights are for. A file whose names and shapes already are
    exactly the network's is read as it is, whatever its container (what `convert --arch none` writes; the
    MindSpore name map knows no MNIST CNN, and Paddle's would transpose its classifier a second time). A torch
    file in timm's names, for a zoo network whose layout timm shares, is renamed (`timm_names.from_timm`)."""
    fmt = source_format(path)
    state = fmt.read(path)
    if network is not None and _same_shapes(state, network):
        return state
    if fmt.to_torch is None:
        renamed = from_timm(state, arch, dict(network)) if network is not None else None
        return state if renamed is None else renamed
    state, report = fmt.to_torch(state, arch, num_classes)
    if not report.ok:
        raise CheckpointError(f"{path} does not map to {report.arch}: {report.first_problem()}",
                              "pick the recipe (--config) whose network these weights belong to")
    return state


def _same_shapes(state: State, network: Mapping[str, torch.Tensor]) -> bool:
    return state.keys() == network.keys() and all(state[k].shape == network[k].shape for k in state)


MINDSPORE, PADDLE, TORCH, SAFETENSORS = "mindspore", "paddle", "torch", "safetensors"
register(WeightFormat(MINDSPORE, "a MindSpore .ckpt", (".ckpt",), load_mindspore_ckpt, save_mindspore_ckpt,
                      frozenset(DTYPE_NAMES), mindspore_to_torch, torch_to_mindspore))
register(WeightFormat(PADDLE, "a PaddlePaddle .pdparams", (".pdparams",), load_pdparams, save_pdparams,
                      frozenset(TORCH_TO_NUMPY), paddle_to_torch, torch_to_paddle))
register(WeightFormat(TORCH, "a torch state dict", (CHECKPOINT_SUFFIX, ".pth"), load_torch_state, save_torch, TORCH_DTYPES))
register(WeightFormat(SAFETENSORS, "a safetensors file", (".safetensors",), load_torch_state, save_safetensors,
                      SAFETENSORS_DTYPES))
