"""Record one training step module by module: forward outputs (and inputs), gradients, optimizer update.

Shared by `align` (two implementations, a few steps, one call each) and `torchboost.debug` (layer statistics).

Call names: every module call is named by its module path ("(root)" for the model itself); a module
called more than once in a forward (a shared ReLU or pool) gets "path#2", "path#3", ... for the later
calls. Names are listed in *completion* order — a module's output exists only once its children have
run, so the first diverging name in that order is the innermost module where a difference appears.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from ..errors import ConfigError
from ..optim.protocol import protocol_of

ROOT = "(root)"
Feed = Callable[[str], Optional[tuple[torch.Tensor, ...]]]


def tensors_of(value: object) -> list[torch.Tensor]:
    """The tensors in a module output/input (tensor, tuple/list, dict values), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_of(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    return []


def base_name(call: str) -> str:
    """"layer1.0.relu#2" -> "layer1.0.relu"."""
    return call.partition("#")[0]


class ModuleCalls:
    """Context manager: forward pre-hooks and hooks on every module, with stable call names.

    on_input(call, module, args) may return replacement positional args (or None to keep them);
    on_output(call, module, output) observes the output. `order` lists calls in completion order.
    """

    def __init__(self, model: nn.Module, on_input: Optional[Callable] = None,
                 on_output: Optional[Callable] = None) -> None:
        self.model, self.on_input, self.on_output = model, on_input, on_output
        self.order: list[str] = []
        self._counts: collections.Counter = collections.Counter()
        self._open: dict[str, list[str]] = collections.defaultdict(list)  # a stack per path (recursion)
        self._handles: list = []

    def _pre(self, path: str) -> Callable:
        def hook(module: nn.Module, args: tuple) -> Optional[tuple]:
            self._counts[path] += 1
            n = self._counts[path]
            call = path if n == 1 else f"{path}#{n}"
            self._open[path].append(call)
            return self.on_input(call, module, args) if self.on_input else None
        return hook

    def _post(self, path: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            call = self._open[path].pop()
            self.order.append(call)
            if self.on_output:
                self.on_output(call, module, output)
        return hook

    def __enter__(self) -> "ModuleCalls":
        for path, module in self.model.named_modules():
            path = path or ROOT
            self._handles.append(module.register_forward_pre_hook(self._pre(path)))
            self._handles.append(module.register_forward_hook(self._post(path)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class _Substitute(torch.autograd.Function):
    """Forward: exactly `value`. Backward: the gradient goes to the replaced tensor, so the graph upstream
    of a fed module still receives gradients (single-step mode keeps backward and update comparable)."""

    @staticmethod
    def forward(ctx, replaced: torch.Tensor, value: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return value.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def substitute_args(call: str, args: tuple, given: tuple[torch.Tensor, ...]) -> tuple:
    """Replace the positional tensor args by `given` (same order), keeping the autograd path."""
    new, it = list(args), iter(given)
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            continue
        g = next(it, None)
        if g is None:
            break
        if tuple(g.shape) != tuple(a.shape):
            raise ConfigError(f"single-step: cannot feed {call} an input of shape {tuple(g.shape)}, it takes "
                              f"{tuple(a.shape)}", "the two networks differ in structure here; align without single-step")
        g = g.to(a.device, a.dtype)
        new[i] = _Substitute.apply(a, g) if a.requires_grad else g.clone()
    return tuple(new)


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


@dataclass
class Recording:
    """One side of an alignment: everything keyed by (mapped) names, each dict in comparison order."""

    forward: dict[str, tuple[torch.Tensor, ...]] = field(default_factory=dict)  # call -> outputs
    inputs: dict[str, tuple[torch.Tensor, ...]] = field(default_factory=dict)  # call -> positional inputs
    grads: dict[str, torch.Tensor] = field(default_factory=dict)  # param -> grad, backward order
    updates: dict[str, torch.Tensor] = field(default_factory=dict)  # param/buffer -> after - before
    loss: Optional[float] = None


def prepare_for_alignment(model: nn.Module) -> None:
    """Train mode with dropout off. BatchNorm must stay in train mode: the step being compared normalises
    with batch statistics and updates the running ones; dropout's random masks cannot be matched across
    frameworks' RNGs, and eval-mode dropout is the identity, so it is the one thing switched off."""
    model.train()
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.eval()


def _floating_state(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from ((n, p) for n, p in model.named_parameters())
    yield from ((n, b) for n, b in model.named_buffers() if b.is_floating_point())


def record_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], loss_fn: Callable,
                optimizer: torch.optim.Optimizer, *, feed: Optional[Feed] = None,
                keep_inputs: bool = False) -> Recording:
    """Run ONE training step (fp32, dropout off) and record it. `feed(call)` may return the inputs a
    module call must use instead of its own (single-step mode)."""
    prepare_for_alignment(model)
    device = next(model.parameters()).device
    x, y = batch[0].to(device), batch[1].to(device)
    rec = Recording()
    before = {n: _snapshot(t) for n, t in _floating_state(model)}

    def on_input(call: str, module: nn.Module, args: tuple) -> Optional[tuple]:
        given = feed(call) if feed is not None and call != ROOT else None
        if given is not None:
            args = substitute_args(call, args, given)
        if keep_inputs:  # copied now: an in-place module (ReLU(inplace=True)) would overwrite it
            rec.inputs[call] = tuple(_snapshot(t) for t in tensors_of(args))
        return args if given is not None else None

    def on_output(call: str, module: nn.Module, output: object) -> None:
        rec.forward[call] = tuple(_snapshot(t) for t in tensors_of(output))

    optimizer.zero_grad(set_to_none=True)
    with ModuleCalls(model, on_input, on_output) as calls:
        loss = loss_fn(model(x), y)
    loss.backward()
    rec.loss = float(loss.detach())
    # Backward runs from the last module to the first: order gradients by their module's reverse order.
    first_seen = {base_name(c): i for i, c in reversed(list(enumerate(calls.order)))}
    params = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    params.sort(key=lambda np_: -first_seen.get(np_[0].rpartition(".")[0] or ROOT, -1))
    rec.grads = {n: _snapshot(p.grad) for n, p in params}
    if protocol_of(optimizer).needs_closure:  # line-search optimizers re-evaluate the loss (optim.protocol)
        optimizer.step(torch.no_grad()(lambda: loss_fn(model(x), y).float()))
    else:
        optimizer.step()
    rec.updates = {n: _snapshot(t) - before[n] for n, t in _floating_state(model)}
    optimizer.zero_grad(set_to_none=True)
    return rec
