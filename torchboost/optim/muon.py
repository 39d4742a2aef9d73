"""Muon for hidden weight matrices + AdamW for everything else, as one torch.optim.Optimizer.

Muon's authors (Jordan et al., 2024): orthogonalised momentum is for the hidden >= 2-D weights only; the
input layer (embeddings, the first conv/linear), the classifier head and all biases/norm gains go to
AdamW; conv filters are viewed as 2-D (out, in*kh*kw). torch 2.13's `torch.optim.Muon` refuses non-2-D
parameters, and two optimizers would break trainers that set `param_groups[i]["lr"]` on one object, so
`MuonAdamW` runs torch's own Muon and AdamW update functions on its groups (conv weights through 2-D views
that share their storage).

LR schedules: torchboost's trainer sets every group's lr to schedule(step) x group["lr_scale"]; the AdamW
groups carry lr_scale = adamw_lr / lr, so both parts follow the schedule at their own ratio.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn
from torch.optim import _muon
from torch.optim.adamw import adamw as _adamw_update

from torchboost.errors import ConfigError
from torchboost.optim.closure import evaluate_closure
from torchboost.optim.protocol import TrainerProtocol


def _matrix(t: Tensor, param: Tensor) -> Tensor:
    """`t` (the parameter or its gradient) as the parameter's out × fan-in matrix, its columns in the parameter's
    memory order: a channels_last conv weight (model.channels_last) is flattened over (kh, kw, in), which its memory
    holds contiguously, so the matrix of the parameter is a view of it. Orthogonalisation and NorMuon's row
    statistics commute with a permutation of the columns: the update is the one of the (in, kh, kw) order."""
    own = t is param  # the parameter itself must be a view (the update is written into it); a gradient may be copied
    if param.ndim == 4 and not param.is_contiguous() and param.is_contiguous(memory_format=torch.channels_last):
        t = t.permute(0, 2, 3, 1)
    return t.view(t.shape[0], -1) if own else t.reshape(t.shape[0], -1)


class MuonAdamW(TrainerProtocol, torch.optim.Optimizer):
    """Groups with `use_muon=True` get Muon (momentum, nesterov, Newton-Schulz orthogonalisation of the 2-D
    view, torch's lr adjustment sqrt(max(1, out/in)), decoupled weight decay); the others AdamW (`betas`,
    `eps`, decoupled weight decay).

    `row_beta` set: NorMuon (Li et al., 2025) — each row (output neuron) of the orthogonalised update is
    divided by the root of its running mean square (EMA with factor row_beta), then the update is scaled back
    to the orthogonalised update's Frobenius norm, so the step size and lr grid stay Muon's and only how the
    step spreads over neurons changes (the paper rescales to 0.2 sqrt(out*in) instead)."""

    # every value its step writes is a tensor of the state (momentum, AdamW's moments and step counter, the rows'
    # second moments) on its parameter's device: an undone update restores them all (train.undo)
    maskable = True

    def __init__(self, groups: list[dict], lr: float, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 ns_steps: int = _muon.DEFAULT_NS_STEPS, row_beta: float | None = None) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ConfigError(f"Muon: lr, momentum and weight_decay must be >= 0 and betas in [0, 1); got lr "
                              f"{lr}, momentum {momentum}, weight_decay {weight_decay}, betas {betas}",
                              "fix the optimizer arguments")
        if row_beta is not None and not 0 <= row_beta < 1:
            raise ConfigError(f"NorMuon: row_beta must be in [0, 1), got {row_beta}", "e.g. 0.95")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, betas=betas,
                        eps=eps, ns_steps=ns_steps, use_muon=False, row_beta=row_beta)
        super().__init__(groups, defaults)
        for g in self.param_groups:
            if g["use_muon"] and any(p.ndim < 2 for p in g["params"]):
                raise ConfigError("Muon groups take >= 2-D weights only", "put 1-D parameters in an AdamW group")

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise ConfigError("Muon/AdamW do not support sparse gradients", "use dense layers")
            if params:
                (self._muon if group["use_muon"] else self._adamw)(group, params)
        return loss

    def _muon(self, group: dict, params: list[Tensor]) -> None:
        flat = [_matrix(p, p) for p in params]  # views: the in-place update lands in p
        bufs = []
        for p, f in zip(params, flat):
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(f)
            bufs.append(state["momentum_buffer"])
        if group.get("row_beta") is not None:  # .get: groups loaded from checkpoints before NorMuon lack it
            return self._normuon(group, params, flat, bufs)
        _muon.muon(flat, [_matrix(p.grad, p) for p in params], bufs, lr=group["lr"],
                   weight_decay=group["weight_decay"], momentum=group["momentum"], nesterov=group["nesterov"],
                   ns_coefficients=(_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C), ns_steps=group["ns_steps"],
                   eps=_muon.EPS, adjust_lr_fn=None, has_complex=False)

    def _normuon(self, group: dict, params: list[Tensor], flat: list[Tensor], bufs: list[Tensor]) -> None:
        """torch's single-tensor Muon step with the row normalisation between orthogonalising and applying
        (torch's `muon` has no hook there)."""
        lr, beta = group["lr"], group["row_beta"]
        coefficients = (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C)
        for p, f, buf in zip(params, flat, bufs):
            grad = _matrix(p.grad, p)
            buf.lerp_(grad, 1 - group["momentum"])
            update = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
            # torch iterates in bf16 (as Muon's authors do); the row statistics and the step are in f's dtype
            update = _muon._zeropower_via_newtonschulz(update, coefficients, group["ns_steps"], _muon.EPS).to(f.dtype)
            state = self.state[p]
            if "row_mean_square" not in state:
                state["row_mean_square"] = torch.zeros(f.shape[0], dtype=update.dtype, device=update.device)
            rms = state["row_mean_square"]
            rms.lerp_(update.square().mean(dim=1), 1 - beta)
            normalized = update / (rms.sqrt()[:, None] + group["eps"])
            normalized *= update.norm() / normalized.norm().clamp_min(torch.finfo(update.dtype).tiny)
            f.mul_(1 - lr * group["weight_decay"])
            f.add_(normalized, alpha=-_muon._adjust_lr(lr, None, f.shape))

    def _adamw(self, group: dict, params: list[Tensor]) -> None:
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            elif state["step"].device != p.device:  # a checkpoint loaded it on the CPU (torch's rule for "step")
                state["step"] = state["step"].to(p.device)
        st = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        # fused (torch's one-kernel AdamW, on the CPU and GPUs): the step counter stays beside the weights and the
        # update never reads it on the host (the single-tensor path reads it every update: a wait on a GPU)
        _adamw_update(params, [p.grad for p in params], [s["exp_avg"] for s in st], [s["exp_avg_sq"] for s in st],
                      [], [s["step"] for s in st], amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                      weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                      fused=True)


def muon_split(model: nn.Module, input_layer: str = "adamw") -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """(Muon weights, AdamW weights with decay, AdamW no-decay params) as Muon's authors recommend:
    Muon for >= 2-D hidden weights; AdamW for embeddings, the first Conv2d/Linear (input layer), the last
    Linear (classifier head) with weight decay, and every < 2-D parameter (biases, norms) without.
    `input_layer="muon"` gives a first Conv2d to Muon too: on shallow CNNs it is a large share of the
    filters (its measured effect on the MNIST CNN is in BENCHMARKS.md)."""
    if input_layer not in ("adamw", "muon"):
        raise ConfigError(f"input_layer must be 'adamw' or 'muon', got {input_layer!r}", "pick one of the two")
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    stem = [] if input_layer == "muon" and layers and isinstance(layers[0], nn.Conv2d) else layers[:1]
    edge = {id(m.weight) for m in stem + linears[-1:]}
    edge |= {id(m.weight) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))}
    muon, adamw, no_decay = [], [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else adamw if id(p) in edge else muon).append(p)
    return muon, adamw, no_decay


