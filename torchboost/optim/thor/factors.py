"""Kronecker-factor capture for THOR.

A forward hook on each Conv2d/Linear sums the input outer products (A) and registers a tensor hook on
the layer OUTPUT that sums the output-gradient outer products (G). A tensor hook (not a full backward
hook) is used because it still fires with the gradient w.r.t. the layer output when a following
ReLU(inplace=True) overwrites that output. Hooks only do work on capturing steps, so other steps cost a
flag test per layer.

Factors are kept as their diagonal blocks, (groups, n_blocks, b, b): grouped convolutions get one
Kronecker factor per group, and with THOR's split_dim only the diagonal blocks are ever used, so only those
are computed (rows*n*b flops instead of rows*n^2: 36x less for ResNet-50's 4608-wide factors at b=128).
A factor whose size is not a multiple of b is zero-padded; the inversion puts identity there. Sums are
fp32 (fp64 for fp64 layers) whatever the autocast dtype: bf16 outer products break the inverses. On CUDA
the fp32 products run on the tensor cores (`gram`): each feature scaled to a max of 1, rounded to fp16 (10
mantissa bits, as MindSpore's fp16 cube matmuls round them) and multiplied with an fp32 result, then scaled
back (speed and error against fp32 on a GPU: BENCHMARKS.md). The damping (a few % of the diagonal) and one
batch's sampling noise are far larger than fp16's rounding error, and a block that loses definiteness gets
more damping. A factor's last, partial block is multiplied at its own
size (`outer_blocks`).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def factor_dtype(weight: Tensor) -> torch.dtype:
    """fp64 layers keep fp64 factors; everything else (fp32, bf16, fp16) gets fp32."""
    return torch.float64 if weight.dtype == torch.float64 else torch.float32


def input_columns(module: nn.Module, x: Tensor) -> Tensor:
    """The layer's effective input, feature-major: (in_features, rows).

    conv: one column per output position (im2col patches, channel-major like the weight's
    (Cin/g, kh, kw) layout, so group j owns a contiguous band of features); linear: one column per
    leading index. Feature-major rows feed the block outer products without another copy.
    """
    if isinstance(module, nn.Linear):
        return x.reshape(-1, x.shape[-1]).T
    conv: nn.Conv2d = module  # type: ignore[assignment]
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        # 'same' (possibly asymmetric) and reflect/replicate/circular padding: pad exactly as the
        # layer does, then take patches of the padded input.
        mode = "constant" if conv.padding_mode == "zeros" else conv.padding_mode
        x = F.pad(x, conv._reversed_padding_repeated_twice, mode=mode)
        padding: tuple[int, int] = (0, 0)
    else:
        padding = conv.padding  # type: ignore[assignment]
    kh, kw = conv.kernel_size
    if (kh, kw) == (1, 1) and padding == (0, 0):
        # 1x1 conv: patches are the strided pixels; no unfold needed.
        return x[:, :, :: conv.stride[0], :: conv.stride[1]].transpose(0, 1).reshape(x.shape[1], -1)
    cols = F.unfold(x, (kh, kw), dilation=conv.dilation, padding=padding, stride=conv.stride)
    return cols.transpose(0, 1).reshape(cols.shape[1], -1)


def output_columns(module: nn.Module, grad: Tensor) -> Tensor:
    """The output gradient, feature-major: (out_features, rows)."""
    if isinstance(module, nn.Linear):
        return grad.reshape(-1, grad.shape[-1]).T
    return grad.transpose(0, 1).reshape(grad.shape[1], -1)


def gram(x: Tensor) -> Tensor:
    """x @ x^T for each of (batch, b, rows). fp32 on CUDA: fp16 tensor-core products of per-feature scaled
    rows with an fp32 result (see the module docstring); elsewhere in x's dtype."""
    if x.dtype != torch.float32 or not x.shape[2] or not (x.is_cuda and hasattr(torch.ops.aten.bmm, "dtype")):
        return torch.bmm(x, x.transpose(1, 2))
    return scaled_half_gram(x)


