"""Per-algorithm boost options: MindSpore's keys and defaults, with range checks MindSpore lacks."""

from __future__ import annotations

from dataclasses import dataclass

from torchboost.errors import ConfigError


def _need(ok: bool, what: str, fix: str = "") -> None:
    if not ok:
        raise ConfigError(what, fix)


@dataclass(frozen=True)
class CommonOptions:
    """`common`: gradient all-reduce split points (parameter indices, MindSpore's all_reduce_fusion_config;
    empty = the trainer's own buckets; dist.fusion_config wins when both are set) and devices per node
    (informational: torchboost takes the world size from torch.distributed)."""

    gradient_split_groups: tuple[int, ...] = ()
    device_number: int = 8

    def __post_init__(self) -> None:
        _need(self.device_number >= 1, f"boost common.device_number must be >= 1, got {self.device_number}")
        _need(all(g > 0 for g in self.gradient_split_groups),
              f"boost common.gradient_split_groups must be positive indices, got {self.gradient_split_groups}")


@dataclass(frozen=True)
class LessBNOptions:
    """`less_bn`: fn_flag replaces the classifier by the cosine FN head; gc_flag adds gradient centralization.

    fn_flag "auto" (torchboost's default; MindSpore's is true): the FN head where less_bn removes BatchNorms,
    none on a model without BatchNorm, where it slows learning (see less_bn.py). true/false force it."""

    fn_flag: bool | str = "auto"
    gc_flag: bool = True

    def __post_init__(self) -> None:
        _need(self.fn_flag in (True, False, "auto"), f"boost less_bn.fn_flag must be true, false or 'auto', "
              f"got {self.fn_flag!r}")


@dataclass(frozen=True)
class GradFreezeOptions:
    """`grad_freeze`: `param_groups` training sets, schedule `freeze_type` (0 cyclic, 1 random interval),
    `freeze_p` = share of full-network steps, `total_steps` = schedule length (it repeats after that)."""

    param_groups: int = 10
    freeze_type: int = 1
    freeze_p: float = 0.7
    total_steps: int = 65536

    def __post_init__(self) -> None:
        # param_groups=1 gives only the full-network set: MindSpore then freezes nothing, silently.
        _need(self.param_groups >= 2, f"boost grad_freeze.param_groups must be >= 2, got {self.param_groups}",
              "with one training set nothing is ever frozen; use 2 or more or turn grad_freeze off")
        _need(self.freeze_type in (0, 1), f"boost grad_freeze.freeze_type must be 0 or 1, got {self.freeze_type}")
        _need(0.0 < self.freeze_p < 1.0, f"boost grad_freeze.freeze_p must be in (0, 1), got {self.freeze_p}",
              "it is the share of steps that train the whole network")
        _need(self.total_steps >= 1, f"boost grad_freeze.total_steps must be >= 1, got {self.total_steps}")


@dataclass(frozen=True)
class GradAccumulationOptions:
    """`grad_accumulation`: micro-batches per optimizer update (the TrainStep does the accumulation)."""

    grad_accumulation_step: int = 1

    def __post_init__(self) -> None:
        _need(self.grad_accumulation_step >= 1,
              f"boost grad_accumulation.grad_accumulation_step must be >= 1, got {self.grad_accumulation_step}")


@dataclass(frozen=True)
class DimReduceOptions:
    """`dim_reduce` (DLDR P-BFGS): line-search base `rho`, residual momentum `gamma`, residual step `alpha`,
    Armijo constant `sigma`, PCA size `n_components`, and where the basis comes from. `timeout` is accepted for
    MindSpore compatibility: torchboost never waits on per-rank basis files (every rank gets P in memory)."""

    rho: float = 0.55
    gamma: float = 0.9
    alpha: float = 0.001
    sigma: float = 0.4
    n_components: int = 32
    pca_mat_path: str | None = None
    weight_load_dir: str | None = None
    timeout: int = 1800

    def __post_init__(self) -> None:
        _need(0.0 < self.rho < 1.0, f"boost dim_reduce.rho must be in (0, 1), got {self.rho}")
        _need(0.0 <= self.gamma < 1.0, f"boost dim_reduce.gamma must be in [0, 1), got {self.gamma}")
        _need(self.alpha >= 0.0, f"boost dim_reduce.alpha must be >= 0, got {self.alpha}")
        _need(0.0 < self.sigma < 1.0, f"boost dim_reduce.sigma must be in (0, 1), got {self.sigma}")
        _need(self.n_components >= 1, f"boost dim_reduce.n_components must be >= 1, got {self.n_components}")
        _need(self.timeout > 0, f"boost dim_reduce.timeout must be > 0, got {self.timeout}")


@dataclass(frozen=True)
class AdasumOptions:
    """`adasum`: MindSpore has no Adasum options (its device count decides everything). torchboost adds
    `hierarchical`: average within each node, Adasum across nodes (see torchboost.boost.adasum)."""

    hierarchical: bool = False
