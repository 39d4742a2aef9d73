"""Torch state-dict files (.pt/.pth, read with weights_only: never unpickles code) and safetensors files."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import _TYPES as _SAFETENSORS_TYPES
from safetensors.torch import load_file, save_file

from torchboost.errors import CheckpointError
from torchboost.fileio import atomic_path, open_regular
from torchboost.train.checkpoint import is_torch_file, torch_load

__all__ = ["TORCH_DTYPES", "SAFETENSORS_DTYPES", "is_torch_file", "load_torch_state", "save_torch",
           "save_safetensors"]

TORCH_DTYPES = frozenset(v for v in vars(torch).values() if isinstance(v, torch.dtype))
SAFETENSORS_DTYPES = frozenset(_SAFETENSORS_TYPES.values())
_SAFETENSORS_MAGIC_MAX = 100_000_000  # a safetensors header (8-byte little-endian length) is never this long


def _is_safetensors(path: str | os.PathLike) -> bool:
    """By content: an 8-byte header length followed by a JSON object."""
    with open_regular(path, CheckpointError) as f:
        head = f.read(9)
    return len(head) == 9 and int.from_bytes(head[:8], "little") < _SAFETENSORS_MAGIC_MAX and head[8:] == b"{"


def load_torch_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """{name: tensor} from a torch file (weights_only) or a safetensors file, told apart by content.

    Accepts a bare state dict or a training checkpoint holding one under "model"/"state_dict", and strips
    DDP's "module." prefix."""
    try:
        obj = load_file(str(path)) if _is_safetensors(path) else torch_load(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found", "check the path") from None
    except CheckpointError:
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
    if all(isinstance(k, str) and k.startswith("module.") for k in obj):
        obj = {k.removeprefix("module."): v for k, v in obj.items()}
    return obj


def save_torch(path: str | os.PathLike, state: dict[str, torch.Tensor]) -> None:
    """Write {name: tensor} with torch.save, atomically."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: a full disk is OSError, not RuntimeError
        torch.save(state, f)


def save_safetensors(path: str | os.PathLike, state: dict[str, torch.Tensor]) -> None:
    """Write {name: tensor} as safetensors, atomically."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:  # safetensors refuses tensors sharing storage; contiguous clones are independent
        save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(tmp))
