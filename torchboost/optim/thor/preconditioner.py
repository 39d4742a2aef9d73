"""ThorPreconditioner: THOR's Kronecker-factored curvature, applied to `.grad` in place before any optimizer.

    pre = ThorPreconditioner(model, damping=0.03, frequency=10)       # or ThorPreconditioner(model, ThorOptions(...))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)     # or SGD, Muon, ...
    loss.backward(); pre.step(); opt.step(); opt.zero_grad()

Every trainable Conv2d (any stride/padding/padding_mode/dilation; groups > 1 get one Kronecker factor pair
per group) and Linear weight gradient becomes (G + sqrt(l) I)^-1 grad (A + sqrt(l) I)^-1 (MindSpore's
rules: conv 1/T damping, `split_dim` blocks); every other gradient is left as it is. `THOR` is this plus
MindSpore's momentum update. With `ekfac_decay` set, a refresh keeps the factors' eigenbases instead and every
update rescales the gradient in them by a running second moment (EKFAC: `eigen`); `eigenbases=True` keeps the
eigenbases for an optimizer that rotates the gradient itself (`soap.ThorSOAP`: `refresh`, then its own step).
Off by default, each raced as a variant: `damping_mode` (trace, pi: each factor damped by its own scale; EKFAC's
epsilon relative to its moment), `inverse_root` 2 (the factors' inverse square roots, or EKFAC's root of its
moment), `project_radial` (a BatchNorm-fed conv's radial part removed, per filter, after the preconditioning),
`factor_decay` (a moving average of the factors over refreshes).

A module called several times per forward pools the statistics of all calls. A module not run with
gradients on a refresh step has no curvature yet: its gradient stays plain (one-time warning) and its
refresh is retried at every update until it runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from torchboost.errors import CheckpointError, ConfigError
from torchboost.optim.protocol import TrainerProtocol
from torchboost.optim.muon import muon_split
from torchboost.optim.thor import distributed as thor_dist
from torchboost.optim.thor.args import (PreconditionerArgs, Schedule, ThorOptions, Value, check_thor_args,
                                        check_thor_options, thor_options)
from torchboost.optim.thor.factors import DetachedHook, armed_hook, factor_dtype
from torchboost.optim.thor.inverse import damped_inverses
from torchboost.optim.thor.layer import ThorLayer, find_layers
from torchboost.optim.weight_norm import bn_fed_convs, remove_radial


class ThorPreconditioner:
    """THOR's curvature machinery. `options`: a `ThorOptions` (None: its defaults), whose fields' helps say what
    each option does; `**overrides`: any of its fields by name, laid over it (an unknown name is a one-line
    ConfigError). The result is `self.options`. Python-only: `accumulation_steps` (micro-batches summed per
    update), `grad_scaler` (torch.amp.GradScaler: G is unscaled by its live scale), `process_group`
    (torch.distributed: factors averaged over ranks, each inversion done on one rank and shared), `eigenbases`
    (keep the factors' eigenbases, not inverses, whatever ekfac_decay says: for an optimizer that uses them)."""

    def __init__(self, model: nn.Module, options: ThorOptions | None = None, *, accumulation_steps: int = 1,
                 grad_scaler: torch.amp.GradScaler | None = None, process_group: dist.ProcessGroup | None = None,
                 eigenbases: bool = False, **overrides: Any) -> None:
        self.options = thor_options(options, overrides)
        self.keeps_bases = eigenbases or self.options.ekfac_decay is not None  # eigenbases, not inverses
        check_thor_args(dict(accumulation_steps=accumulation_steps), PreconditionerArgs)
        self._damping = Value(self.options.damping, "damping")  # the options' damping as a schedule (damping_at)
        self.grad_scaler, self.accumulation_steps, self.process_group = grad_scaler, accumulation_steps, process_group
        # local_inversions: inversions this rank computed (all of them in one process; a share under
        # torch.distributed, where the others arrive from their owner ranks)
        self.counters = dict(refreshes=0, damping_retries=0, inverse_failures=0, capture_failures=0,
                             local_inversions=0)
        self.update_index = 0  # index of the next update (what the damping schedule is evaluated at)
        self._forward_id = 0
        self._samples = 0  # samples of the forwards with gradients since the last update (EKFAC's moment scale)
        self.model, self._pre_hook, self._removed = model, None, False
        self.layers: dict[str, ThorLayer] = find_layers(model, self.options.split_dim, self._grad_scale,
                                                        lambda: self._forward_id, self.options.factor_samples)
        if self.options.graft_layers == "hidden":  # the input layer and the classifier keep their plain gradient
            edge = {id(p) for p in muon_split(model)[1]}
            for name in [n for n, l in self.layers.items() if id(l.module.weight) in edge]:
                self.layers.pop(name).capture.remove()
        # (weight, layer) pairs as a list, not a dict keyed by tensors: torch.compile guards a dict's tensor keys'
        # .grad by identity, and every update's new gradients would recompile the step
        self.layer_of: list[tuple[Tensor, ThorLayer]] = [(l.module.weight, l) for l in self.layers.values()]
        if self.options.project_radial:
            fed = {id(c) for c in bn_fed_convs(model)}  # weight_norm's detection: conv -> BatchNorm2d
            for l in self.layers.values():
                l.radial = id(l.module) in fed
        self._arm_capture()

    _ekfac = property(lambda self: self.keeps_bases, doc="eigenbases (EKFAC's, or thor_soap's), not inverses")

    # ---- hooks' view ------------------------------------------------------------------------------
    def _count_forward(self, module: nn.Module, inputs: tuple) -> None:
        self._forward_id += 1
        if torch.is_grad_enabled():
            x = next((v for v in inputs if isinstance(v, Tensor) and v.dim() > 0), None)
            self._samples += 0 if x is None else x.shape[0]

    def _grad_scale(self) -> float:
        """What the backpropagated loss carries on top of one mean-reduced micro-batch loss."""
        scale = self.options.loss_scale / self.accumulation_steps
        if self.grad_scaler is not None and self.grad_scaler.is_enabled():
            scale *= self.grad_scaler.get_scale()
        return scale

    def _arm_capture(self) -> None:
        """Capture statistics during the coming update only for layers that will refresh at it. Hooks exist
        only then (EKFAC counts every update's samples: its pre-hook stays)."""
        for l in self.layers.values():
            l.capture.enabled = self.update_index >= l.next_inverse
        armed = (self.options.ekfac_decay is not None or self.refresh_due()) and not self._removed
        self._pre_hook = armed_hook(self._pre_hook, armed,
                                    lambda: self.model.register_forward_pre_hook(DetachedHook(self._count_forward)))

    def refresh_due(self) -> bool:
        """Whether the coming update refreshes a layer (its forward must then run eagerly, with the hooks)."""
        return any(l.capture.enabled for l in self.layers.values())

    # ---- the update ---------------------------------------------------------------------------------
    def damping_at(self, k: int | None = None) -> float:
        """The damping of update `k` (default: the coming one) from the one schedule (float, per-update array
        or callable); `set_damping` replaces it."""
        return self._damping(self.update_index if k is None else k)

    def set_damping(self, damping: Schedule) -> None:
        """Replace the damping schedule from the coming update on (a float, an array by update index, or a
        callable of it)."""
        check_thor_options(dict(damping=damping))
        self._damping = Value(damping, "damping")
        self.options.damping = damping

    @torch.no_grad()
    def step(self) -> None:
        """Refresh what is due, then overwrite each preconditioned layer's `.grad` with G^-1 grad A^-1. Call
        after backward (and after any `GradScaler.unscale_`), before the optimizer's step."""
        k = self.update_index
        damping = self.damping_at(k)
        if not damping > 0:
            raise ConfigError(f"THOR damping must be > 0, got {damping} at update {k}", "use a positive damping")
        self._refresh(k, damping)
        self.precondition_grads(damping)
        self.advance()

    @torch.no_grad()
    def refresh(self) -> None:
        """Refresh what is due (factors, then inverses or eigenbases) at the coming update's damping, leaving `.grad`
        alone: for an optimizer that applies the curvature itself (it calls `advance` when its update is done)."""
        self._refresh(self.update_index, self.damping_at())

    def precondition_grads(self, damping: float = 0.0) -> None:
        """Overwrite each preconditioned layer's `.grad` with its preconditioned gradient, from the curvature
        as it is (no refresh: what a compiled step between refreshes runs; `damping` is EKFAC's only)."""
        decay, moment_scale, root = self.options.ekfac_decay, self._moment_scale(), self.options.inverse_root
        relative = self.options.damping_mode == "trace"  # EKFAC's epsilon: damping x the layer's mean moment
        for p, layer in self.layer_of:
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise ConfigError("THOR does not support sparse gradients", "use dense layers")
                g = (layer.precondition(p.grad) if decay is None
                     else layer.precondition_eigen(p.grad, damping, decay, moment_scale, root, relative))
                if layer.radial:  # before the graft, which sizes the direction that is applied
                    g = remove_radial(g, p)
                if self.options.graft == "grad":
                    g = g * (p.grad.norm() / g.norm().clamp_min(torch.finfo(g.dtype).tiny))
                p.grad.copy_(g)

    def advance(self) -> None:
        """The update is done: the next one's index, and its capture armed or not."""
        self.update_index += 1
        self._arm_capture()

    def _moment_scale(self) -> float:
        """EKFAC's c in s <- beta s + (1 - beta) c W'^2: s is a per-sample Fisher (THOR's G holds per-sample output
        gradients), W the gradient of loss_scale x the mean loss over the update's N samples (on every rank:
        N = this rank's samples x ranks), so E[W'^2] ~ loss_scale^2 F' / N and c = N / loss_scale^2. N is
        counted by the model's forward pre-hook (the first tensor argument's batch dimension)."""
        samples, self._samples = self._samples, 0
        decay = self.options.ekfac_decay
        if decay is None or decay == 1.0:
            return 1.0
        if samples == 0:
            raise ConfigError("THOR ekfac_decay needs the update's sample count, and the model's forwards with "
                              "gradients took no tensor argument", "pass the batch to the model as a positional "
                              "tensor, or leave ekfac_decay unset")
        return samples * thor_dist.world_size(self.process_group) / self.options.loss_scale ** 2

    # ---- refresh: factors -> (average over ranks) -> inverses ------------------------------------------
    def _refresh(self, k: int, damping: float) -> None:
        due = [l for l in self.layers.values() if l.capture.enabled]
        if not due:
            return
        stats = [l.capture.consume() for l in due]
        world = thor_dist.world_size(self.process_group)
        if world > 1:
            w = due[0].module.weight
            shapes = [l.factor_shapes() for l in due]
            stats = thor_dist.average_factors(stats, shapes, factor_dtype(w), w.device, self.process_group,
                                              self.options.split_indices)
        finite = _all_finite([s for s in stats if s is not None])
        fresh: list[ThorLayer] = []
        for l, s in zip(due, stats):
            if s is None or not finite.pop(0):
                # not run with gradients, or an overflowed backward: keep the old curvature, retry next update
                self.counters["capture_failures"] += s is not None
                continue
            l.A, l.G, l.T = _averaged(l, s, self.options.factor_decay)
            fresh.append(l)
        self._invert(k, damping, fresh, world)

    def _invert(self, k: int, damping: float, todo: list[ThorLayer], world: int) -> None:
        if not todo:
            return
        rank = dist.get_rank(self.process_group) if world > 1 else 0
        owners = thor_dist.assign_owners([l.inverse_cost() for l in todo], world)
        mine = [l for l, owner in zip(todo, owners) if owner == rank]
        if self._ekfac:
            done = [_eigenbases(l) for l in mine]
        else:  # every layer's factors in a few batched inversions, one per block size
            mode, root = self.options.damping_mode, self.options.inverse_root
            inverses = damped_inverses([f for l in mine for f in l.to_invert(damping, mode, root)], root=root)
            done = [None if a is None or g is None else (a[0], g[0], a[1] + g[1])
                    for a, g in zip(inverses[::2], inverses[1::2])]
        by_layer = dict(zip(map(id, mine), done))
        results: list[tuple[Tensor, Tensor] | None] = []
        for l, owner in zip(todo, owners):
            if owner != rank:
                results.append(None)
                continue
            r = by_layer[id(l)]
            if r is None:  # still not positive definite after the damping retries: the old inverse stays
                self.counters["inverse_failures"] += 1
                results.append(None)
                continue
            self.counters["damping_retries"] += r[2]
            self.counters["local_inversions"] += 1
            results.append((r[0], r[1]))
        if world > 1:
            w = todo[0].module.weight
            results = thor_dist.share_inverses(results, [l.factor_shapes() for l in todo], factor_dtype(w),
                                               w.device, self.process_group)
        for l, r in zip(todo, results):
            l.next_inverse = k + self.options.frequency
            if r is not None:  # a failed inversion keeps the previous inverse (EKFAC: eigenbases) instead of NaN
                if self._ekfac:
                    l.set_eigenbases(*r)
                else:
                    l.A_inv, l.G_inv = r
                l.refreshes += 1
                self.counters["refreshes"] += 1

    # ---- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"update": self.update_index, "counters": dict(self.counters), "ekfac": self._ekfac,
                "layers": {name: l.state() for name, l in self.layers.items()}}

    def load_state_dict(self, state: dict) -> None:
        """A state from `state_dict`. One saved before THOR's options were pruned loads too: its removed
        bookkeeping (per-layer trace_ref, next_factor, interval_mult, skipped; counters such as
        skipped_refreshes; the unit-wise BatchNorm blocks under "units") is ignored."""
        missing = set(self.layers) ^ set(state["layers"])
        if missing:
            raise CheckpointError(f"THOR state does not match the model's layers: {sorted(missing)[:5]}",
                                  "load the optimizer state saved for this model")
        if bool(state.get("ekfac", False)) != self._ekfac:
            saved, this = ("EKFAC", "THOR's inverses") if state.get("ekfac") else ("THOR's inverses", "EKFAC")
            raise CheckpointError(f"THOR state holds {saved} and this optimizer uses {this}",
                                  "load it with the ekfac_decay setting (thor or thor_ekfac) it was saved with")
        self.update_index = int(state["update"])
        self.counters = {k: int(state["counters"].get(k, 0)) for k in self.counters}
        for name, l in self.layers.items():
            l.load(state["layers"][name])
        self._arm_capture()

    def remove_hooks(self) -> None:
        """Detach the hooks from the model (curvature stops being refreshed)."""
        self._removed = True
        self._pre_hook = armed_hook(self._pre_hook, False, lambda: None)
        for l in self.layers.values():
            l.capture.remove()


