"""The DLDR subspace: PCA of a weight trajectory saved during a first training stage.

Each sample is the flattened vector of the model's trainable weights (registration order, the order
`DimReduce` flattens gradients in). Samples are centred and the top right-singular vectors of the
(k x n_params) matrix form P (n_components x n_params, orthonormal rows). With k samples, an SVD of the
small side costs O(k^2 n) — cheap next to one epoch.

Differences from MindSpore (mindspore/boost/base.py): it stacks EVERY tensor of each checkpoint (BN
running statistics, optimizer moments...) although DimReduce projects only trainable-weight gradients, so
the columns can shift; we pick the trainable weights by name. It needs k >= n_components; centring
leaves only k-1 directions with information, so we need k >= n_components + 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from torchboost.errors import CheckpointError, ConfigError
from torchboost.fileio import atomic_path
from torchboost.train.checkpoint import torch_load


def build_pca_basis(weights: Sequence, n_components: int, names: Sequence[str] | None = None) -> torch.Tensor:
    """P (n_components x n_params, float32) from k weight samples.

    `weights`: checkpoint paths (torch files holding {"model": state_dict, ...} or a plain state dict),
    state dicts, or flat 1-D tensors. `names` selects and orders the tensors taken from paths/state dicts
    (the trainable parameter names of the model); it is required for those.
    """
    k = len(weights)
    if k < n_components + 1:
        raise ConfigError(
            f"dim_reduce needs at least n_components + 1 = {n_components + 1} weight samples, got {k}",
            "save more checkpoints in the first stage (e.g. several per epoch) or lower dim_reduce.n_components",
        )
    rows = [_flat(w, names) for w in weights]
    n = rows[0].numel()
    if any(r.numel() != n for r in rows):
        raise CheckpointError("dim_reduce weight samples differ in size", "use checkpoints of one model")
    x = torch.stack(rows)  # k x n, float32: the SVD below is on the k x k side, memory is the k x n matrix
    x -= x.mean(dim=0, dtype=torch.float64).to(x.dtype)
    u, _, vh = torch.linalg.svd(x, full_matrices=False)
    # Deterministic signs (sklearn/MindSpore svd_flip): the largest |u| entry of each column is positive.
    signs = torch.sign(u.gather(0, u.abs().argmax(dim=0, keepdim=True))).squeeze(0)
    signs[signs == 0] = 1
    return (vh[:n_components] * signs[:n_components, None]).contiguous()


def checkpoint_files(folder: str | Path) -> list[Path]:
    """Checkpoint files of a run folder, sorted by name: the trajectory's samples. PREFIX-best.pt is a
    copy of one of them (the best epoch's weights) and would count that point twice, so it is left out."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"dim_reduce weight_load_dir {folder} is not a folder",
                          "point it at the checkpoint folder of the first training stage")
    from torchboost.migrate.formats import FORMATS, TORCH  # the weight-format registry, loaded when used

    suffixes = FORMATS[TORCH].suffixes  # a first stage's torchboost checkpoints
    return sorted(p for p in folder.iterdir()
                  if p.suffix in suffixes and p.is_file() and not p.name.endswith("-best.pt"))


def load_state_dict(path: str | Path) -> Mapping[str, torch.Tensor]:
    """A model state dict from a torchboost checkpoint ({"model": ...}) or a plain state-dict file."""
    try:
        obj = torch_load(path, mmap=True)
    except CheckpointError:
        raise
    except Exception as e:  # torch raises several types for foreign/corrupt files
        raise CheckpointError(f"cannot read {path} as a torch checkpoint ({type(e).__name__})",
                              "convert MindSpore .ckpt files with `torchboost convert` first") from e
    if isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping):
        obj = obj["model"]
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path} holds no state dict", "save {'model': model.state_dict(), ...}")
    return obj


def save_basis(basis: torch.Tensor, path: str | Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: np.save would append .npy to a path
        np.save(f, basis.cpu().numpy())


def _flat(source, names: Sequence[str] | None) -> torch.Tensor:
    if isinstance(source, torch.Tensor):
        return source.detach().reshape(-1).float()
    state = load_state_dict(source) if isinstance(source, (str, Path)) else source
    if names is None:
        raise ConfigError("build_pca_basis needs `names` to pick weights from state dicts",
                          "pass the model's trainable parameter names")
    missing = [n for n in names if n not in state]
    if missing:
        raise CheckpointError(
            f"dim_reduce: weight sample lacks {len(missing)} parameters of the model, e.g. {missing[0]}",
            "build the basis from checkpoints of the same model (and the same less_bn setting)",
        )
    return torch.cat([state[n].detach().reshape(-1).float() for n in names])
