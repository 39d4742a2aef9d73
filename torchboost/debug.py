"""Training-debug helpers (the MNIST tutorial's habits): look inside one batch, regularise per layer group.

`layer_stats`: per-module output mean/std/max-abs and per-parameter gradient norms for one batch, with
NaN/inf, dead ReLUs, missing and zero gradients flagged. `weight_decay_groups`: optimizer parameter groups
with L2 weight decay chosen per parameter-name pattern.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from .migrate.record import ModuleCalls, tensors_of

RELUS = (nn.ReLU, nn.ReLU6)


@dataclass
class ModuleStats:
    call: str  # module path ("path#2" for a second call of the same module)
    kind: str
    shape: list[int]
    mean: float  # over finite elements
    std: float  # population std over finite elements
    max_abs: float
    nonfinite: int  # NaN/inf elements
    zero_share: Optional[float] = None  # ReLUs only: share of exact zeros
    dead_channels: Optional[int] = None  # ReLUs only: channels (dim 1) zero for the whole batch
    flags: list[str] = field(default_factory=list)


@dataclass
class ParamStats:
    name: str
    shape: list[int]
    weight_norm: float
    grad_norm: Optional[float]  # None: the parameter received no gradient
    grad_nonfinite: int
    flags: list[str] = field(default_factory=list)


def _json(v: Any) -> Any:
    return v if not isinstance(v, float) or math.isfinite(v) else str(v)


@dataclass
class LayerStatsReport:
    modules: list[ModuleStats]
    params: list[ParamStats]
    loss: Optional[float]

    @property
    def flagged(self) -> list[tuple[str, list[str]]]:
        return [(m.call, m.flags) for m in self.modules if m.flags] + [(p.name, p.flags) for p in self.params if p.flags]

    def table(self) -> str:
        def grid(header: list[str], rows: list[list[str]]) -> list[str]:
            w = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
            return ["  ".join(c.ljust(x) for c, x in zip(r, w)).rstrip() for r in [header, *rows]]
        mods = [[m.call, m.kind, "x".join(map(str, m.shape)), f"{m.mean:.4g}", f"{m.std:.4g}", f"{m.max_abs:.4g}",
                 "" if m.zero_share is None else f"{100 * m.zero_share:.1f}%",
                 "" if m.dead_channels is None else str(m.dead_channels), ", ".join(m.flags)] for m in self.modules]
        pars = [[p.name, "x".join(map(str, p.shape)), f"{p.weight_norm:.4g}",
                 "-" if p.grad_norm is None else f"{p.grad_norm:.4g}",
                 "-" if p.grad_norm is None or not p.weight_norm else f"{p.grad_norm / p.weight_norm:.3g}",
                 ", ".join(p.flags)] for p in self.params]
        lines = grid(["module", "type", "output", "mean", "std", "max_abs", "zeros", "dead_ch", "flags"], mods)
        lines += [""] + grid(["parameter", "shape", "|w|", "|grad|", "|grad|/|w|", "flags"], pars)
        summary = (f"loss {self.loss:.6g}; " if self.loss is not None else "") + f"{len(self.flagged)} flagged"
        return "\n".join([*lines, summary] + [f"  {n}: {', '.join(f)}" for n, f in self.flagged])

    def to_dict(self) -> dict[str, Any]:
        return {"loss": self.loss, "flagged": [{"name": n, "flags": f} for n, f in self.flagged],
                "modules": [{k: _json(v) for k, v in asdict(m).items()} for m in self.modules],
                "params": [{k: _json(v) for k, v in asdict(p).items()} for p in self.params]}


def _module_stats(call: str, module: nn.Module, t: torch.Tensor, dead_relu_share: float) -> ModuleStats:
    x = t.detach().double()
    finite = x[torch.isfinite(x)]
    nonfinite = x.numel() - finite.numel()
    std, mean = torch.std_mean(finite, correction=0) if finite.numel() else (torch.tensor(0.0), torch.tensor(0.0))
    s = ModuleStats(call, type(module).__name__, list(t.shape), float(mean), float(std),
                    float(finite.abs().max()) if finite.numel() else 0.0, nonfinite)
    if nonfinite:
        s.flags.append(f"NaN/inf ({nonfinite} elements)")
    if isinstance(module, RELUS) and x.numel():
        zeros = x == 0
        s.zero_share = float(zeros.double().mean())
        if x.ndim >= 2:
            s.dead_channels = int(zeros.transpose(0, 1).reshape(x.shape[1], -1).all(dim=1).sum())
        if s.zero_share > dead_relu_share:
            s.flags.append(f"dead ReLU ({100 * s.zero_share:.0f}% zeros)")
    return s


def layer_stats(model: nn.Module, batch: tuple[torch.Tensor, Optional[torch.Tensor]],
                loss_fn: Optional[Callable] = None, *, train_mode: bool = True, leaves_only: bool = True,
                dead_relu_share: float = 0.9) -> LayerStatsReport:
    """Forward (and backward when labels are given) one batch and report per-module statistics.

    train_mode uses batch statistics in BatchNorm, as training does. The model is left as it was:
    buffers (BN running stats), gradients and train/eval flags are restored afterwards."""
    x, y = batch
    device = next(model.parameters()).device
    modes = {m: m.training for m in model.modules()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    rows: list[ModuleStats] = []

    def on_output(call: str, module: nn.Module, output: object) -> None:
        if leaves_only and next(module.children(), None) is not None:
            return
        ts = tensors_of(output)  # statistics now: an in-place ReLU later would overwrite this output
        for i, t in enumerate(ts):
            rows.append(_module_stats(call + (f"[{i}]" if len(ts) > 1 else ""), module, t, dead_relu_share))

    try:
        model.train(train_mode)
        model.zero_grad(set_to_none=True)
        with torch.enable_grad(), ModuleCalls(model, on_output=on_output):
            out = model(x.to(device))
        loss = None
        if y is not None:
            loss = (loss_fn or nn.CrossEntropyLoss())(out, y.to(device))
            loss.backward()
        params = [_param_stats(n, p, y is not None) for n, p in model.named_parameters()]
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])
            for n, p in model.named_parameters():
                p.grad = grads[n]
        for m, training in modes.items():
            m.training = training
    return LayerStatsReport(rows, params, None if loss is None else float(loss.detach()))


def _param_stats(name: str, p: nn.Parameter, expect_grad: bool) -> ParamStats:
    g = p.grad
    s = ParamStats(name, list(p.shape), float(p.detach().double().norm()), None, 0)
    if g is None:
        if expect_grad and p.requires_grad:
            s.flags.append("no gradient (unused in forward?)")
        return s
    g = g.detach().double()
    s.grad_nonfinite = int((~torch.isfinite(g)).sum())
    s.grad_norm = float(g[torch.isfinite(g)].norm())
    if s.grad_nonfinite:
        s.flags.append(f"NaN/inf gradient ({s.grad_nonfinite} elements)")
    elif s.grad_norm == 0:
        s.flags.append("zero gradient")
    return s


def layer_stats_from_config(config: str, overrides: Sequence[str] = (), *, checkpoint: Optional[str] = None,
                            batch_size: int = 16, batch_source: str = "data",
                            train_mode: bool = True) -> LayerStatsReport:
    """What `torchboost debug-layers` runs: the recipe's model (weights from `checkpoint` when given) on
    one batch of its data ("data": first test images; "random": seeded noise of the recipe's shape)."""
    from .recipe.align import config_batch
    from .recipe.build import build_loss, build_model
    from .recipe.load import load_resolved
    from .seed import seed_everything
    from .train.checkpoint import load_checkpoint, load_model_state

    cfg, _, eval_ds = load_resolved(config, overrides)
    seed_everything(cfg.train.seed)
    net = build_model(cfg)
    if checkpoint:
        load_model_state(net, load_checkpoint(checkpoint)["model"], source=checkpoint)
    batch = config_batch(cfg, eval_ds, batch_size, batch_source, cfg.train.seed)
    return layer_stats(net, batch, build_loss(cfg), train_mode=train_mode)
