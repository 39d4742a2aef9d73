"""THOR, MindSpore's second-order optimizer, as a torch.optim.Optimizer.

One concern per module: `args` declares the options (`ThorOptions`, the one list of them) and checks them
(`check_thor_options`), `factors` captures layer inputs/output gradients (hooks), `inverse` builds the damped
block-split inverses, `eigen` EKFAC's block eigenbases and second moment (option `ekfac_decay`), `layer` holds
one preconditioned layer's state, `distributed` averages factors and shares inverses across ranks, `schedules`
are MindSpore's lr/damping generators, `preconditioner` is the curvature applied to `.grad` before any
optimizer (`ThorPreconditioner`), `optimizer` is THOR's momentum update built on it, and `wrap` puts the
preconditioner in front of any optimizer as one Optimizer (`ThorPreconditioned`, `thor_muon`), `soap` is SOAP in
THOR's eigenbasis (`ThorSOAP`), and `health` says whether each factor side and divisor acts (`thor_health`).
"""

from torchboost.optim.thor.args import ThorOptions, check_thor_options
from torchboost.optim.thor.optimizer import THOR
from torchboost.optim.thor.preconditioner import ThorPreconditioner
from torchboost.optim.thor.schedules import get_thor_damping, get_thor_lr
from torchboost.optim.thor.wrap import ThorPreconditioned, thor_muon
from torchboost.optim.thor.soap import ThorSOAP
from torchboost.optim.thor.health import thor_health

__all__ = ["THOR", "ThorOptions", "ThorPreconditioner", "ThorPreconditioned", "thor_muon", "ThorSOAP", "thor_health",
           "check_thor_options", "get_thor_lr", "get_thor_damping"]
