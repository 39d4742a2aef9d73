"""THOR's options: `ThorOptions`, the one list of its curvature options, schedule values and the checks.

`ThorOptions` is declared in the project's one rule language (`torchboost.options.option`); each field's help
is that option's documentation. ThorPreconditioner, THOR and thor_muon take one instance and/or its fields as
keyword overrides (`thor_options` lays them over it and checks the result), and a recipe's `optim.thor` is the
same dataclass, so a bad option gets the same one-line error from Python and from a recipe. Options that were
removed are listed in `ThorOptions.REMOVED` with why: naming one is a one-line error that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
from torch import Tensor

from torchboost.errors import ConfigError, suggest
from torchboost.options import check_options, option

Schedule = float | Sequence[float] | np.ndarray | Tensor | Callable[[int], float]


class Value:
    """A schedule: a float, a per-update array or a callable of the update index. A float lr is read from
    the param group instead (`group_value`), so torch's lr schedulers act on it."""

    def __init__(self, value: Schedule, name: str) -> None:
        self.name, self.fn, self.array = name, None, None
        self.constant = float(value) if isinstance(value, (int, float)) else None
        if callable(value):
            self.fn = value
        elif not isinstance(value, (int, float)):
            self.array = np.asarray(value.detach().cpu() if isinstance(value, Tensor) else value,
                                    dtype=np.float64).reshape(-1)
            if self.array.size == 0:
                raise ConfigError(f"THOR {name} schedule is empty", "give a float or a non-empty array")

    def initial(self, value: Schedule) -> float:
        return float(self(0, value if isinstance(value, (int, float)) else 0.0))

    def __call__(self, k: int, group_value: float | None = None) -> float:
        if self.fn is not None:
            return float(self.fn(k))
        if self.array is not None:
            if k >= self.array.size:
                raise ConfigError(f"THOR {self.name} schedule has {self.array.size} entries but update {k} "
                                  "needs one", f"make the {self.name} array cover every update")
            return float(self.array[k])
        return self.constant if group_value is None else group_value


@dataclass(frozen=True)
class Removed:
    """A removed option: why it went (one clause), and `kept`, the value that is what THOR does now. A config
    saved before the removal writes every option, so that value is accepted (and dropped); any other is refused."""

    why: str
    kept: Any = None

    def check(self, where: str, value: Any, fix: str = "delete the key") -> None:
        same = value is None if self.kept is None else type(value) is type(self.kept) and value == self.kept
        if not same:
            raise ConfigError(f"{where} was removed ({self.why})", fix)


_NO_GAIN = "it did not make THOR faster in the races that tried it"
_ONE_FREQUENCY = Removed("never shown to pay in a race; frequency refreshes the factors and their inverses together")
_TRACE_SKIP = "trace-based refresh skipping was never shown to pay in a race"
_FIRST_ORDER = Removed(f"{_NO_GAIN}; damping_decay above 1 fades THOR into its first-order update")


EKFAC_DECAY = 0.95  # the thor_ekfac optimizer's ekfac_decay when the options leave it unset
DAMPING_MODES = ("absolute", "trace", "pi")  # how the damping reaches the factors (`layer.factor_dampings`)


