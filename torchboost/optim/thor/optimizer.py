"""THOR (MindSpore's second-order optimizer) as a torch.optim.Optimizer.

Usage in a plain loop (no model conversion):

    opt = THOR(model, lr=get_thor_lr(...), damping=get_thor_damping(...), weight_decay=5e-4)
    loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()

Every trainable Conv2d (any stride/padding/padding_mode/dilation; groups > 1 get one Kronecker factor
pair per group, the natural block-diagonal structure of a grouped conv) and Linear weight is
preconditioned as G^-1 grad A^-1 (DESIGN §4); biases, BatchNorm, Conv1d/3d and everything else get plain
momentum SGD. Then g += weight_decay * w; v = momentum * v + g; w -= lr * v.

A module called several times per forward pools the statistics of all calls (T counts the positions of
every call). A module not run with gradients on a refresh step has no curvature yet: it keeps the plain
gradient (with a one-time warning if it has one) and its refresh is retried at every update until it runs.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from torchboost.errors import CheckpointError, ConfigError
from torchboost.optim.thor import distributed as thor_dist
from torchboost.optim.thor.args import Schedule, Value, validate
from torchboost.optim.thor.factors import DetachedHook, factor_dtype
from torchboost.optim.thor.layer import ThorLayer, find_layers


class THOR(torch.optim.Optimizer):
    """Trace-based Hardware-driven layer-ORiented natural gradient (Chen et al., AAAI 2021).

    Args beyond MindSpore's: `factor_interval`/`inv_interval` (default `frequency`; inv must be a
    multiple of factor); `factor_decay` (running-average factors, None = one mini-batch per refresh as
    in MindSpore); `inverse_method` "cholesky" | "eigen"; `trace_threshold` (skip re-inverting a layer
    whose tr(A)*tr(G) moved relatively less than this since its last inversion) with `interval_growth`
    (multiply that layer's inverse interval on each skip, up to `max_interval_mult`); `grad_scaler`
    (the torch.amp.GradScaler used with `scaler.step(opt)`: G is unscaled by its scale);
    `accumulation_steps` (micro-batches per update whose losses were divided by it); `loss_reduction`
    "mean" | "sum"; `decay_filter(name) -> bool` (False = no weight decay for that parameter);
    `max_damping_retries` (Cholesky failures retry with 10x damping). `loss_scale` is a fixed loss scale
    applied by the caller (MindSpore's FixedLossScaleManager): gradients are divided by it, G by its square.
    Under torch.distributed, factors are averaged over ranks and inversions spread across ranks.
    """

    def __init__(self, model: nn.Module, lr: Schedule, damping: Schedule, momentum: float = 0.9,
                 weight_decay: float = 0.0, frequency: int = 100, split_dim: int | None = 128,
                 loss_scale: float = 1.0, *, decay_filter: Callable[[str], bool] | None = None,
                 use_nesterov: bool = False, factor_interval: int | None = None, inv_interval: int | None = None,
                 factor_decay: float | None = None, inverse_method: str = "cholesky",
                 trace_threshold: float | None = None, interval_growth: int = 1, max_interval_mult: int = 8,
                 grad_scaler: torch.amp.GradScaler | None = None, accumulation_steps: int = 1,
                 loss_reduction: str = "mean", max_damping_retries: int = 3,
                 split_indices: Sequence[int] | None = None,
                 process_group: dist.ProcessGroup | None = None) -> None:
        self.factor_interval = factor_interval or frequency
        self.inv_interval = inv_interval or frequency
        validate(momentum, weight_decay, frequency, split_dim, loss_scale, self.factor_interval,
                 self.inv_interval, factor_decay, inverse_method, trace_threshold, interval_growth,
                 accumulation_steps, loss_reduction)
        self._lr, self._damping = Value(lr, "lr"), Value(damping, "damping")
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if p.requires_grad:
                (decay if decay_filter is None or decay_filter(name) else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        defaults = dict(lr=self._lr.initial(lr), damping=self._damping.initial(damping), momentum=momentum,
                        weight_decay=weight_decay, nesterov=use_nesterov)
        super().__init__([g for g in groups if g["params"]], defaults)
        self.split_dim, self.loss_scale, self.factor_decay = split_dim, loss_scale, factor_decay
        self.inverse_method, self.max_damping_retries = inverse_method, max_damping_retries
        self.trace_threshold, self.interval_growth = trace_threshold, interval_growth
        self.max_interval_mult = max_interval_mult
        self.grad_scaler, self.accumulation_steps = grad_scaler, accumulation_steps
        self.split_indices, self.process_group = split_indices, process_group
        # local_inversions: inversions this rank computed (all of them in one process; a share under
        # torch.distributed, where the others arrive from their owner ranks)
        self.counters = dict(refreshes=0, skipped_refreshes=0, damping_retries=0, inverse_failures=0,
                             capture_failures=0, local_inversions=0)
        self._update = 0
        self._forward_id = 0
        self._pre_hook = model.register_forward_pre_hook(DetachedHook(self._count_forward))
        self.layers: dict[str, ThorLayer] = find_layers(model, split_dim, self._grad_scale,
                                                        lambda: self._forward_id, loss_reduction == "mean")
        self._layer_of: dict[Tensor, ThorLayer] = {l.module.weight: l for l in self.layers.values()}
        self._arm_capture()

    # ---- hooks' view of the optimizer --------------------------------------------------------------
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
        for l in self.layers.values():
            due = l.next_factor if self.factor_decay is not None else l.next_inverse
            l.capture.enabled = self._update >= due

    # ---- refresh: factors -> (average over ranks) -> trace test -> inverses ----------------------------
    def _refresh(self, k: int, damping: float) -> None:
        due = [l for l in self.layers.values() if l.capture.enabled]
        if not due:
            return
        stats = [l.capture.consume() for l in due]
        world = thor_dist.world_size(self.process_group)
        if world > 1:
            w = due[0].module.weight
            shapes = [l.factor_shapes(self.split_dim) for l in due]
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
        invert = self._trace_filter(k, fresh)
        self._invert(k, damping, invert, world)

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
        owners = thor_dist.assign_owners([l.inverse_cost(self.split_dim) for l, _ in todo], world)
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
            results = thor_dist.share_inverses(results, [l.factor_shapes(self.split_dim) for l, _ in todo],
                                               factor_dtype(w), w.device, self.process_group)
        for (l, t), r in zip(todo, results):
            l.next_inverse = k + self.inv_interval * l.interval_mult
            if r is not None:  # a failed inversion keeps the previous inverse instead of NaN
                l.A_inv, l.G_inv = r
                l.trace_ref = t
                l.refreshes += 1
                self.counters["refreshes"] += 1

    # ---- the update ---------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        k = self._update
        damping = self._damping(k, self.param_groups[0]["damping"])
        if not damping > 0:
            raise ConfigError(f"THOR damping must be > 0, got {damping} at update {k}", "use a positive damping")
        self._refresh(k, damping)
        for group in self.param_groups:
            group["lr"], group["damping"] = self._lr(k, group["lr"]), damping
            self._sgd_update(group)
        self._update += 1
        self._arm_capture()
        return loss

    def _sgd_update(self, group: dict) -> None:
        params, grads, bufs = [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ConfigError("THOR does not support sparse gradients", "use dense embeddings/layers")
            g = p.grad if self.loss_scale == 1.0 else p.grad / self.loss_scale
            layer = self._layer_of.get(p)
            params.append(p)
            grads.append(layer.precondition(g) if layer is not None else g)
            bufs.append(self.state[p].get("momentum_buffer"))
        if not params:
            return
        if group["weight_decay"]:
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
        torch._foreach_add_(params, step, alpha=-group["lr"])

    # ---- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["thor"] = {"update": self._update, "counters": dict(self.counters),
                      "layers": {name: l.state() for name, l in self.layers.items()}}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        thor = state_dict.pop("thor", None)
        super().load_state_dict(state_dict)
        if thor is None:
            return
        missing = set(self.layers) ^ set(thor["layers"])
        if missing:
            raise CheckpointError(f"THOR state does not match the model's layers: {sorted(missing)[:5]}",
                                  "load the optimizer state saved for this model")
        self._update, self.counters = int(thor["update"]), dict(thor["counters"])
        for name, l in self.layers.items():
            l.load(thor["layers"][name], self.split_dim)
        self._arm_capture()

    @property
    def update_index(self) -> int:
        """Index of the next update (what lr/damping schedules are evaluated at)."""
        return self._update

    def remove_hooks(self) -> None:
        """Detach THOR's hooks from the model (the optimizer stops refreshing curvature)."""
        self._pre_hook.remove()
        for l in self.layers.values():
            l.capture.remove()


def _all_finite(stats: list[tuple[Tensor, Tensor, float]]) -> list[bool]:
    """Finiteness of every (A, G) pair with one host sync."""
    if not stats:
        return []
    flags = torch.stack([torch.isfinite(a).all() & torch.isfinite(g).all() for a, g, _ in stats])
    return [bool(f) and math.isfinite(t) for f, (_, _, t) in zip(flags.tolist(), stats)]


def thor(net: nn.Module, lr: Schedule, damping: Schedule, momentum: float, weight_decay: float = 0.0,
         loss_scale: float = 1.0, batch_size: int = 32, use_nesterov: bool = False,
         decay_filter: Callable[[str], bool] | None = None, split_indices: Sequence[int] | None = None,
         frequency: int = 100, **kwargs: Any) -> THOR:
    """MindSpore-shaped factory: `thor(net, lr, damping, momentum, weight_decay, loss_scale, batch_size,
    split_indices=None, frequency=100)`. `batch_size` is only validated: THOR reads each step's real batch
    size from the layer inputs, so a smaller last batch is scaled exactly. `split_indices` sets the
    all-reduce fusion groups of the factors, as in MindSpore. Extra keyword arguments go to THOR."""
    if batch_size < 1:
        raise ConfigError(f"thor: batch_size must be >= 1, got {batch_size}", "pass the per-device batch size")
    return THOR(net, lr, damping, momentum=momentum, weight_decay=weight_decay, frequency=frequency,
                loss_scale=loss_scale, use_nesterov=use_nesterov, decay_filter=decay_filter,
                split_indices=split_indices, **kwargs)
