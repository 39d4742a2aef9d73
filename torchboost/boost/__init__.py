"""Boost accelerators (MindSpore `boost_level` O0/O1/O2 and `boost_config_dict`): less_bn, grad_freeze,
dim_reduce, gradient accumulation (done by TrainStep) and Adasum (boost/adasum.py, imported when used).

    plan = resolve_boost("O1", {"grad_freeze": {"param_groups": 4}})
    print(plan.describe())
    model, hooks = build_boost(plan, model, total_steps=1000)
    optimizer = boost_optimizer(plan, model) or torch.optim.SGD(model.parameters(), lr=0.1)
    step = TrainStep(model, loss_fn, optimizer, hooks=hooks)

See `boost.build` for the full wiring (EMA, DDP, evaluation of boost-trained checkpoints).
"""

from .build import boost_optimizer, build_boost, transform_model
from .config import ALGORITHMS, BoostPlan, resolve_boost
from .dim_reduce import DimReduce, build_dim_reduce
from .grad_freeze import GradFreeze, freeze_schedule, layer_groups
from .gradient_centralization import GradCentralization, gc_parameters
from .less_bn import FNHead, apply_less_bn, removable_batchnorms
from .pca import build_pca_basis

__all__ = [
    "ALGORITHMS", "BoostPlan", "DimReduce", "FNHead", "GradCentralization", "GradFreeze",
    "apply_less_bn", "boost_optimizer", "build_boost", "build_dim_reduce", "build_pca_basis", "freeze_schedule",
    "gc_parameters", "layer_groups", "removable_batchnorms", "resolve_boost", "transform_model",
]
