"""The one check every foreign-format writer applies to an entry before encoding it."""

from __future__ import annotations

from collections.abc import Container

import torch

from torchboost.errors import CheckpointError


def check_entry(name: object, tensor: object, dtypes: Container[torch.dtype], fmt: str, fix: str) -> None:
    """A non-empty str name and a torch.Tensor of a dtype `fmt` can hold, else a one-line CheckpointError."""
    if not isinstance(name, str) or not name or not isinstance(tensor, torch.Tensor):
        raise CheckpointError(f"cannot save entry {name!r}: need a non-empty str name and a torch.Tensor",
                              "pass {name: tensor}")
    if tensor.dtype not in dtypes:
        raise CheckpointError(f"tensor {name!r} has dtype {tensor.dtype}, which {fmt} cannot hold", fix)
