"""Boost configuration: MindSpore's `boost_level` + `boost_config_dict`, resolved into a frozen `BoostPlan`.

Keys, modes and defaults are MindSpore's (mindspore/boost/boost.py, `AutoBoost`):

    level "O0" | "O1" | "O2"          O1 = less_bn + grad_freeze, O2 = O1 + adasum
    {"boost": {"mode": "auto" | "manual" | "enable_all" | "disable_all",
               "less_bn", "grad_freeze", "adasum", "grad_accumulation", "dim_reduce", "loss_scale_group"},
     "common": {"gradient_split_groups", "device_number"},
     "less_bn": {"fn_flag", "gc_flag"},
     "grad_freeze": {"param_groups", "freeze_type", "freeze_p", "total_steps"},
     "grad_accumulation": {"grad_accumulation_step"},
     "dim_reduce": {"rho", "gamma", "alpha", "sigma", "n_components", "pca_mat_path", "weight_load_dir", "timeout"},
     "adasum": {}}

Where MindSpore is silent we are explicit: an unknown level, mode or key, a wrong type, an out-of-range value,
algorithm switches written in mode "auto" (MindSpore ignores them) and combinations that cannot run together
raise `ConfigError` instead of being dropped or switched off.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from torchboost.errors import ConfigError, suggest
from torchboost.options import check_options

from .options import (
    AdasumOptions,
    CommonOptions,
    DimReduceOptions,
    GradAccumulationOptions,
    GradFreezeOptions,
    LessBNOptions,
)

ALGORITHMS = ("less_bn", "grad_freeze", "adasum", "grad_accumulation", "dim_reduce", "loss_scale_group")
MODES = ("auto", "manual", "enable_all", "disable_all")
LEVELS = {
    "O0": frozenset(),
    "O1": frozenset({"less_bn", "grad_freeze"}),
    "O2": frozenset({"less_bn", "grad_freeze", "adasum"}),
}
SECTIONS = {
    "common": CommonOptions,
    "less_bn": LessBNOptions,
    "grad_freeze": GradFreezeOptions,
    "grad_accumulation": GradAccumulationOptions,
    "dim_reduce": DimReduceOptions,
    "adasum": AdasumOptions,
}


@dataclass(frozen=True)
class BoostPlan:
    """What boost will do in this run. Build it with `resolve_boost`; print `describe()` at training start."""

    level: str = "O0"
    mode: str = "auto"
    enabled: frozenset[str] = frozenset()
    common_options: CommonOptions = field(default_factory=CommonOptions)
    less_bn_options: LessBNOptions = field(default_factory=LessBNOptions)
    grad_freeze_options: GradFreezeOptions = field(default_factory=GradFreezeOptions)
    grad_accumulation_options: GradAccumulationOptions = field(default_factory=GradAccumulationOptions)
    dim_reduce_options: DimReduceOptions = field(default_factory=DimReduceOptions)
    adasum_options: AdasumOptions = field(default_factory=AdasumOptions)
    configured: frozenset[str] = frozenset()  # option sections the user wrote (to flag ones left unused)

    def on(self, algorithm: str) -> bool:
        """Whether `algorithm` (one of ALGORITHMS) runs."""
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"unknown boost algorithm {algorithm!r}", suggest(algorithm, ALGORITHMS))
        return algorithm in self.enabled

    @property
    def grad_accumulation_step(self) -> int:
        """Micro-batches per optimizer update that boost asks the TrainStep for (1 = no accumulation)."""
        return self.grad_accumulation_options.grad_accumulation_step if self.on("grad_accumulation") else 1

    def describe(self) -> str:
        """Human-readable plan, one algorithm per line (printed at the start of training)."""
        lines = [f"boost: level {self.level}, mode {self.mode}"]
        for name in ALGORITHMS:
            opts = getattr(self, f"{name}_options", None)
            if self.on(name):
                detail = f"on  {_fmt(opts) if opts is not None else ''}"
            else:
                detail = "off (options given but algorithm off)" if name in self.configured else "off"
            lines.append(f"  {name:<18} {detail}".rstrip())
        if "common" in self.configured:
            lines.append(f"  common             {_fmt(self.common_options)}")
        return "\n".join(lines)


def resolve_boost(level: str = "O0", config: Mapping[str, Any] | None = None, world_size: int | None = None,
                  where: str = "boost") -> BoostPlan:
    """Validate MindSpore-style `boost_level` and `boost_config_dict` into a `BoostPlan`.

    `world_size` (None = not known yet) lets Adasum on one process fail here rather than in `build_boost`.
    `where` prefixes key paths in error messages ("boost" -> "boost.config.grad_freeze.freeze_p").
    Checks that need the model happen in `build_boost`.
    """
    if level not in LEVELS:
        raise ConfigError(f"unknown boost level {level!r} at {where}.level", suggest(str(level), LEVELS))
    config = dict(config or {})
    _check_keys(config, ("boost", *SECTIONS), f"{where}.config")
    switches = dict(_as_mapping(config.get("boost", {}), f"{where}.config.boost"))
    _check_keys(switches, ("mode", *ALGORITHMS), f"{where}.config.boost")
    mode = switches.pop("mode", "auto")
    if mode not in MODES:
        raise ConfigError(f"unknown boost mode {mode!r} at {where}.config.boost.mode", suggest(str(mode), MODES))
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{where}.config.boost.{name} must be true or false, got {value!r}")

    enabled = set(LEVELS[level])
    if mode == "auto":
        differing = sorted(n for n, v in switches.items() if v != (n in enabled))
        if differing:
            raise ConfigError(
                f"{where}.config.boost sets {', '.join(differing)} but mode 'auto' takes the algorithms from "
                f"level {level} (MindSpore would ignore these switches)",
                f"set {where}.config.boost.mode to 'manual' to choose algorithms one by one, or remove the switches",
            )
    elif mode == "manual":
        enabled |= {n for n, v in switches.items() if v}
        enabled -= {n for n, v in switches.items() if not v}
    elif mode == "enable_all":
        enabled = set(ALGORITHMS)
    else:
        enabled = set()

    plan = BoostPlan(
        level=level,
        mode=mode,
        enabled=frozenset(enabled),
        configured=frozenset(k for k in SECTIONS if k in config),
        **{f"{name}_options": _parse_section(config.get(name, {}), cls, f"{where}.config.{name}")
           for name, cls in SECTIONS.items()},
    )
    _check_combinations(plan, where)
    if world_size is not None:
        check_world_size(plan, world_size)
    return plan


def check_world_size(plan: BoostPlan, world_size: int) -> None:
    """Adasum combines the updates of several processes: on one it would do nothing."""
    if plan.on("adasum") and world_size < 2:
        raise ConfigError(
            f"boost adasum combines the updates of several processes; this run has world_size={world_size}",
            "launch with torchrun --nproc_per_node=2 or more, or use level O1 / turn adasum off",
        )


def _check_combinations(plan: BoostPlan, where: str) -> None:
    """Refuse what cannot run; MindSpore would silently switch some of these off."""
    hint = ""
    if plan.mode == "enable_all":
        hint = " (mode 'enable_all' turns on every algorithm; use mode 'manual' and pick)"
    if plan.on("loss_scale_group"):
        raise ConfigError(
            "boost loss_scale_group is not implemented in torchboost" + hint,
            "use the trainer's dynamic loss scale (one scale for all layers) and set loss_scale_group false",
        )
    if plan.on("dim_reduce"):
        for other, why in (
            ("grad_freeze", "P-BFGS needs the gradient of every weight it projects"),
            ("adasum", "the line search needs one shared update, not per-rank updates combined afterwards"),
            ("grad_accumulation", "the line search re-evaluates the loss on a single batch"),
        ):
            if plan.on(other):
                raise ConfigError(f"boost dim_reduce cannot run with {other}: {why}{hint}",
                                  f"turn {other} off for the dim_reduce stage")
        opts = plan.dim_reduce_options
        if opts.weight_load_dir is None and opts.pca_mat_path is None:
            raise ConfigError(
                "boost dim_reduce needs the weights of a first training stage",
                f"set {where}.config.dim_reduce.weight_load_dir to that run's checkpoint folder "
                "(or pca_mat_path to a saved basis)",
            )
    if plan.on("grad_accumulation") and plan.grad_accumulation_options.grad_accumulation_step < 2:
        raise ConfigError(
            "boost grad_accumulation is on with grad_accumulation_step=1, which does nothing",
            f"set {where}.config.grad_accumulation.grad_accumulation_step to 2 or more, or turn it off",
        )


def _parse_section(raw: Any, cls: type, path: str) -> Any:
    """Build an options dataclass from a dict by its declared rules: unknown keys and bad values are errors."""
    raw = dict(_as_mapping(raw, path))
    groups = raw.get("gradient_split_groups")
    if isinstance(groups, int) and not isinstance(groups, bool):  # MindSpore also takes one index
        raw["gradient_split_groups"] = [groups]
    return cls(**check_options(raw, cls, path))


def _as_mapping(raw: Any, path: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path} must be a mapping of options, got {type(raw).__name__}")
    return raw


def _check_keys(raw: Mapping[str, Any], valid: Any, path: str) -> None:
    for key in raw:
        if key not in valid:
            raise ConfigError(f"unknown key {path}.{key}", suggest(str(key), valid))


def _fmt(options: Any) -> str:
    return " ".join(f"{f.name}={getattr(options, f.name)}" for f in fields(options))
