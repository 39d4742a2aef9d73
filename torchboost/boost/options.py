"""Per-algorithm boost options: MindSpore's keys and defaults, with range checks MindSpore lacks.

Declared in the project's one rule language (`torchboost.options.option`): the recipe's `boost.config` and a
class built in Python get the same checks and the same one-line errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Union

from torchboost.options import check_fields, option


class _Checked:
    """Options checked against their declared rules when built (`where` names them in errors)."""

    where: ClassVar[str] = "boost"

    def __post_init__(self) -> None:
        check_fields(self, self.where)


@dataclass(frozen=True)
class CommonOptions(_Checked):
    """`common`: gradient all-reduce split points (parameter indices, MindSpore's all_reduce_fusion_config;
    empty = the trainer's own buckets; dist.fusion_config wins when both are set) and devices per node
    (informational: torchboost takes the world size from torch.distributed)."""

    where: ClassVar[str] = "boost.config.common"
    gradient_split_groups: list[int] = option(factory=list, ge=1, help="parameter indices where gradient all-reduce "
                                                                          "groups split; empty: DDP's buckets")
    device_number: int = option(8, ge=1, help="devices per node (informational: the world size comes from torchrun)")


@dataclass(frozen=True)
class LessBNOptions(_Checked):
    """`less_bn`: fn_flag replaces the classifier by the cosine FN head; gc_flag adds gradient centralization.

    fn_flag "auto" (torchboost's default; MindSpore's is true): the FN head where less_bn removes BatchNorms,
    none on a model without BatchNorm, where it slows learning (see less_bn.py). true/false force it."""

    where: ClassVar[str] = "boost.config.less_bn"
    fn_flag: Union[bool, str] = option("auto", choices=(True, False, "auto"),
                                       help="the cosine FN classifier head; auto: where LessBN removes BatchNorms")
    gc_flag: bool = option(True, help="gradient centralization on convolution weights")


@dataclass(frozen=True)
class GradFreezeOptions(_Checked):
    """`grad_freeze`: `param_groups` training sets, schedule `freeze_type` (0 cyclic, 1 random interval),
    `freeze_p` = share of full-network steps, `total_steps` = schedule length (it repeats after that)."""

    where: ClassVar[str] = "boost.config.grad_freeze"
    # >= 2: with one training set (the whole network) nothing is ever frozen - MindSpore says nothing
    param_groups: int = option(10, ge=2, help="how many training sets the network is split into")
    freeze_type: int = option(1, choices=(0, 1), help="freezing schedule: 0 cyclic, 1 random interval")
    freeze_p: float = option(0.7, gt=0, lt=1, help="share of steps that train the whole network")
    total_steps: int = option(65536, ge=1, help="length of the freezing schedule (it repeats after that)")


@dataclass(frozen=True)
class GradAccumulationOptions(_Checked):
    """`grad_accumulation`: micro-batches per optimizer update (the TrainStep does the accumulation)."""

    where: ClassVar[str] = "boost.config.grad_accumulation"
    grad_accumulation_step: int = option(1, ge=1, help="micro-batches per optimizer update")


@dataclass(frozen=True)
class DimReduceOptions(_Checked):
    """`dim_reduce` (DLDR P-BFGS): line-search base `rho`, residual momentum `gamma`, residual step `alpha`,
    Armijo constant `sigma`, PCA size `n_components`, and where the basis comes from. `timeout` is accepted for
    MindSpore compatibility: torchboost never waits on per-rank basis files (every rank gets P in memory)."""

    where: ClassVar[str] = "boost.config.dim_reduce"
    rho: float = option(0.55, gt=0, lt=1, help="line-search step base")
    gamma: float = option(0.9, ge=0, lt=1, help="momentum of the residual update")
    alpha: float = option(0.001, ge=0, help="step size of the residual update")
    sigma: float = option(0.4, gt=0, lt=1, help="Armijo constant of the line search")
    n_components: int = option(32, ge=1, help="size of the PCA subspace")
    pca_mat_path: Optional[str] = option(None, help="the PCA basis file: read when it exists, else computed and saved there")
    weight_load_dir: Optional[str] = option(None, help="the first stage's checkpoint folder the basis is "
                                                                   "computed from")
    timeout: int = option(1800, gt=0, help="accepted for MindSpore compatibility (nothing waits on basis files)")


@dataclass(frozen=True)
class AdasumOptions(_Checked):
    """`adasum`: MindSpore has no Adasum options (its device count decides everything). torchboost adds
    `hierarchical`: average within each node, Adasum across nodes (see torchboost.boost.adasum)."""

    where: ClassVar[str] = "boost.config.adasum"
    hierarchical: bool = option(False, help="average within each node, Adasum across nodes")