def scaled_half_gram(x: Tensor) -> Tensor:
    """`gram` through fp16 inputs: rows scaled to max |x| = 1 (fp16's range cannot underflow a feature's own
    scale), multiplied with an fp32 result (`bmm(..., out_dtype)` on CUDA; elsewhere emulated in fp32, which
    is how the tests check the scaling)."""
    # One read of x for the scale and one read + fp16 write for the scaled copy: no fp32 temporaries (they
    # cost a refresh kernel time on a GPU: BENCHMARKS.md).
    scale = torch.linalg.vector_norm(x, ord=float("inf"), dim=2, keepdim=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    h = torch.mul(x, scale.reciprocal(), out=torch.empty(x.shape, dtype=torch.half, device=x.device))
    if h.is_cuda:
        prod = torch.bmm(h, h.transpose(1, 2), out_dtype=torch.float32)
    else:
        prod = torch.bmm(h.float(), h.float().transpose(1, 2))
    return prod * (scale * scale.transpose(1, 2))


def outer_blocks(cols: Tensor, groups: int, b: int) -> Tensor:
    """Diagonal b x b blocks of each group's sum over rows of outer products:
    (groups * n, rows) -> (groups, ceil(n / b), b, b); features past n are zero padding.
    A last, partial block of r < b features is multiplied at its own size (r^2 rows, not b^2) and placed in
    the zero block: a 144-wide factor at b = 128 costs 128^2 + 16^2 instead of 2 * 128^2, and no padded copy
    of the columns is made."""
    n = cols.shape[0] // groups
    full, r = divmod(n, b)
    x = cols.reshape(groups, n, -1)
    if not r:
        return gram(x.reshape(groups * full, b, -1)).reshape(groups, full, b, b)
    out = cols.new_zeros(groups, full + 1, b, b)
    if full:
        out[:, :full] = gram(x[:, : full * b].reshape(groups * full, b, -1)).reshape(groups, full, b, b)
    out[:, full, :r, :r] = gram(x[:, full * b :])
    return out


def _noop(*args: Any) -> None:
    return None


class DetachedHook:
    """Hook wrapper that weakly references its bound method and deep-copies/pickles as a no-op: a copied
    model (EMA, a reference network, torch.save of the whole module) neither drags the optimizer along
    nor feeds its statistics, and a dropped optimizer leaves only inert hooks behind."""

    def __init__(self, method: Callable) -> None:
        self.method = weakref.WeakMethod(method)

    def __call__(self, *args: Any) -> Any:
        fn = self.method()
        return None if fn is None else fn(*args)

    def __deepcopy__(self, memo: dict) -> Callable:
        return _noop

    def __reduce__(self) -> tuple:
        return (_noop_factory, ())


def _noop_factory() -> Callable:
    return _noop


def armed_hook(handle: Any, on: bool, register: Callable[[], Any]) -> Any:
    """A hook that exists only while `on`: the handle to keep (`register()`'s while on, None while off)."""
    if on and handle is None:
        return register()
    if not on and handle is not None:
        handle.remove()
        return None
    return handle


class LayerCapture:
    """Sums one layer's A and G statistics (diagonal blocks of sizes `blocks`) over its calls until
    `consume()`.

    `grad_scale()` returns the factor the backpropagated loss carries on top of a mean-reduced loss
    (fixed loss scale x GradScaler scale / accumulation steps); `forward_id()` numbers root forwards,
    so a module called several times in one forward counts its samples once.
    """

    def __init__(self, module: nn.Module, blocks: tuple[int, int], grad_scale: Callable[[], float],
                 forward_id: Callable[[], int], max_samples: int | None = None) -> None:
        self.module = module
        self.max_samples = max_samples
        self.a_block, self.g_block = blocks
        self.groups = getattr(module, "groups", 1)
        self.dtype = factor_dtype(module.weight)
        self.grad_scale = grad_scale
        self.forward_id = forward_id
        self.handle: Any = None
        self.removed = False
        self._reset()

    @property
    def enabled(self) -> bool:
        return self.handle is not None

    @enabled.setter
    def enabled(self, on: bool) -> None:
        # the hook exists only while armed for a refresh: the forwards between refreshes run no THOR code, so
        # torch.compile traces the bare model
        self.handle = armed_hook(self.handle, on and not self.removed,
                                 lambda: self.module.register_forward_hook(DetachedHook(self._on_forward)))

    def _reset(self) -> None:
        self.a_sum: Tensor | None = None
        self.g_sum: Tensor | None = None
        self.a_rows = 0
        self.g_rows = 0
        self.samples = 0
        self._last_forward = -1

    def _on_forward(self, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        if not (torch.is_grad_enabled() and isinstance(output, Tensor)
                and output.requires_grad):
            return
        x = inputs[0].detach()
        n = x.shape[0] if x.dim() > 1 else 1
        # max_samples: statistics from the first m samples only (an unbiased estimate of the same means);
        # the conv patch matrix and its outer products are most of a refresh's cost
        m = n if self.max_samples is None or x.dim() < 2 else min(n, self.max_samples)
        with torch.autocast(x.device.type, enabled=False):
            cols = input_columns(module, x[:m].to(self.dtype))
            a = outer_blocks(cols, self.groups, self.a_block)
        self.a_sum = a if self.a_sum is None else self.a_sum + a
        self.a_rows += cols.shape[1]
        if self._last_forward != self.forward_id():
            self._last_forward = self.forward_id()
            self.samples += m
        output.register_hook(lambda grad: self._on_grad(grad, n, m))

    def _on_grad(self, grad: Tensor, n: int, m: int) -> None:
        # The mean-reduced loss carries 1/n per sample; multiply back by n so G holds per-sample
        # gradient statistics (MindSpore's batch^2 factor), and divide out any loss scale.
        mult = n / self.grad_scale()
        with torch.autocast(grad.device.type, enabled=False):
            cols = output_columns(self.module, grad.detach()[:m].to(self.dtype))
            g = outer_blocks(cols, self.groups, self.g_block) * mult**2
        self.g_sum = g if self.g_sum is None else self.g_sum + g
        self.g_rows += cols.shape[1]

    def consume(self) -> tuple[Tensor, Tensor, float] | None:
        """Return (A, G, T) averaged over rows and clear the sums; None when A or G was not seen.

        T (positions per sample, summed over calls) is Hout*Wout for a conv called once and 1 for a
        linear layer on (N, features) inputs; it drives the conv 1/T damping rule.
        """
        a_sum, g_sum, a_rows, g_rows, samples = self.a_sum, self.g_sum, self.a_rows, self.g_rows, self.samples
        self._reset()
        if a_sum is None or g_sum is None or samples == 0:
            return None
        return a_sum / a_rows, g_sum / g_rows, a_rows / samples

    def remove(self) -> None:
        self.enabled = False
        self.removed = True