@dataclass
class ThorOptions:
    """THOR's curvature options (ThorPreconditioner, THOR, thor_muon; a recipe's `optim.thor`): defaults, rules
    and meaning. `damping` may also be a per-update list; in Python an array or a callable of the update index."""

    damping: Union[float, list[float]] = option(0.03, gt=0, help="added to the factors' diagonal before inverting "
                                                                 "(a number, or one per update)")
    frequency: int = option(100, ge=1, help="updates between refreshes of the factors and their inverses")
    split_dim: Optional[int] = option(128, ge=1, help="block size of the block-diagonal inverse; unset: the "
                                                      "whole matrix")
    loss_scale: float = option(1.0, gt=0, help="the fixed loss scale the gradients carry (divided out of the factors "
                                               "and of THOR's update); a loss summed over the batch: its batch size")
    graft: str = option("none", choices=("none", "grad", "sgd_step", "muon_step"),
                        help="THOR's direction with another optimizer's per-layer size, so the lr schedule sets "
                             "the step: grad = each preconditioned gradient gets its plain gradient's norm; sgd_step "
                             "= each step gets the norm of momentum SGD's step at this lr; muon_step = of Muon's "
                             "(lr x sqrt(max(1, rows/cols)) x sqrt(min(rows, cols)), an orthogonal update's); "
                             "sgd_step and muon_step size THOR's own update (thor_muon's step already is Muon's)")
    factor_samples: Optional[int] = option(None, ge=1, help="batch samples the factors are built from at a "
                                                            "refresh; unset: the whole batch")
    split_indices: Optional[list[int]] = option(None, ge=0, help="multi-process: layer indices where the "
                                                                 "inverses' all-reduce groups split")
    ekfac_decay: Optional[float] = option(None, ge=0, le=1, help="eigenvalue-corrected THOR (EKFAC, George et al. "
                                                                 "2018): a refresh keeps the factors' eigenbases, "
                                                                 "and every update divides the gradient in them by "
                                                                 "a running second moment with this decay (1: "
                                                                 "never updated, the Kronecker eigenvalues); unset: "
                                                                 "THOR's inverses (optimizer thor_ekfac: "
                                                                 f"{EKFAC_DECAY})")
    damping_mode: str = option("absolute", choices=DAMPING_MODES,
                               help="how the damping reaches the factors A and G (conv: T positions per sample): "
                                    "absolute = sqrt(damping/T) added to each (MindSpore's: not scale-aware, kept to "
                                    "match it); trace = damping x the factor's mean eigenvalue tr(F)/dim added to each "
                                    "(scale-free: damping is then a fraction); pi = Martens & Grosse's pi-damping, "
                                    "A + pi sqrt(damping/T), G + sqrt(damping/T) / pi with pi = sqrt((tr(A)/dim A) / "
                                    "(tr(G)/dim G)); with ekfac_decay the divisor's epsilon: absolute = damping, "
                                    "trace = damping x the layer's mean second moment (pi: not with ekfac_decay); "
                                    "under thor_soap Adam's epsilon: damping, or (trace) damping x the layer's mean "
                                    "root second moment; trace damps small factors far less, so without a graft "
                                    "its lr sits ~100x lower (Fashion-MNIST CNN: 0.00128 vs 0.2; above 0.02 it "
                                    "diverged); raced as a variant, thor[damping_mode=trace]")
    inverse_root: int = option(1, choices=(1, 2),
                               help="the power of the damped factors THOR applies: 1 = A^-1 and G^-1 (the natural "
                                    "gradient); 2 = A^-1/2 and G^-1/2 (Shampoo's root, by an eigendecomposition of "
                                    "each block); with ekfac_decay the eigenbasis divisor (s + damping)^(1/root): 2 "
                                    "is an Adam-style second moment; raced as a variant, thor[inverse_root=2], and as "
                                    "SOAP-Muon, thor_muon[ekfac_decay=0.95,inverse_root=2]")
    factor_decay: Optional[float] = option(None, ge=0, lt=1,
                                           help="a moving average of the factors over refreshes, A <- decay A + (1 - "
                                                "decay) A_batch (kfac-pytorch: 0.95; the SOAP paper's shampoo_beta); "
                                                "unset: each refresh builds the factors from its own batch "
                                                "(MindSpore's)")
    soap_beta2: float = option(0.95, gt=0, lt=1, help="thor_soap: decay of Adam's second moment in the eigenbasis "
                                                      "of THOR's factors (its beta1 is the optimizer's momentum)")
    decoupled_decay: bool = option(False, help="THOR's weight decay taken from the weights after the (grafted) step, "
                                               "w <- w (1 - lr wd), as AdamW and Muon do; false: MindSpore's order, "
                                               "wd x w added to the preconditioned gradient before momentum and the "
                                               "graft, so its strength varies by layer; THOR's own step only")
    graft_layers: str = option("all", choices=("all", "hidden"),
                               help="which weights THOR preconditions (and grafts): all = every Conv2d/Linear; "
                                    "hidden = "
                                    "not the input layer nor the classifier (Muon's split), which keep their plain "
                                    "gradient and the optimizer's own step, as Muon hands them to AdamW")
    project_radial: bool = option(False, help="the radial part of each BatchNorm-fed conv's preconditioned "
                                              "gradient removed per output filter, u - (<u, w>/|w|^2) w (AdamP/SGDP, "
                                              "Heo et al. 2021, without SGDP's cosine test): BatchNorm makes the "
                                              "filter scale-invariant, and the preconditioner's radial part only "
                                              "changes its norm; raced as a variant, thor[project_radial=true]")

    REMOVED: ClassVar[dict[str, Removed]] = {
        "factor_interval": _ONE_FREQUENCY, "inv_interval": _ONE_FREQUENCY,
        "inverse_method": Removed("never shown to pay in a race; the inverses are Cholesky's", "cholesky"),
        "trace_threshold": Removed(_TRACE_SKIP), "interval_growth": Removed(_TRACE_SKIP, 1),
        "max_interval_mult": Removed(_TRACE_SKIP, 8),
        "loss_reduction": Removed("THOR takes the loss as a batch mean; for a summed loss set loss_scale to the "
                                  "batch size", "mean"),
        "max_damping_retries": Removed("never shown to pay in a race; a failing inversion is retried 3 times "
                                       "with 10x the damping", 3),
        "kl_clip": Removed(_NO_GAIN), "max_dim": Removed("never shown to pay in a race"),
        "batchnorm": Removed(f"unit-wise BatchNorm preconditioning: {_NO_GAIN}", "none"),
        "first_order_after": _FIRST_ORDER}


