"""Evaluating the weights an optimizer declares for evaluation (`TrainerProtocol.swaps_weights`: schedule-free's
average of its iterates), the one way `Model.train` and the race do it: the weights swapped in through the
protocol, then BatchNorm's running statistics recomputed at them, since the ones the forward passes gathered
belong to the weights the step moved, not to these. The same recomputation on request for any optimizer
(`precise_bn`), for runs too short for the running averages to catch up.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable

import torch
from torch import nn

from ..optim.protocol import protocol_of

# schedulefree's README recomputes BatchNorm statistics over 50 training batches before an evaluation
BN_BATCHES = 50


def batchnorms(model: nn.Module) -> list[nn.Module]:
    """The model's BatchNorm layers that keep running statistics."""
    kinds = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
    return [m for m in model.modules() if isinstance(m, kinds) and m.track_running_stats]


@torch.no_grad()
def recompute_batchnorm(model: nn.Module, inputs: Iterable[torch.Tensor]) -> int:
    """BatchNorm's running statistics recomputed at the model's current weights: reset, then the plain average
    over `inputs` (momentum None: each batch counts alike) in training mode; every layer's momentum and the
    model's mode are restored. Returns the batches used (0 when the model has no BatchNorm: nothing is run)."""
    norms = batchnorms(model)
    if not norms:
        return 0
    momenta, was_training = [m.momentum for m in norms], model.training
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    count = 0
    try:
        for x in inputs:
            model(x)
            count += 1
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        model.train(was_training)
    return count


def to_eval_weights(optimizer: torch.optim.Optimizer | None, model: nn.Module,
                    inputs: Callable[[], Iterable[torch.Tensor]], precise_bn: int = 0) -> None:
    """Before an evaluation or a checkpoint: the optimizer's weights to evaluate in the parameters and, when they
    are not the ones the step moved, BatchNorm's statistics recomputed at them from up to BN_BATCHES training
    inputs (`inputs()`, called only then). `precise_bn` > 0: the statistics recomputed from that many at the
    weights the step moved too (PreciseBN: a short run's running averages trail weights that moved fast, and
    evaluation then normalises with statistics of weights long gone: validation at chance while training learns)."""
    protocol = protocol_of(optimizer) if optimizer is not None else None
    swaps = protocol is not None and protocol.swaps_weights
    if swaps:
        protocol.eval_weights()
    if swaps or precise_bn:
        recompute_batchnorm(model, itertools.islice(inputs(), max(precise_bn, BN_BATCHES if swaps else 0)))


def to_train_weights(optimizer: torch.optim.Optimizer | None) -> None:
    """Before the next update: the weights the step moves back in the parameters (a no-op for most optimizers)."""
    if optimizer is not None:
        protocol_of(optimizer).train_weights()
