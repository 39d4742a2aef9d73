"""Which device and which autocast dtype a run uses."""

from __future__ import annotations

import time
from typing import Optional

import torch

from torchboost.errors import ConfigError


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """"auto"/None: CUDA when available, else CPU; a named device must exist here."""
    if isinstance(name, torch.device):
        return name
    name = name or "auto"
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}", "use auto, cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):  # meta, mps, xpu...: training here runs on CPU or CUDA only
        raise ConfigError(f"device {name!r} is not a training device torchboost supports", "use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name} requested but CUDA is not available", "use cpu or auto (train.device=cpu)")
    return dev


def sync(device: torch.device) -> None:
    """Wait for the device's queued work: CUDA kernels run asynchronously, so read clocks only after this."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """What a benchmark reports as its device: the GPU's name, or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def amp_dtype_for(device: torch.device, requested: Optional[str | torch.dtype] = None) -> torch.dtype:
    """bf16 on CPU; on CUDA bf16 where the GPU supports it, else fp16 (which then needs loss scaling)."""
    if isinstance(requested, torch.dtype):
        return requested
    if requested in ("bfloat16", "float16"):
        return getattr(torch, requested)
    if requested not in (None, "auto"):
        raise ConfigError(f"amp_dtype={requested!r} is not a low-precision type",
                          "use 'auto', 'bfloat16', 'float16' or a torch dtype (None trains in float32)")
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def cpu_has_bf16() -> bool:
    """AVX-512-BF16 or AMX: without them oneDNN emulates bf16 and autocast slows training down."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, c, lambda: False)() for c in checks)


class StepClock:
    """Times a run of updates without making the host wait: on CUDA an event recorded on the stream after each
    update (the device's own clock), elsewhere the host's clock. Read at log time: `per_update_s` waits only
    for the last event, which the log line's own reads wait for anyway."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.first: Optional[torch.cuda.Event | float] = None
        self.last: Optional[torch.cuda.Event | float] = None
        self.updates = 0

    def mark(self) -> None:
        """Call once before the first update and after each."""
        if self.cuda:
            now: torch.cuda.Event | float = torch.cuda.Event(enable_timing=True)
            now.record()
        else:
            now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.updates += 1
        self.last = now

    def per_update_s(self) -> Optional[float]:
        """Mean seconds per update between the first mark and the last (None before an update)."""
        if not self.updates:
            return None
        if self.cuda:
            self.last.synchronize()
            return self.first.elapsed_time(self.last) / 1e3 / self.updates
        return (self.last - self.first) / self.updates