THOR_FIELDS = tuple(f.name for f in fields(ThorOptions))


@dataclass
class PreconditionerArgs:
    """ThorPreconditioner's Python-only arguments with rules (live objects, the trainer's accumulation)."""

    accumulation_steps: int = option(1, ge=1)
    grad_scaler: Any = option(None)
    process_group: Any = option(None)


@dataclass
class ThorArgs(PreconditionerArgs):
    """...and the THOR optimizer's own SGD arguments."""

    lr: float = option(0.0, ge=0)
    momentum: float = option(0.9, ge=0)
    weight_decay: float = option(0.0, ge=0)
    nesterov: bool = option(False)
    decay_filter: Any = option(None)  # None or a callable(name) -> bool


def _without_schedules(values: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """`values` less the schedules among `keys` given as a callable or an array (Python-only forms, checked here)."""
    out = dict(values)
    for key in keys:
        v = out.get(key)
        if callable(v) or isinstance(v, (np.ndarray, Tensor)):
            if not callable(v) and np.size(v) == 0:
                raise ConfigError(f"THOR {key} schedule is empty", "give a float or a non-empty array")
            del out[key]
    return out


def check_thor_options(options: Mapping[str, Any], *, also: Iterable[str] = ()) -> None:
    """ThorOptions' rules on options given by name, without a model (`damping` may also be an array or a
    callable). An unknown name is a one-line ConfigError with the closest valid one (ThorOptions' fields and
    `also`, the caller's other arguments); a removed one says why it went."""
    for key in options:
        if key in ThorOptions.REMOVED:
            ThorOptions.REMOVED[key].check(f"THOR option {key}", options[key], "delete the argument")
        elif key not in THOR_FIELDS:
            raise ConfigError(f"unknown THOR option '{key}'", suggest(str(key), [*THOR_FIELDS, *also]))
    current = {k: v for k, v in options.items() if k not in ThorOptions.REMOVED}
    check_options(_without_schedules(current, ("damping",)), ThorOptions, "THOR")
    if current.get("ekfac_decay") is not None and current.get("damping_mode") == "pi":
        # pi splits the damping between A and G; EKFAC adds its epsilon to the eigenvalues of their product
        raise ConfigError("THOR damping_mode=pi splits the damping between the factors, and ekfac_decay (thor_ekfac) "
                          "damps the eigenvalues of their product instead", "use damping_mode trace (relative) or "
                          "absolute")


def check_thor_args(values: Mapping[str, Any], cls: type = ThorArgs) -> None:
    """The Python-only arguments' rules (`lr` may also be an array or a callable)."""
    check_options(_without_schedules(values, ("lr",)), cls, "THOR")
    decay_filter = values.get("decay_filter")
    if decay_filter is not None and not callable(decay_filter):
        raise ConfigError(f"THOR decay_filter must be None or a callable(name) -> bool, got {decay_filter!r}",
                          "pass a function of the parameter name")


def thor_options(options: ThorOptions | None, overrides: Mapping[str, Any],
                 args: type = PreconditionerArgs) -> ThorOptions:
    """`options` (None: the defaults) with `overrides` (ThorOptions field names) laid over, checked: a new
    ThorOptions, so the caller's object is never changed. `args`: the caller's Python-only arguments, named
    in the did-you-mean of an unknown override."""
    options = ThorOptions() if options is None else options
    if not isinstance(options, ThorOptions):
        raise ConfigError(f"THOR options must be a ThorOptions, got {type(options).__name__}",
                          "pass ThorOptions(...), or the options as keyword arguments")
    extra = [f.name for f in fields(options) if f.name not in THOR_FIELDS]
    if extra:  # a subclass's own keys (a recipe's epoch-counted ones) would be silently ignored here
        raise ConfigError(f"THOR options {type(options).__name__} carry {', '.join(extra)}, which THOR does not read",
                          "convert them to a ThorOptions first (recipes: thor_per_update)")
    values = {**{name: getattr(options, name) for name in THOR_FIELDS}, **overrides}
    check_thor_options(values, also=[f.name for f in fields(args)])
    return ThorOptions(**{k: v for k, v in values.items() if k in THOR_FIELDS})
