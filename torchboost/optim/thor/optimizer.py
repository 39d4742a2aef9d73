"""THOR (MindSpore's second-order optimizer) as a torch.optim.Optimizer, built on ThorPreconditioner.

Usage in a plain loop (no model conversion):

    opt = THOR(model, lr=get_thor_lr(...), damping=get_thor_damping(...), weight_decay=5e-4)
    opt = THOR(model, 0.1, ThorOptions(damping=0.1, frequency=10), weight_decay=5e-4)  # options as one object
    loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()

Every trainable Conv2d (any stride/padding/padding_mode/dilation; groups > 1 get one Kronecker factor
pair per group, the natural block-diagonal structure of a grouped conv) and Linear weight is
preconditioned as G^-1 grad A^-1 (MindSpore's damping and 1/T rules); biases, BatchNorm, Conv1d/3d and
everything else get plain momentum SGD. Then g += weight_decay * w; v = momentum * v + g; w -= lr * v.

A module called several times per forward pools the statistics of all calls (T counts the positions of
every call). A module not run with gradients on a refresh step has no curvature yet: it keeps the plain
gradient (with a one-time warning if it has one) and its refresh is retried at every update until it runs.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from torchboost.errors import ConfigError
from torchboost.optim.thor.args import Schedule, ThorArgs, ThorOptions, Value, check_thor_args, thor_options
from torchboost.optim.closure import evaluate_closure
from torchboost.optim.lr import follow_schedule, lrs_as_tensors
from torchboost.optim.thor.preconditioner import PreconditionedProtocol, ThorPreconditioner


class THOR(PreconditionedProtocol, torch.optim.Optimizer):
    """Trace-based Hardware-driven layer-ORiented natural gradient (Chen et al., AAAI 2021): a
    `ThorPreconditioner` followed by MindSpore's momentum update.

    `lr`: a float (torch's lr schedulers act on it), a per-update array or a callable of the update index.
    `options` / `**overrides`: the curvature options, a `ThorOptions` and/or its fields by name (its fields'
    helps say what each does). THOR's own SGD: `momentum`, `weight_decay` (added to the preconditioned
    gradient, MindSpore's order; with the option `decoupled_decay`, taken from the weights after the step),
    `nesterov`, `decay_filter(name) -> bool` (False = no weight decay for that parameter). Python-only, passed
    to the preconditioner: `accumulation_steps`, `grad_scaler`, `process_group`.
    The options' `loss_scale` is a fixed loss scale the caller applies (a FixedGradScaler): gradients are
    divided by it, G by its square. The damping has one source, the preconditioner's schedule:
    `opt.preconditioner.damping_at()` reads it, `opt.preconditioner.set_damping(...)` replaces it.
    """

    compilable = True  # the update between refreshes (compile_own_step); a refresh runs eagerly

    def __init__(self, model: nn.Module, lr: Schedule, options: ThorOptions | None = None, *, momentum: float = 0.9,
                 weight_decay: float = 0.0, nesterov: bool = False, decay_filter: Callable[[str], bool] | None = None,
                 accumulation_steps: int = 1, grad_scaler: torch.amp.GradScaler | None = None,
                 process_group: dist.ProcessGroup | None = None, **overrides: Any) -> None:
        check_thor_args(dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                             decay_filter=decay_filter))
        self.preconditioner = ThorPreconditioner(model, thor_options(options, overrides, ThorArgs),
                                                 accumulation_steps=accumulation_steps, grad_scaler=grad_scaler,
                                                 process_group=process_group)
        decay, no_decay, edge = [], [], []
        # graft_layers hidden: the input layer and classifier, unpreconditioned, take their own step ("graft" False)
        hidden = {id(p) for p, _ in self.preconditioner.layer_of} if self.options.graft_layers == "hidden" else None
        for name, p in model.named_parameters():
            if p.requires_grad:
                decays = decay_filter is None or decay_filter(name)
                (edge if hidden is not None and p.ndim >= 2 and id(p) not in hidden and decays
                 else decay if decays else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0},
                  {"params": edge, "weight_decay": weight_decay, "graft": False}]
        schedule = Value(lr, "lr")
        defaults = dict(lr=schedule.initial(lr), momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
        super().__init__([g for g in groups if g["params"]], defaults)
        self._graft_norms: dict[Tensor, Tensor] = {}
        self._compiled: Callable[[], None] | None = None  # compile_own_step
        self._lr_tensors: list[Tensor] = []
        if schedule.constant is None:  # MindSpore's per-update lr array (or a callable): it writes the groups' lr
            follow_schedule(self, schedule, lambda: self.update_index)

    # the preconditioner's state, read through the optimizer (schedules and tests use them)
    options = property(lambda self: self.preconditioner.options, doc="The curvature options (a ThorOptions).")
    layers = property(lambda self: self.preconditioner.layers)
    counters = property(lambda self: self.preconditioner.counters)
    update_index = property(lambda self: self.preconditioner.update_index,
                            doc="Index of the next update (what lr/damping schedules are evaluated at).")

    # ---- the update ---------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = evaluate_closure(closure)
        if self._compiled is not None and not self.preconditioner.refresh_due():
            with lrs_as_tensors(self, self._lr_tensors):  # between refreshes: the compiled update
                self._compiled()
            self.preconditioner.advance()
            return loss
        graft = self.options.graft
        if graft == "sgd_step":  # SGD's own momentum of the plain gradients, taken before they are preconditioned
            for group in self.param_groups:
                self._graft_momentum(group)
        self.preconditioner.step()
        for group in self.param_groups:
            self._sgd_update(group, graft)
        return loss

    def compile_own_step(self, mode: str) -> bool:
        """torch.compile the update between refreshes (`plain_update`); a refresh stays eager (its inversions
        and host-side bookkeeping). EKFAC updates its moments from a per-update damping: not compiled."""
        if mode == "reduce-overhead":  # train.compile=cudagraphs
            # a CUDA graph replays fixed addresses: THOR's p.grad is a fresh tensor every update and a refresh writes
            # new inverses, so each would be copied into the graph's static inputs (or a stale one replayed)
            raise ConfigError("THOR under CUDA graphs (train.compile=cudagraphs): its gradients and inverses are new "
                              "tensors every update and refresh, not the static buffers a graph replays",
                              "use train.compile=default (or none)")
        if self.preconditioner._ekfac:
            raise ConfigError("thor_ekfac's step cannot be compiled (its eigenvalue update takes the damping of "
                              "each update)", "train thor_ekfac with compile=none, or compile thor")
        self._compiled = torch.compile(self.plain_update, mode=mode)
        self._lr_tensors = [torch.zeros((), device=g["params"][0].device) for g in self.param_groups]
        return True

    def plain_update(self) -> None:
        """An update from the curvature as it is: graft, precondition, momentum SGD."""
        graft = self.options.graft
        if graft == "sgd_step":
            for group in self.param_groups:
                self._graft_momentum(group)
        self.preconditioner.precondition_grads()
        for group in self.param_groups:
            self._sgd_update(group, graft)

    def _graft_momentum(self, group: dict) -> None:
        """m <- momentum * m + (g + weight_decay * w) on the plain gradient: the step SGD would take is lr * m
        (g + momentum * m with Nesterov), whose norm `graft="sgd_step"` gives THOR's step."""
        if not group.get("graft", True):
            return
        for p in group["params"]:
            if p.grad is None:
                continue
            g = p.grad / self.options.loss_scale
            if group["weight_decay"] and not self.options.decoupled_decay:
                g = g.add(p, alpha=group["weight_decay"])
            state = self.state[p]
            if "graft_buffer" not in state:
                state["graft_buffer"] = g.clone()  # v0 = 0 -> v1 = g, as THOR's own buffer starts
            else:
                state["graft_buffer"].mul_(group["momentum"]).add_(g)
            # the step's norm, kept until this update's _sgd_update (the plain gradient is gone by then)
            self._graft_norms[p] = (g.add(state["graft_buffer"], alpha=group["momentum"]) if group["nesterov"]
                                    else state["graft_buffer"]).norm()

    def _sgd_update(self, group: dict, graft: str = "none") -> None:
        params, grads, bufs = [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ConfigError("THOR does not support sparse gradients", "use dense embeddings/layers")
            params.append(p)
            scale = self.options.loss_scale
            grads.append(p.grad if scale == 1.0 else p.grad / scale)
            bufs.append(self.state[p].get("momentum_buffer"))
        if not params:
            return
        decoupled = self.options.decoupled_decay
        if group["weight_decay"] and not decoupled:
            # MindSpore order: decay is added to the PRECONDITIONED gradient
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
        mu = group["momentum"]
        if mu:
            old = [i for i, b in enumerate(bufs) if b is not None]
            if old:
                torch._foreach_mul_([bufs[i] for i in old], mu)
                torch._foreach_add_([bufs[i] for i in old], [grads[i] for i in old])
            for i, p in enumerate(params):
                if bufs[i] is None:  # v0 = 0 -> v1 = g (MindSpore's ApplyMomentum from zero moments)
                    bufs[i] = self.state[p]["momentum_buffer"] = grads[i].detach().clone()
            step = torch._foreach_add(grads, bufs, alpha=mu) if group["nesterov"] else bufs
        else:
            step = grads
        if graft in ("sgd_step", "muon_step") and group.get("graft", True):
            step = [self._grafted(p, s, graft) for p, s in zip(params, step)]
        if group["weight_decay"] and decoupled:  # AdamW's order: the weights shrink, whatever the step's size
            torch._foreach_mul_(params, 1.0 - group["lr"] * group["weight_decay"])
        if isinstance(group["lr"], Tensor):  # compiled (a 0-d tensor for the call); alpha must be a number
            torch._foreach_add_(params, torch._foreach_mul(step, group["lr"]), alpha=-1.0)
        else:
            torch._foreach_add_(params, step, alpha=-group["lr"])

    def _grafted(self, p: Tensor, step: Tensor, graft: str) -> Tensor:
        """THOR's step for `p` with the norm (per unit of lr) of the grafted optimizer's: SGD's momentum step, or
        an orthogonal update of p's matrix shape at Muon's lr scaling (a vector keeps THOR's own step: Muon
        leaves vectors to AdamW)."""
        if graft == "sgd_step":
            norm = self._graft_norms.pop(p)
        elif p.ndim < 2:
            return step
        else:
            rows, cols = p.shape[0], p[0].numel()
            norm = math.sqrt(max(1.0, rows / cols)) * math.sqrt(min(rows, cols))
        return step * (norm / step.norm().clamp_min(torch.finfo(step.dtype).tiny))

    # ---- state ------------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        thor = state_dict.pop("thor", None)
        super().load_state_dict(state_dict)
        if thor is not None:
            self.preconditioner.load_state_dict(thor)


