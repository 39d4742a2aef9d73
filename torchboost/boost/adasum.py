"""AdasumHook: boost's Adasum on weight deltas. Each rank steps its own optimizer; the hook then replaces
the local update by the Adasum of every rank's update (the reduction itself is torchboost.distributed.adasum)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchboost.distributed import adasum_combine, all_reduce_mean, broadcast_module, get_world_size, hierarchical_groups
from torchboost.errors import ConfigError
from torchboost.train.hooks import StepHook


class AdasumHook(StepHook):
    """Replace each rank's local update by the Adasum of all ranks' updates: w = w_old + Adasum(Δ).

    Each rank runs its own optimizer (SGD, THOR, any) on its own gradients, so the model must NOT be
    DDP-wrapped. Rank 0's parameters and buffers are broadcast once, when the hook is given the model
    (at construction, or at the first update), so all ranks continue from the same weights. Floating
    buffers (BN running statistics) are averaged over all ranks after every update. An update whose
    delta is non-finite on any rank is undone on every rank and counted in `skipped_steps`.
    Every rank must call before_optimizer/after_optimizer for the same updates (a rank that skips one
    leaves the others waiting): gradients are per rank here, so a loss-scale overflow must be made
    global with `torchboost.distributed.any_rank(overflow)` before deciding to drop an update.
    hierarchical: average within each node of `local_world_size` ranks, Adasum across nodes.
    """

    def __init__(self, model: nn.Module | None = None, *, hierarchical: bool = False,
                 local_world_size: int | None = None, group: dist.ProcessGroup | None = None,
                 average_buffers: bool = True) -> None:
        self.hierarchical, self.local_world_size = hierarchical, local_world_size
        self.group: dist.ProcessGroup | None = group
        self.node_group: dist.ProcessGroup | None = None
        self.average_buffers = average_buffers
        self.skipped_steps = 0
        self._synced = False
        self._params: list[nn.Parameter] = []
        self._old: list[Tensor] = []
        self._snapshots: dict[int, Tensor] = {}  # reused every update: no per-step allocation
        if model is not None:
            self._sync(model)

    def _sync(self, model: nn.Module) -> None:
        if isinstance(model, DDP):
            raise ConfigError("Adasum combines each rank's own update, but the model is wrapped in "
                              "DistributedDataParallel (which would average gradients first)",
                              "do not wrap the model with wrap_ddp when boost.adasum is on")
        if self.hierarchical and get_world_size() > 1:  # collective: every rank is here at the same update
            self.node_group, self.group = hierarchical_groups(self.local_world_size)
        broadcast_module(model)
        self._synced = True

    def before_optimizer(self, model: nn.Module) -> None:
        if not self._synced:
            self._sync(model)
        # only trainable tensors travel: frozen ones (grad_freeze, identical on every rank) have no delta
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._old = [self._snapshots.setdefault(id(p), torch.empty_like(p)).copy_(p.detach())
                     for p in self._params]

    @torch.no_grad()
    def after_optimizer(self, model: nn.Module) -> None:
        deltas = [p.detach() - old for p, old in zip(self._params, self._old)]
        combined, finite = adasum_combine(deltas, self.group, node_group=self.node_group)
        if not finite:
            for p, old in zip(self._params, self._old):
                p.copy_(old)
            self.skipped_steps += 1
        elif get_world_size() > 1:  # alone, w_old + (w - w_old) could differ from w in the last bit
            for p, old, d in zip(self._params, self._old, combined):
                p.copy_(old).add_(d)
        if self.average_buffers:
            buffers = [b for b in model.buffers() if b.is_floating_point()]
            if buffers:
                flat = all_reduce_mean(torch.cat([b.reshape(-1) for b in buffers]))
                for b, x in zip(buffers, flat.split([b.numel() for b in buffers])):
                    b.copy_(x.view_as(b))
        self._params, self._old = [], []

    def state_dict(self) -> dict:
        return {"skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.skipped_steps = int(state.get("skipped_steps", 0))
