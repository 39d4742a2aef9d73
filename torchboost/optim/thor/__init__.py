"""THOR, MindSpore's second-order optimizer, as a torch.optim.Optimizer.

One concern per module: `factors` captures layer inputs/output gradients (hooks), `inverse` builds the
damped block-split inverses, `layer` holds one preconditioned layer's state, `distributed` averages
factors and shares inverses across ranks, `schedules` are MindSpore's lr/damping generators, `args`
validates the options (`check_thor_options`), `preconditioner` is the curvature applied to `.grad` before
any optimizer (`ThorPreconditioner`) and `optimizer` is THOR's momentum update built on it.
"""

from torchboost.optim.thor.args import check_thor_options
from torchboost.optim.thor.optimizer import THOR, thor
from torchboost.optim.thor.preconditioner import ThorPreconditioner
from torchboost.optim.thor.schedules import get_thor_damping, get_thor_lr

__all__ = ["THOR", "thor", "ThorPreconditioner", "check_thor_options", "get_thor_lr", "get_thor_damping"]
