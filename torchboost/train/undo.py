"""Undo an update on the device: the skip policy and the loss-scale overflow check without a host read.

`torch.amp.GradScaler` skips an overflowing update on the device only for fused optimizers (the kernel takes
`found_inf`); for any other optimizer it reads the flag on the host, which waits for the GPU's queue to drain.
`UpdateUndo` does it for any optimizer whose state lives in its `state_dict()` tensors: it keeps a copy of what
the update writes (parameters, buffers, the optimizer's state tensors, the EMA) and puts it back with
`torch.where(keep, now, saved)` — one pointwise pass per tensor, decided by a device flag.

What a device flag cannot undo, a host read does, and only when it happens: an update that created optimizer
state (the first one: momentum buffers appear) or changed a non-tensor state value. Host-side counters outside
the optimizer (the EMA's update count) still advance on an undone update.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn


def _layout(state: dict) -> set:
    """The optimizer state's shape as the host sees it: which entries exist, and every non-tensor value."""
    return {(id(p), k, None if isinstance(v, Tensor) else repr(v))
            for p, entry in state.items() for k, v in entry.items()}


class UpdateUndo:
    """Saves what one update writes and restores it where a device flag says the update is dropped."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, ema_module: Optional[nn.Module] = None
                 ) -> None:
        self.model, self.optimizer, self.ema_module = model, optimizer, ema_module
        self.live: list[Tensor] = []
        self.saved: list[Tensor] = []
        self.before: Optional[dict] = None  # the optimizer's per-parameter state at save time (tensor references)
        self.n_buffers = 0  # live[:n_buffers] are the model's buffers

    def _tensors(self, whole: bool) -> list[Tensor]:
        # buffers: a non-finite forward writes NaN into BatchNorm's running statistics before any check
        out = [b for b in self.model.buffers() if b.is_floating_point()]
        self.n_buffers = len(out)
        if not whole:
            return out
        out += [p.data for p in self.model.parameters()]
        self.before = {p: dict(entry) for p, entry in self.optimizer.state.items()}  # the entries as they are
        out += [v for entry in self.before.values() for v in entry.values() if isinstance(v, Tensor) and v.numel()]
        if self.ema_module is not None:
            out += [t.data for t in self.ema_module.state_dict().values() if t.is_floating_point()]
        return out

    def save(self, whole: bool = True) -> None:
        """Copy what the update may write: everything (whole) or only the model's buffers. Call it before the
        forward pass. The copies are reused from update to update while the tensors keep their shapes."""
        live = self._tensors(whole)
        same = len(live) == len(self.saved) and all(
            s.shape == t.shape and s.dtype == t.dtype and s.device == t.device for s, t in zip(self.saved, live))
        if same and live:
            torch._foreach_copy_(self.saved, live)  # one fused copy, not one launch per tensor
        else:
            self.saved = [t.detach().clone() for t in live]
        self.live = live

    @torch.no_grad()
    def restore_where(self, drop: Tensor, drop_buffers: Tensor) -> None:
        """Put back the saved values where `drop` (a 0-d bool tensor) is True, the model's buffers where
        `drop_buffers` is (a non-finite forward, not an overflowing backward), without reading either. An update
        that added optimizer state or changed a non-tensor value is decided on the host instead."""
        keeps: dict[tuple[bool, torch.device], Tensor] = {}
        for i, (t, s) in enumerate(zip(self.live, self.saved)):
            flag = drop_buffers if i < self.n_buffers else drop
            key = (i < self.n_buffers, t.device)
            if key not in keeps:  # on another device (a CPU step counter beside CUDA weights) the copy waits
                keeps[key] = (~flag).to(t.device)
            torch.where(keeps[key], t, s, out=t)
        if self.before is not None and _layout(self.before) != _layout(self.optimizer.state):
            if bool(drop):  # the host read: new state entries go, the next update creates them afresh
                self._put_back_entries()

    @torch.no_grad()
    def restore(self) -> None:
        """Put everything saved back (the decision was made on the host)."""
        if self.live:
            torch._foreach_copy_(self.live, self.saved)
        if self.before is not None and _layout(self.before) != _layout(self.optimizer.state):
            self._put_back_entries()

    def _put_back_entries(self) -> None:
        """The optimizer's per-parameter entries as saved: keys the update added go (the next update creates them
        afresh), non-tensor values come back (tensors were restored in place)."""
        for p, entry in self.optimizer.state.items():
            entry.clear()
            entry.update(self.before.get(p, {}))
