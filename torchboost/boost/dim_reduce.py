"""dim_reduce: DLDR P-BFGS ("Low Dimensional Trajectory Hypothesis is True", TPAMI 2022), a second stage.

Training continues in the k-dimensional subspace spanned by P (see pca.py) with a quasi-Newton step, plus a
small momentum step on the gradient's residual outside the subspace. One update, with the gradient g of the
current batch already in .grad (MindSpore mindspore/boost/dim_reduce.py, same order):

    g_k = P g
    if a previous step exists: y = g_k - g_k_prev; if y.s > 1e-20:
        r = 1 / y.s;  B <- (I - r s y^T) B (I - r y s^T) + r s s^T          (BFGS inverse-Hessian update)
    d = -B g_k
    line search m = 0, 1, 2: accept the first t = rho^m with loss(w + t P^T d) < loss(w) + sigma t g_k.d
      (none accepted: t = 0 and B <- I, see below)
    s = t d
    m_res <- gamma m_res + (g - P^T g_k)
    w <- w - alpha m_res + t P^T d

Differences from MindSpore. When no step length is accepted, MindSpore still moves by rho^2 d (and keeps
the previous s). With mini-batch gradients, y = g_k - g_k_prev mixes two batches, y.s can be tiny and B
explode; the unaccepted rho^2 step then throws the weights away (on the MNIST CNN one such step sends the
loss up by orders of magnitude and training back to chance). We do the textbook quasi-Newton safeguard
instead: no subspace move, and B is reset to I (s = 0, so the next step makes no BFGS update). MindSpore
compares against the training forward's loss; we evaluate loss(w) with the same closure as the trial
points, so the Armijo test compares like with like (one extra forward). BN running statistics touched by
the line-search forwards are restored (MindSpore lets the trial weights update them). B, s and g_k are
kept in float64 (k x k, negligible cost).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from torchboost.errors import CheckpointError, ConfigError
from torchboost.optim.protocol import TrainerProtocol

from .options import DimReduceOptions
from .pca import build_pca_basis, checkpoint_files, save_basis


class DimReduce(TrainerProtocol, torch.optim.Optimizer):
    """P-BFGS optimizer over a PCA subspace. `step(closure)`: the closure re-runs forward on the current
    batch under no_grad and returns the loss; the gradient must already be in .grad.

    `params` must be the trainable parameters in the order P's columns were built in (one group, no lr:
    the step length comes from the line search). `buffers` (e.g. model.buffers()) are restored after the
    line-search forwards. Under torch.distributed the losses are averaged over ranks so every rank takes
    the same decision (gradients are expected to be averaged already, e.g. by DDP).
    """

    needs_closure = True  # torchboost.optim.protocol: TrainStep passes a closure re-running the forward
    compilable = False

    def __init__(self, params: Iterable[nn.Parameter], pca_mat: torch.Tensor, rho: float = 0.55,
                 gamma: float = 0.9, alpha: float = 0.001, sigma: float = 0.4, max_search: int = 3,
                 buffers: Iterable[torch.Tensor] = ()) -> None:
        super().__init__(params, dict(rho=rho, gamma=gamma, alpha=alpha, sigma=sigma, max_search=max_search))
        if len(self.param_groups) != 1:
            raise ValueError("DimReduce takes one parameter group (P's columns follow its order)")
        n = sum(p.numel() for p in self._params())
        if pca_mat.dim() != 2 or pca_mat.shape[1] != n:
            raise CheckpointError(
                f"dim_reduce basis has shape {tuple(pca_mat.shape)} but the model has {n} trainable weights",
                "build it from checkpoints of this model (same architecture and less_bn setting)",
            )
        first = self._params()[0]
        self.pca_mat = pca_mat.to(device=first.device, dtype=first.dtype)
        self.buffers = list(buffers)
        k = pca_mat.shape[0]
        self.bfgs = {"B": torch.eye(k, dtype=torch.float64), "s": torch.zeros(k, dtype=torch.float64),
                     "g_prev": torch.zeros(k, dtype=torch.float64), "started": False}
        self.last_step_length = 0.0

    def _params(self) -> list[nn.Parameter]:
        return self.param_groups[0]["params"]

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:  # type: ignore[override]
        if closure is None:
            raise ValueError("DimReduce.step needs a closure that re-evaluates the loss (needs_closure = True)")
        group, params, P = self.param_groups[0], self._params(), self.pca_mat
        w0 = torch.cat([p.reshape(-1) for p in params])
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        saved = [b.clone() for b in self.buffers]
        loss0 = self._loss(closure)

        g_k = (P @ g).double()
        B = self.bfgs["B"]
        if self.bfgs["started"]:
            y, s = g_k - self.bfgs["g_prev"].to(g_k.device), self.bfgs["s"].to(g_k.device)
            ys = float(y @ s)
            if ys > 1e-20:
                r = 1.0 / ys
                left = torch.eye(len(s), dtype=torch.float64, device=g_k.device) - r * torch.outer(s, y)
                B = left @ B.to(g_k.device) @ left.T + r * torch.outer(s, s)
        d = -(B.to(g_k.device) @ g_k)
        direction = P.T @ d.to(P.dtype)
        slope = float(g_k @ d)

        t = 0.0  # no length accepted: no subspace move, and B is reset (see the module docstring)
        for m in range(group["max_search"]):
            trial = group["rho"] ** m
            self._write(params, w0 + trial * direction)
            if self._loss(closure) < loss0 + group["sigma"] * trial * slope:
                t = trial
                break
        if t == 0.0:
            B = torch.eye(len(g_k), dtype=torch.float64)
        for b, v in zip(self.buffers, saved):
            b.copy_(v)

        momentum = torch.cat([self._momentum(p).reshape(-1) for p in params])
        momentum.mul_(group["gamma"]).add_(g - P.T @ g_k.to(P.dtype))
        self._write(params, w0 - group["alpha"] * momentum + t * direction)
        offset = 0
        for p in params:
            self.state[p]["grad_res_momentum"] = momentum[offset: offset + p.numel()].view_as(p).clone()
            offset += p.numel()

        self.bfgs = {"B": B.cpu(), "s": (t * d).cpu(), "g_prev": g_k.cpu(), "started": True}
        self.last_step_length = t
        return torch.tensor(loss0)

    def _loss(self, closure: Callable[[], torch.Tensor]) -> float:
        loss = closure().detach().float().reshape(())
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
        return float(loss)

    def _momentum(self, p: nn.Parameter) -> torch.Tensor:
        return self.state[p].get("grad_res_momentum", torch.zeros_like(p))

    @staticmethod
    def _write(params: list[nn.Parameter], flat: torch.Tensor) -> None:
        offset = 0
        for p in params:
            p.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["bfgs"] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in self.bfgs.items()}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        bfgs = state_dict.pop("bfgs")
        super().load_state_dict(state_dict)
        self.bfgs = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in bfgs.items()}


def build_dim_reduce(model: nn.Module, options: DimReduceOptions) -> DimReduce:
    """DimReduce for `model`'s trainable weights, the basis loaded from `options.pca_mat_path` when that
    file exists, else computed from the checkpoints in `options.weight_load_dir` (and saved to
    pca_mat_path when one is given, as a cache for the next run)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    path = options.pca_mat_path
    if path is not None and Path(path).is_file():
        basis = read_basis(path)
        if basis.shape[0] != options.n_components:
            raise ConfigError(f"dim_reduce basis {path} has {basis.shape[0]} components, "
                              f"n_components is {options.n_components}",
                              "set n_components to match, or delete the file to rebuild it")
    else:
        if options.weight_load_dir is None:
            raise CheckpointError(f"dim_reduce pca_mat_path {path} does not exist and no weight_load_dir is set",
                                  "set weight_load_dir to the first stage's checkpoint folder")
        files = checkpoint_files(options.weight_load_dir)
        basis = build_pca_basis(files, options.n_components, [n for n, _ in named])
        if path is not None:
            save_basis(basis, path)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(basis, src=0)  # one basis for all ranks, whatever each rank's LAPACK rounding
    return DimReduce([p for _, p in named], basis, rho=options.rho, gamma=options.gamma, alpha=options.alpha,
                     sigma=options.sigma, buffers=list(model.buffers()))


def read_basis(path: str | Path) -> torch.Tensor:
    """The basis in `path` (.npy, n_components x n_params), read without unpickling: a file holding an object
    array, a pickle, another array type or shape is a CheckpointError naming the file, not a traceback."""
    fix = ("it must hold a float matrix (n_components x n_params) written by np.save; delete it to rebuild it "
           "from weight_load_dir")
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as e:  # numpy's "Object arrays cannot be loaded when allow_pickle=False", bad headers
        what = "holds an object array" if "object arrays" in str(e).lower() else "is not a readable .npy array"
        raise CheckpointError(f"dim_reduce pca_mat_path {path} {what}", fix) from None
    except (OSError, EOFError) as e:  # unreadable, empty or truncated
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise CheckpointError(f"dim_reduce pca_mat_path {path} cannot be read ({reason})", fix) from None
    if not isinstance(array, np.ndarray):  # an .npz archive
        array.close()
        raise CheckpointError(f"dim_reduce pca_mat_path {path} holds an .npz archive, not one array", fix)
    if array.dtype.kind != "f" or array.ndim != 2:
        raise CheckpointError(f"dim_reduce pca_mat_path {path} holds a {array.ndim}-D {array.dtype} array", fix)
    return torch.from_numpy(array).float()
