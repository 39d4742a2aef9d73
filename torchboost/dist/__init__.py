"""Data-parallel plumbing over torch.distributed: process-group setup and rank helpers (`group`), DDP
wrapping (`ddp`), the in-process launcher (`launch`) and the Adasum reduction (`adasum`)."""

from torchboost.dist.adasum import adasum_combine, adasum_reduce, hierarchical_groups
from torchboost.dist.ddp import fusion_bucket_caps_mb, wrap_ddp
from torchboost.dist.group import (DistInfo, agree, all_reduce_mean, all_reduce_sum, any_rank, barrier, broadcast_module,
                                   broadcast_object, get_rank, get_world_size, guard, info, init_distributed, is_main,
                                   open_worklog, shutdown)
from torchboost.dist.launch import launch

__all__ = ["DistInfo", "agree", "init_distributed", "info", "is_main", "get_rank", "get_world_size", "guard",
           "barrier", "all_reduce_sum", "all_reduce_mean", "any_rank", "broadcast_object", "broadcast_module",
           "open_worklog", "shutdown", "wrap_ddp", "fusion_bucket_caps_mb", "launch", "adasum_combine",
           "adasum_reduce", "hierarchical_groups"]