def muon_optimizer(model: nn.Module, lr: float, momentum: float = 0.95, weight_decay: float = 0.0,
                   nesterov: bool = True, adamw_lr: float | None = None,
                   adamw_betas: tuple[float, float] = (0.9, 0.95), *, input_layer: str = "adamw",
                   row_beta: float | None = None) -> MuonAdamW:
    """Muon at `lr` for the hidden weights, AdamW at `adamw_lr` (default lr / 10) for the rest (see
    `muon_split`, which `input_layer` goes to); AdamW groups keep adamw_lr / lr of any lr schedule through
    their `lr_scale` key. `row_beta`: NorMuon's row normalisation (see `MuonAdamW`)."""
    adamw_lr = lr / 10 if adamw_lr is None else adamw_lr
    scale = adamw_lr / lr if lr > 0 else 1.0
    muon, adamw, no_decay = muon_split(model, input_layer)
    groups = [dict(name="muon (hidden weights)", params=muon, use_muon=True, lr_scale=1.0),
              dict(name="adamw (input layer, head)", params=adamw, lr=adamw_lr, lr_scale=scale),
              dict(name="adamw no_decay (biases, norms)", params=no_decay, lr=adamw_lr, lr_scale=scale,
                   weight_decay=0.0)]
    return MuonAdamW([g for g in groups if g["params"]], lr=lr, momentum=momentum, nesterov=nesterov,
                     weight_decay=weight_decay, betas=adamw_betas, row_beta=row_beta)