def _averaged(layer: ThorLayer, stats: tuple[Tensor, Tensor, float], decay: float | None
              ) -> tuple[Tensor, Tensor, float]:
    """A refresh's (A, G, T): the batch's, or with `factor_decay` their moving average with the layer's previous
    factors (the first refresh starts it from its batch, so it needs no bias correction)."""
    a, g, t = stats
    if decay is None or layer.A is None:
        return a, g, t
    return layer.A.mul(decay).add_(a, alpha=1.0 - decay), layer.G.mul(decay).add_(g, alpha=1.0 - decay), t


def _eigenbases(layer: ThorLayer) -> tuple[Tensor, Tensor, int] | None:
    try:
        return layer.eigenbases()
    except torch.linalg.LinAlgError:  # eigh did not converge: the old eigenbases stay
        return None


def _all_finite(stats: list[tuple[Tensor, Tensor, float]]) -> list[bool]:
    """Finiteness of every (A, G) pair with one host sync."""
    if not stats:
        return []
    flags = torch.stack([torch.isfinite(a).all() & torch.isfinite(g).all() for a, g, _ in stats])
    return [bool(f) and math.isfinite(t) for f, (_, _, t) in zip(flags.tolist(), stats)]


class PreconditionedProtocol(TrainerProtocol):
    """The trainer protocol of optimizers built on a `ThorPreconditioner` (THOR, ThorPreconditioned): the
    trainer's GradScaler goes to the preconditioner, which unscales its G factors by it."""

    preconditioner: ThorPreconditioner
    # the update between refreshes compiles (THOR: compile_own_step); a refresh's forward runs eagerly (hooks)
    compilable = False

    def attach_grad_scaler(self, scaler: torch.amp.GradScaler | None) -> None:
        self.preconditioner.grad_scaler = scaler

    def eager_forward(self) -> bool:
        return self.preconditioner.refresh_due()

    def state_dict(self) -> dict:
        """torch's, with the preconditioner's curvature under "thor" (each optimizer's load checks it its way)."""
        sd = super().state_dict()  # type: ignore[misc]  # torch.optim.Optimizer's, next in the subclass's MRO
        sd["thor"] = self.preconditioner.state_dict()
        return sd

    def remove_hooks(self) -> None:
        """Detach THOR's hooks from the model (curvature is no longer refreshed)."""
        self.preconditioner.remove_hooks()
