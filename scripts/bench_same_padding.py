"""ResNet training-step time with padding="same" vs "torch", interleaved step by step.

    OMP_NUM_THREADS=1 python scripts/bench_same_padding.py --arch resnet50 --batch 8 --rounds 12

Each round times one SGD step of each model in alternating order (same weights, same batch) after warm-up
steps; the figure is the median over rounds of the per-round ratio same/torch, so drifts of a shared
machine hit both sides alike. Prints the CPU flags that matter for the result.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from torchboost.models import create_model


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next((l.split(":", 1)[1].split() for l in text.splitlines() if l.startswith("flags")), [])
    model = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")), "?")
    keep = [f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma")]
    return f"{model}; {' '.join(keep)}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    nets, opts = {}, {}
    for padding in ("torch", "same"):
        torch.manual_seed(0)
        nets[padding] = create_model(a.arch, num_classes=1000, padding=padding).to(memory_format=fmt).train()
        opts[padding] = torch.optim.SGD(nets[padding].parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(a.batch, 3, a.size, a.size).to(memory_format=fmt)
    y = torch.randint(0, 1000, (a.batch,))

    def step(padding: str) -> float:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = F.cross_entropy(nets[padding](x), y)
        opts[padding].zero_grad(set_to_none=True)
        loss.backward()
        opts[padding].step()
        return time.perf_counter() - t0

    for _ in range(a.warmup):
        for padding in ("torch", "same"):
            step(padding)
    ratios, times = [], {"torch": [], "same": []}
    for r in range(a.rounds):
        order = ("torch", "same") if r % 2 == 0 else ("same", "torch")
        t = {padding: step(padding) for padding in order}
        for padding in t:
            times[padding].append(t[padding])
        ratios.append(t["same"] / t["torch"])
    print(f"cpu: {cpu_flags()}")
    print(f"{a.arch} batch {a.batch} {a.size}px threads {a.threads} channels_last {a.channels_last} bf16 {a.bf16}")
    print(f"median step: torch {statistics.median(times['torch']):.3f}s same {statistics.median(times['same']):.3f}s")
    q = statistics.quantiles(ratios, n=4)
    print(f"same/torch step-time ratio: median {statistics.median(ratios):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f}, "
          f"{a.rounds} interleaved rounds)")


if __name__ == "__main__":
    main()
