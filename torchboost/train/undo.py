"""Undo an update on the device: the skip policy and the loss-scale overflow check without a host read.

`torch.amp.GradScaler` skips an overflowing update on the device only for fused optimizers (the kernel takes
`found_inf`); for any other optimizer it reads the flag on the host, which waits for the GPU's queue to drain.
`UpdateUndo` does it for the optimizers that declare it safe (`optim.protocol.maskable_of`): it keeps a copy of
everything an update writes — the model's buffers (BatchNorm's statistics and counters), the parameters the
optimizer holds, every tensor of its per-parameter state and of its param groups, the EMA's weights and its count
— and puts it back with `torch.where(keep, now, saved)`: one pointwise pass per tensor, decided by a device flag.
A state tensor the update replaced rather than wrote in place is restored the same way and put back in its place.

What a device flag cannot undo, a host read does, and only when it happens: an update that created optimizer
state (the first one: momentum buffers appear), changed a non-tensor value (of the state or of a param group), or
left a tensor on another device than the flag's (whose copy would wait on the host). `host_reads` counts them.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

# where a saved tensor lives, to find the tensor there after the update (an optimizer may replace it):
# ("state", parameter, key), ("group", group index, key) or None (held by the model or the EMA, written in place)
Place = Optional[tuple[str, Any, str]]


def _layout(optimizer: torch.optim.Optimizer) -> tuple:
    """What the host sees of the optimizer: which state entries exist, and every non-tensor value of the state
    and of the param groups."""
    state = {(id(p), k, None if isinstance(v, Tensor) else repr(v))
             for p, entry in optimizer.state.items() for k, v in entry.items()}
    groups = tuple(tuple((k, None if isinstance(v, Tensor) else repr(v)) for k, v in g.items() if k != "params")
                   for g in optimizer.param_groups)
    return frozenset(state), groups


class UpdateUndo:
    """Saves what one update writes and restores it where a device flag says the update is dropped."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, ema: Any = None) -> None:
        """`ema`: a `ModelEMA` (its module and count are saved with the rest), or None."""
        self.model, self.optimizer, self.ema = model, optimizer, ema
        self.live: list[Tensor] = []
        self.saved: list[Tensor] = []
        self.places: list[Place] = []
        self.before: Optional[tuple] = None  # (state entries, param-group values) at save time
        self.n_buffers = 0  # live[:n_buffers] are the model's buffers
        self.host_reads = 0  # restores decided on the host (what a device flag could not undo)

    def _collect(self, whole: bool) -> None:
        # buffers: a non-finite forward writes NaN into BatchNorm's running statistics (and counts the batch)
        live: list[Tensor] = list(self.model.buffers())
        places: list[Place] = [None] * len(live)
        self.n_buffers = len(live)
        self.before = None
        if whole:
            seen = {id(t) for t in live}
            params = [*self.model.parameters(), *(p for g in self.optimizer.param_groups for p in g["params"])]
            for p in params:  # the optimizer's own parameters too (a loss's, or a layer outside the model)
                if id(p) not in seen:
                    seen.add(id(p))
                    live.append(p.data)
                    places.append(None)
            for p, entry in self.optimizer.state.items():
                for k, v in entry.items():
                    if isinstance(v, Tensor) and v.numel():
                        live.append(v)
                        places.append(("state", p, k))
            for i, g in enumerate(self.optimizer.param_groups):
                for k, v in g.items():
                    if k != "params" and isinstance(v, Tensor) and v.numel():
                        live.append(v)
                        places.append(("group", i, k))
            if self.ema is not None:
                live += [*self.ema.module.state_dict().values(), self.ema.count]
                places += [None] * (len(live) - len(places))
            self.before = (_layout(self.optimizer),
                           {p: dict(e) for p, e in self.optimizer.state.items()},
                           [dict(g) for g in self.optimizer.param_groups])
        self.live, self.places = live, places

    def save(self, whole: bool = True) -> None:
        """Copy what the update may write: everything (whole) or only the model's buffers. Call it before the
        forward pass. The copies are reused from update to update while the tensors keep their shapes."""
        self._collect(whole)
        live = self.live
        same = len(live) == len(self.saved) and all(
            s.shape == t.shape and s.dtype == t.dtype and s.device == t.device for s, t in zip(self.saved, live))
        if same and live:
            torch._foreach_copy_(self.saved, live)  # one fused copy, not one launch per tensor
        else:
            self.saved = [t.detach().clone() for t in live]

    def _now(self, i: int) -> Optional[Tensor]:
        """The tensor at saved tensor i's place after the update (None: the entry is gone)."""
        place = self.places[i]
        if place is None:
            return self.live[i]
        kind, where, key = place
        holder = self.optimizer.state.get(where, {}) if kind == "state" else self.optimizer.param_groups[where]
        now = holder.get(key)
        return now if isinstance(now, Tensor) else None

    def _put(self, i: int, tensor: Tensor) -> None:
        kind, where, key = self.places[i]  # type: ignore[misc]
        (self.optimizer.state[where] if kind == "state" else self.optimizer.param_groups[where])[key] = tensor

    @torch.no_grad()
    def restore_where(self, drop: Tensor, drop_buffers: Tensor) -> None:
        """Put back the saved values where `drop` (a 0-d bool tensor) is True, the model's buffers where
        `drop_buffers` is (a non-finite forward, not an overflowing backward), without reading either. What a flag
        cannot decide (`_needs_host`) is decided by one host read."""
        if self._needs_host(drop):
            self.host_reads += 1
            drop_update, drop_stats = bool(drop), bool(drop_buffers)
            if drop_update or drop_stats:
                self.restore(update=drop_update, buffers=drop_stats)
            return
        keep, keep_buffers = ~drop, ~drop_buffers
        for i, (t, s) in enumerate(zip(self.live, self.saved)):
            now = self._now(i)
            torch.where(keep_buffers if i < self.n_buffers else keep, now, s, out=t)
            if now is not t:  # replaced by the update: the restored tensor goes back in its place
                self._put(i, t)

    def _needs_host(self, drop: Tensor) -> bool:
        """Whether the update did what a device flag cannot undo: added or removed state entries, changed a
        non-tensor value, replaced a tensor by one of another shape or dtype, or left a tensor on another device
        than the flag's (its `where` would copy the flag to the host's memory and wait)."""
        if self.before is not None and self.before[0] != _layout(self.optimizer):
            return True
        for i, (t, s) in enumerate(zip(self.live, self.saved)):
            now = self._now(i)
            if now is None or now.device != drop.device or (now is not t and (now.shape, now.dtype) != (t.shape, t.dtype)):
                return True
        return False

    @torch.no_grad()
    def restore(self, update: bool = True, buffers: bool = True) -> None:
        """Put back what was saved (the decision was made on the host): the update's writes (tensors in place and
        in their places, state entries and param-group values as they were) and/or the model's buffers."""
        n = self.n_buffers
        if buffers and n:
            torch._foreach_copy_(self.live[:n], self.saved[:n])
        if not update:
            return
        if len(self.live) > n:
            torch._foreach_copy_(self.live[n:], self.saved[n:])
        if self.before is None:
            return
        _, entries, groups = self.before
        for p in list(self.optimizer.state):
            if p not in entries:
                del self.optimizer.state[p]
        for p, entry in entries.items():
            live = self.optimizer.state[p]
            live.clear()
            live.update(entry)  # the saved tensors, restored in place above
        for g, saved in zip(self.optimizer.param_groups, groups):
            g.update(saved)
