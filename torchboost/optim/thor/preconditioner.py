"""ThorPreconditioner: THOR's Kronecker-factored curvature, applied to `.grad` in place before any optimizer.

    pre = ThorPreconditioner(model, damping=0.03, frequency=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)     # or SGD, Muon, ...
    loss.backward(); pre.step(); opt.step(); opt.zero_grad()

Every trainable Conv2d (any stride/padding/padding_mode/dilation; groups > 1 get one Kronecker factor pair
per group) and Linear weight gradient becomes (G + sqrt(l) I)^-1 grad (A + sqrt(l) I)^-1 (MindSpore's
rules: conv 1/T damping, `split_dim` blocks); with `batchnorm="unit_wise"` BatchNorm scale and shift are
preconditioned per channel (`unitwise`); every other gradient is left as it is. `THOR` is this plus
MindSpore's momentum update.

A module called several times per forward pools the statistics of all calls. A module not run with
gradients on a refresh step has no curvature yet: its gradient stays plain (one-time warning) and its
refresh is retried at every update until it runs.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from torchboost.errors import CheckpointError, ConfigError
from torchboost.optim.protocol import TrainerProtocol
from torchboost.optim.thor import distributed as thor_dist
from torchboost.optim.thor.args import Schedule, Value, check_thor_options
from torchboost.optim.thor.factors import DetachedHook, factor_dtype
from torchboost.optim.thor.layer import ThorLayer, find_layers
from torchboost.optim.thor.unitwise import UnitWiseLayer, find_batchnorms


class ThorPreconditioner:
    """THOR's curvature machinery. Args: `damping` (float, per-update array or callable), `frequency`
    (refresh interval; `factor_interval`/`inv_interval` split it, inv a multiple of factor),
    `split_dim` (block size of the inverses, None = whole), `factor_decay` (running-average factors;
    None = one mini-batch per refresh as in MindSpore), `inverse_method` "cholesky" | "eigen",
    `trace_threshold`/`interval_growth`/`max_interval_mult` (the paper's trace-based skip of refreshes),
    `loss_scale` (a fixed loss scale on the backward), `grad_scaler` (torch.amp.GradScaler: G is unscaled by
    its live scale), `accumulation_steps`, `loss_reduction` "mean" | "sum", `max_damping_retries`
    (Cholesky failures retry with 10x damping), `split_indices`/`process_group` (torch.distributed:
    factors averaged over ranks, each inversion done on one rank and shared), `graft` "none" | "grad"
    (layer-wise grafting: keep THOR's direction but give each layer the norm of its plain gradient, so
    the step size follows the lr as for SGD while the curvature only steers), `factor_samples` (refresh
    statistics from at most this many samples of the batch: a cheaper, unbiased estimate of A and G),
    `kl_clip` (K-FAC's trust region: one scale min(1, sqrt(kl_clip / |lr^2 sum <P g, g>|)) on every
    preconditioned gradient, the sum over the whole model as in kfac-pytorch), `batchnorm` "none" | "unit_wise"
    (BatchNorm scale/shift gradients times each channel's damped 2x2 Fisher inverse; see `unitwise`),
    `max_dim` (a factor side wider than this keeps only its diagonal: no d^3 work for very wide factors),
    `first_order_after` (curvature early, first-order late: from this update on no statistics are captured
    and no gradient is changed, so the optimizer runs its own first-order update; None: never)."""

    def __init__(self, model: nn.Module, damping: Schedule = 0.03, frequency: int = 100,
                 split_dim: int | None = 128, loss_scale: float = 1.0, *, factor_interval: int | None = None,
                 inv_interval: int | None = None, factor_decay: float | None = None,
                 inverse_method: str = "cholesky", trace_threshold: float | None = None,
                 interval_growth: int = 1, max_interval_mult: int = 8,
                 grad_scaler: torch.amp.GradScaler | None = None, accumulation_steps: int = 1,
                 loss_reduction: str = "mean", max_damping_retries: int = 3,
                 split_indices: Sequence[int] | None = None,
                 process_group: dist.ProcessGroup | None = None, graft: str = "none",
                 factor_samples: int | None = None, kl_clip: float | None = None,
                 batchnorm: str = "none", max_dim: int | None = None,
                 first_order_after: int | None = None) -> None:
        check_thor_options(dict(graft=graft, factor_samples=factor_samples, damping=damping, frequency=frequency,
                                kl_clip=kl_clip, batchnorm=batchnorm, max_dim=max_dim,
                                first_order_after=first_order_after,
                                split_dim=split_dim, loss_scale=loss_scale,
                                factor_interval=factor_interval, inv_interval=inv_interval,
                                factor_decay=factor_decay, inverse_method=inverse_method,
                                trace_threshold=trace_threshold, interval_growth=interval_growth,
                                max_interval_mult=max_interval_mult, accumulation_steps=accumulation_steps,
                                loss_reduction=loss_reduction, max_damping_retries=max_damping_retries),
                           preconditioner_only=True)
        self.damping = Value(damping, "damping")  # the one source of the damping (see damping_at)
        self.factor_interval = factor_interval or frequency
        self.inv_interval = inv_interval or frequency
        self.split_dim, self.loss_scale, self.factor_decay = split_dim, loss_scale, factor_decay
        self.inverse_method, self.max_damping_retries = inverse_method, max_damping_retries
        self.trace_threshold, self.interval_growth = trace_threshold, interval_growth
        self.max_interval_mult = max_interval_mult
        self.grad_scaler, self.accumulation_steps = grad_scaler, accumulation_steps
        self.split_indices, self.process_group = split_indices, process_group
        self.graft, self.kl_clip, self.first_order_after = graft, kl_clip, first_order_after
        # local_inversions: inversions this rank computed (all of them in one process; a share under
        # torch.distributed, where the others arrive from their owner ranks)
        self.counters = dict(refreshes=0, skipped_refreshes=0, damping_retries=0, inverse_failures=0,
                             capture_failures=0, local_inversions=0)
        self.update_index = 0  # index of the next update (what the damping schedule is evaluated at)
        self._forward_id = 0
        self._pre_hook = model.register_forward_pre_hook(DetachedHook(self._count_forward))
        self.layers: dict[str, ThorLayer] = find_layers(model, split_dim, self._grad_scale,
                                                        lambda: self._forward_id, loss_reduction == "mean",
                                                        factor_samples, max_dim)
        self.layer_of: dict[Tensor, ThorLayer] = {l.module.weight: l for l in self.layers.values()}
        self.units: dict[str, UnitWiseLayer] = (find_batchnorms(model, self._grad_scale, loss_reduction == "mean",
                                                                factor_samples)
                                                if batchnorm == "unit_wise" else {})
        self._arm_capture()

    # ---- hooks' view ------------------------------------------------------------------------------
    def _count_forward(self, module: nn.Module, inputs: tuple) -> None:
        self._forward_id += 1

    def _grad_scale(self) -> float:
        """What the backpropagated loss carries on top of one mean-reduced micro-batch loss."""
        scale = self.loss_scale / self.accumulation_steps
        if self.grad_scaler is not None and self.grad_scaler.is_enabled():
            scale *= self.grad_scaler.get_scale()
        return scale

    def _arm_capture(self) -> None:
        """Capture statistics during the coming update only for layers that will refresh at it. Without
        running averages only inverse steps need factors (in-between captures would be overwritten)."""
        curvature = not self.first_order(self.update_index)
        for l in [*self.layers.values(), *self.units.values()]:
            due = l.next_factor if self.factor_decay is not None else l.next_inverse
            l.capture.enabled = curvature and self.update_index >= due

    def first_order(self, k: int) -> bool:
        """Whether update `k` is past `first_order_after` (the gradients are left as they are)."""
        return self.first_order_after is not None and k >= self.first_order_after

    # ---- the update ---------------------------------------------------------------------------------
    def damping_at(self, k: int | None = None) -> float:
        """The damping of update `k` (default: the coming one) from the one schedule (float, per-update array
        or callable); `set_damping` replaces it."""
        return self.damping(self.update_index if k is None else k)

    def set_damping(self, damping: Schedule) -> None:
        """Replace the damping schedule from the coming update on (a float, an array by update index, or a
        callable of it)."""
        check_thor_options(dict(damping=damping), preconditioner_only=True)
        self.damping = Value(damping, "damping")

    @torch.no_grad()
    def step(self, lr: float | None = None) -> None:
        """Refresh what is due, then overwrite each preconditioned layer's `.grad` with G^-1 grad A^-1 (and
        each unit-wise BatchNorm's with F^-1 grad). Call after backward (and after any `GradScaler.unscale_`),
        before the optimizer's step. `lr`: this update's learning rate (what `kl_clip` bounds; THOR and
        `ThorPreconditioned` pass theirs)."""
        k = self.update_index
        if self.first_order(k):
            self.update_index += 1
            self._arm_capture()
            return
        damping = self.damping_at(k)
        if not damping > 0:
            raise ConfigError(f"THOR damping must be > 0, got {damping} at update {k}", "use a positive damping")
        if self.kl_clip is not None and lr is None:
            raise ConfigError("THOR kl_clip needs the update's learning rate", "call step(lr=...) on the "
                              "preconditioner (THOR and thor_muon pass their own)")
        self._refresh(k, damping)
        self._refresh_units(k, damping)
        pairs = self._preconditioned()
        scale = 1.0 if self.kl_clip is None else self._kl_scale(pairs, float(lr))
        for grad, new in pairs:
            grad.copy_(new if scale == 1.0 else new * scale)
        self.update_index += 1
        self._arm_capture()

    def _preconditioned(self) -> list[tuple[Tensor, Tensor]]:
        """(gradient, its preconditioned value) of every parameter the curvature covers, not yet written."""
        pairs = []
        for p, layer in self.layer_of.items():
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise ConfigError("THOR does not support sparse gradients", "use dense layers")
                g = layer.precondition(p.grad)
                if self.graft == "grad":
                    g = g * (p.grad.norm() / g.norm().clamp_min(torch.finfo(g.dtype).tiny))
                pairs.append((p.grad, g))
        for u in self.units.values():
            new = u.precondition()
            if new is not None:
                pairs += [(u.module.weight.grad, new[0]), (u.module.bias.grad, new[1])]
        return pairs

    def _kl_scale(self, pairs: list[tuple[Tensor, Tensor]], lr: float) -> float:
        """kfac-pytorch's trust region: min(1, sqrt(kl_clip / |lr^2 sum <P g, g>|)), the sum over the whole
        model's preconditioned parameters (one scale for all of them); 1 when the sum is 0."""
        if not pairs:
            return 1.0
        vg = torch.stack([(new * g).sum(dtype=torch.float64) for g, new in pairs]).sum().item() * lr**2
        return 1.0 if vg == 0 else min(1.0, math.sqrt(self.kl_clip / abs(vg)))

    # ---- refresh: factors -> (average over ranks) -> trace test -> inverses ----------------------------
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
                                              self.split_indices)
        finite = _all_finite([s for s in stats if s is not None])
        fresh: list[ThorLayer] = []
        for l, s in zip(due, stats):
            if s is None or not finite.pop(0):
                # not run with gradients, or an overflowed backward: keep the old curvature, retry next update
                self.counters["capture_failures"] += s is not None
                continue
            l.set_factors(*s, self.factor_decay)
            l.next_factor = k + self.factor_interval
            if k >= l.next_inverse:
                fresh.append(l)
        self._invert(k, damping, self._trace_filter(k, fresh), world)

    def _refresh_units(self, k: int, damping: float) -> None:
        """BatchNorm Fisher blocks: averaged over ranks like the factors, inverted on every rank (2x2: free)."""
        due = [u for u in self.units.values() if u.capture.enabled]
        if not due:
            return
        blocks = [u.capture.consume() for u in due]
        if thor_dist.world_size(self.process_group) > 1:
            # the factors' averaging, with the blocks as A and an empty G
            w, empty = due[0].module.weight, torch.Size([0])
            entries = [None if f is None else (f, f.new_zeros(empty), 1.0) for f in blocks]
            averaged = thor_dist.average_factors(entries, [(u.F_shape, empty) for u in due], factor_dtype(w),
                                                 w.device, self.process_group)
            blocks = [None if e is None else e[0] for e in averaged]
        seen = [f for f in blocks if f is not None]
        finite = torch.stack([torch.isfinite(f).all() for f in seen]).tolist() if seen else []
        for u, f in zip(due, blocks):
            if f is None or not finite.pop(0):
                self.counters["capture_failures"] += f is not None
                continue
            u.set_factors(f, self.factor_decay)
            u.next_factor = k + self.factor_interval
            if k >= u.next_inverse:
                u.invert(damping)
                u.next_inverse = k + self.inv_interval

    def _trace_filter(self, k: int, fresh: list[ThorLayer]) -> list[tuple[ThorLayer, float]]:
        traces = torch.stack([l.trace_product().double() for l in fresh]).tolist() if fresh else []
        keep = []
        for l, t in zip(fresh, traces):
            ref = l.trace_ref
            if (self.trace_threshold is not None and ref is not None and l.A_inv is not None
                    and abs(t - ref) <= self.trace_threshold * abs(ref)):
                l.skipped += 1
                self.counters["skipped_refreshes"] += 1
                l.interval_mult = min(l.interval_mult * self.interval_growth, self.max_interval_mult)
                l.next_inverse = k + self.inv_interval * l.interval_mult
            else:
                keep.append((l, t))
        return keep

    def _invert(self, k: int, damping: float, todo: list[tuple[ThorLayer, float]], world: int) -> None:
        if not todo:
            return
        rank = dist.get_rank(self.process_group) if world > 1 else 0
        owners = thor_dist.assign_owners([l.inverse_cost() for l, _ in todo], world)
        results: list[tuple[Tensor, Tensor] | None] = []
        for (l, _), owner in zip(todo, owners):
            if owner != rank:
                results.append(None)
                continue
            try:
                a_inv, g_inv, retries = l.invert(damping, self.inverse_method, self.max_damping_retries)
                self.counters["damping_retries"] += retries
                self.counters["local_inversions"] += 1
                results.append((a_inv, g_inv))
            except torch.linalg.LinAlgError:
                self.counters["inverse_failures"] += 1
                results.append(None)
        if world > 1:
            w = todo[0][0].module.weight
            results = thor_dist.share_inverses(results, [l.factor_shapes() for l, _ in todo],
                                               factor_dtype(w), w.device, self.process_group)
        for (l, t), r in zip(todo, results):
            l.next_inverse = k + self.inv_interval * l.interval_mult
            if r is not None:  # a failed inversion keeps the previous inverse instead of NaN
                l.A_inv, l.G_inv = r
                l.trace_ref = t
                l.refreshes += 1
                self.counters["refreshes"] += 1

    # ---- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"update": self.update_index, "counters": dict(self.counters),
                "layers": {name: l.state() for name, l in self.layers.items()},
                "units": {name: u.state() for name, u in self.units.items()}}

    def load_state_dict(self, state: dict) -> None:
        missing = set(self.layers) ^ set(state["layers"])
        if missing:
            raise CheckpointError(f"THOR state does not match the model's layers: {sorted(missing)[:5]}",
                                  "load the optimizer state saved for this model")
        units = state.get("units", {})
        if set(self.units) != set(units):
            raise CheckpointError(f"THOR state has {len(units)} unit-wise BatchNorm layers, this preconditioner "
                                  f"{len(self.units)}", "load it with the batchnorm option it was saved with")
        self.update_index, self.counters = int(state["update"]), dict(state["counters"])
        for name, l in self.layers.items():
            l.load(state["layers"][name])
        for name, u in self.units.items():
            u.load(units[name])
        self._arm_capture()

    def remove_hooks(self) -> None:
        """Detach the hooks from the model (curvature stops being refreshed)."""
        self._pre_hook.remove()
        for l in [*self.layers.values(), *self.units.values()]:
            l.capture.remove()


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
    compilable = False  # its capture hooks run eagerly around the forward and backward

    def attach_grad_scaler(self, scaler: torch.amp.GradScaler | None) -> None:
        self.preconditioner.grad_scaler = scaler
