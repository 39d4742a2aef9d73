"""Data-parallel plumbing over torch.distributed: the checked torchrun environment (`env`), forming a job
within a short join timeout (`join`), process-group setup and rank helpers (`group`), DDP wrapping (`ddp`), the
in-process launcher (`launch`) and the Adasum reduction (`adasum`)."""

from torchboost.distributed.adasum import adasum_combine, adasum_reduce, hierarchical_groups
from torchboost.distributed.ddp import fusion_bucket_caps_mb, wrap_ddp
from torchboost.distributed.env import TorchrunEnv, read_env, restart_count
from torchboost.distributed.group import (DistInfo, agree, all_reduce_mean, all_reduce_sum, any_rank, barrier, broadcast_module,
                                   broadcast_object, check_timeout, get_rank, get_world_size, guard, info,
                                   init_distributed, is_main, open_worklog, shutdown)
from torchboost.distributed.join import Described
from torchboost.distributed.launch import launch

__all__ = ["DistInfo", "TorchrunEnv", "Described", "read_env", "restart_count", "check_timeout", "agree",
           "init_distributed", "info", "is_main", "get_rank", "get_world_size", "guard",
           "barrier", "all_reduce_sum", "all_reduce_mean", "any_rank", "broadcast_object", "broadcast_module",
           "open_worklog", "shutdown", "wrap_ddp", "fusion_bucket_caps_mb", "launch", "adasum_combine",
           "adasum_reduce", "hierarchical_groups"]
