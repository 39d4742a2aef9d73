"""DistributedDataParallel wrapping: bucket sizes, MindSpore's all_reduce_fusion_config, SyncBatchNorm.

MindSpore's `all_reduce_fusion_config=[85, 160]` cuts the gradient list by parameter index into fused
all-reduces [0, 85), [85, 160), [160, n). DDP has no index-based grouping: it fills buckets by byte size
in the order gradients become ready (reverse parameter order for a chain of layers). The faithful
translation used here gives DDP one byte cap per bucket (`bucket_cap_mb_list`), each equal to the byte
size of one MindSpore group, listed last group first. A bucket closes as soon as it reaches its cap, so
DDP's buckets coincide with the MindSpore groups whenever gradients become ready in reverse parameter
order. The differences, stated honestly:
- DDP's very first iteration uses provisional buckets (same caps applied in forward order); from the
  second iteration on, DDP rebuilds them in gradient-ready order, which is when the groups match.
- In branching nets (ResNet downsample paths) the ready order can deviate from reverse index order near
  a boundary, and a parameter or two may land in the neighbouring bucket.
- Parameters of different dtypes or devices never share a bucket in DDP.
None of this changes the numbers: every bucket is averaged exactly; only the overlap of communication
with backward differs.
"""

from __future__ import annotations

import inspect

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchboost.distributed.group import DistInfo, guard
from torchboost.errors import ConfigError, DistributedError

_MIB = 2**20


def fusion_bucket_caps_mb(model: nn.Module, fusion_config: list[int]) -> list[float]:
    """Per-bucket caps (MiB, DDP's bucket order) that reproduce MindSpore's fusion index boundaries.

    Indices count the trainable parameters in `model.parameters()` order, as MindSpore counts its
    gradients. Caps are exact byte counts (power-of-two division is exact in floating point).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    bounds = [int(b) for b in fusion_config]
    if any(b <= a for a, b in zip([0, *bounds], [*bounds, len(params)])):
        raise ConfigError(
            f"all_reduce_fusion_config {list(fusion_config)} must be strictly increasing indices "
            f"inside (0, {len(params)}) for this model's {len(params)} trainable parameters",
            "use boundaries like [85, 160] that split the parameter list into non-empty groups")
    edges = [0, *bounds, len(params)]
    group_bytes = [sum(p.numel() * p.element_size() for p in params[a:b]) for a, b in zip(edges, edges[1:])]
    return [nbytes / _MIB for nbytes in reversed(group_bytes)]


def wrap_ddp(model: nn.Module, info: DistInfo, bucket_cap_mb: float = 25,
             fusion_config: list[int] | None = None, sync_bn: bool = False,
             find_unused_parameters: bool = False) -> nn.Module:
    """Wrap `model` (already on `info.device`) in DDP; returns it unchanged in a single process.

    fusion_config (MindSpore parameter-index boundaries) overrides bucket_cap_mb; see the module
    docstring for how faithfully DDP can follow it. sync_bn converts BatchNorm to SyncBatchNorm, which
    torch runs only on GPU tensors: on CPU/gloo it is refused rather than silently ignored. Parameters
    keep their identity (SyncBatchNorm reuses them), so an optimizer built earlier stays valid.
    find_unused_parameters: needed when some parameters get no gradient in a step (grad_freeze).
    """
    caps = fusion_bucket_caps_mb(model, fusion_config) if fusion_config else None
    if not info.distributed:
        return model  # one process: nothing to average, and SyncBatchNorm equals BatchNorm
    if sync_bn:
        if info.device.type != "cuda":
            raise DistributedError(
                f"sync_bn needs CUDA devices: torch's SyncBatchNorm only runs on GPU tensors, and this "
                f"job runs on {info.device.type} with {info.backend}",
                "set sync_bn false (each rank then normalizes with its own batch statistics)")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    kwargs: dict = {"bucket_cap_mb": bucket_cap_mb}
    if caps is not None:
        if "bucket_cap_mb_list" not in inspect.signature(DDP).parameters:
            raise DistributedError("all_reduce_fusion_config needs DDP's bucket_cap_mb_list, which this "
                                   "torch lacks", "upgrade torch (2.13 has it) or use bucket_cap_mb")
        kwargs = {"bucket_cap_mb_list": caps}
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    with guard("DDP setup (parameter broadcast from rank 0)"):
        return DDP(model, device_ids=device_ids, find_unused_parameters=find_unused_parameters, **kwargs)
