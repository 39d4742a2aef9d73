"""SOAP (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam"): Adam run in the eigenbasis of
Shampoo's Kronecker-factored preconditioner, refreshed every few updates; the `heavyball` package's, behind the
trainer protocol.

heavyball compiles its kernels with torch.compile (max-autotune) on first use by default: minutes on a CPU, counted
in a race's first epoch, where every other racer runs eager unless `train.compile` says otherwise. Building one here
turns that off for heavyball in this process (`heavyball.utils.compile_mode = None`: its functions run eagerly).

Imported only when one is built: `heavyball` is an optional package (`pip install 'torchboost[optimizers]'`).
"""

from __future__ import annotations

import warnings

import heavyball
import heavyball.utils

from torchboost.optim.protocol import TrainerProtocol


PRECONDITION_FREQUENCY = 10  # updates between eigenbasis refreshes: the SOAP paper's default (heavyball's is 2)


class SOAP(heavyball.SOAP, TrainerProtocol):
    """heavyball.SOAP, eager, refreshing its eigenbases every PRECONDITION_FREQUENCY updates unless told otherwise,
    with the trainer's protocol."""

    compilable = False  # its step keeps host-side bookkeeping (preconditioner schedule, per-index state dicts)
    consume_grad = False  # torch's convention: step() leaves .grad for the caller (clipping logs, traces, zero_grad)

    def __init__(self, *args, precondition_frequency: int = PRECONDITION_FREQUENCY, **kwargs) -> None:
        heavyball.utils.compile_mode = None  # eager, as every other racer (see the module's docstring)
        # the trainer's schedule writes each group's lr every update, which heavyball's multi-tensor step (the one
        # used) supports but warns about as experimental
        warnings.filterwarnings("ignore", message="Learning rate changed between steps", module="heavyball")
        super().__init__(*args, precondition_frequency=precondition_frequency, **kwargs)
