"""Training throughput fast paths, side by side in one run (interleaved repeats, medians).

CPU: the ResNet-50 224px training step through torchboost's Model/TrainStep in fp32 NCHW, channels_last,
bf16 autocast and bf16 + channels_last (+ torch.compile with --compile); the SGD update for-loop vs foreach
vs fused; zero_grad(set_to_none=True) vs zeroing; uint8 batches normalized on the device vs float batches
from the loader. Wall times are what a user sees; CPU-seconds per image are reported too because the
machine may be shared (then wall time also counts other people's work).
GPU (only when CUDA is available; `--gpu-only` runs just this, in < 5 minutes on one H100): ResNet-50 224px
bf16 + channels_last (+ compile) through Model/TrainStep vs a plain loop over torchvision's resnet50, the
fraction of the measured bf16 matmul peak, and THOR's step cost.

Run: .venv/bin/python benchmarks/throughput.py [--quick] [--model resnet18] [--batch 8] [--compile]
     python benchmarks/throughput.py --gpu-only [--gpu-batch 256] [--no-gpu-compile]
Ends with the headline: fastest CPU setting / fp32 NCHW (target >= 2.5x on ResNet-50).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from torchboost.bench import BenchOptions, make_step, time_steps
from torchboost.data import SyntheticImages, build_loader
from torchboost.models import create_model
from torchboost.train.device import cpu_has_bf16
from torchboost.train.step import prepare_input

CPU_CONFIGS = {  # name: (precision, channels_last)
    "fp32 NCHW": ("fp32", False), "fp32 channels_last": ("fp32", True),
    "bf16 NCHW": ("bf16", False), "bf16 channels_last": ("bf16", True),
}


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def interleave(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list]:
    """Run each fn `warmup` times, then `repeats` rounds of one call each, so load changes hit all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    runs: dict[str, list] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            runs[name].append(timed(fn))
    return runs


def med(runs: list[tuple[float, float]], i: int = 0) -> float:
    return statistics.median(r[i] for r in runs)


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int, reps: int = 5) -> float:
    """Measured dense matmul FLOP/s (2·n³ per product) — the peak the step is compared to."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    times = time_steps(lambda: a @ b, reps, 2, device)
    return 2 * n**3 / statistics.median(times)


def cpu_steps(args: argparse.Namespace) -> dict[str, float]:
    """Median images/s of the training step per config; prints the table."""
    device = torch.device("cpu")
    configs = dict(CPU_CONFIGS)
    if args.compile:  # compile the precision this CPU is fast at, channels_last
        precision = "bf16" if cpu_has_bf16() else "fp32"
        configs[f"{precision} channels_last compiled"] = (precision, True)
    steps = {}
    for name, (precision, cl) in configs.items():
        opts = BenchOptions(model=args.model, image_size=args.size, batch_size=args.batch, precision=precision,
                            channels_last=cl, compile=name.endswith("compiled"))
        steps[name] = make_step(opts, device)[0]
        if opts.compile:
            print(f"torch.compile: first step (compilation) took {timed(steps[name])[0]:.0f} s")
    runs = interleave(steps, args.repeats, warmup=1)
    base = med(runs["fp32 NCHW"])
    base_cpu = med(runs["fp32 NCHW"], 1)
    print(f"\n{args.model} {args.size}px batch {args.batch} training step, Model/TrainStep, SGD foreach, "
          f"{torch.get_num_threads()} threads, {args.repeats} interleaved repeats (median)")
    print(f"{'setting':<30}{'s/step':>8}{'img/s':>8}{'img/CPU-s':>11}{'vs fp32 (wall)':>16}{'(CPU)':>7}")
    ips = {}
    for name, r in runs.items():
        w, c = med(r), med(r, 1)
        ips[name] = args.batch / w
        print(f"{name:<30}{w:>8.2f}{args.batch / w:>8.2f}{args.batch / c:>11.2f}{base / w:>15.2f}x"
              f"{base_cpu / c:>6.2f}x")
    return ips


def sgd_update(model: str, repeats: int) -> None:
    """One optimizer.step() over every parameter: python for-loop vs foreach vs fused kernels."""
    net = create_model(model)
    params = list(net.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    kinds = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    fns = {k: torch.optim.SGD(params, lr=1e-6, momentum=0.9, weight_decay=1e-4, **kw).step for k, kw in kinds.items()}
    runs = interleave(fns, repeats)
    n = sum(p.numel() for p in params) / 1e6
    print(f"\nSGD momentum + weight decay update, {model} ({n:.1f}M parameters), median of {repeats}")
    for kind, r in runs.items():
        print(f"{kind:<12}{1e3 * med(r):>8.1f} ms   {med(runs['for-loop']) / med(r):.2f}x the for-loop")


def zero_grad_cost(model: str, repeats: int) -> None:
    """zero_grad(set_to_none=True) vs zeroing, measured with the backward that follows: with None the
    backward writes fresh gradients; with zeros it must read them back and add (plus the memset)."""
    net = create_model(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    x, y = torch.randn(2, 3, 64, 64), torch.randint(0, 1000, (2,))  # small input: parameter-bound regime

    def run(set_to_none: bool) -> Callable[[], None]:
        def f() -> None:
            opt.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(net(x), y).backward()
        return f
    runs = interleave({"set_to_none=True": run(True), "set_to_none=False": run(False)}, repeats)
    memset = interleave({"zero": lambda: opt.zero_grad(set_to_none=False)}, repeats)["zero"]  # grads exist now
    print(f"\nzero_grad, {model}: zeroing the gradients alone takes {1e3 * med(memset):.1f} ms; "
          "with the next forward + backward (batch 2, 64px):")
    for name, r in runs.items():
        print(f"{name:<20}{1e3 * med(r):>8.1f} ms/step")


def uint8_vs_float(batch: int, size: int, repeats: int, batches: int = 8) -> None:
    """Bytes and time per batch through one loader worker: uint8 + normalize on the device vs float32."""
    fns, sizes = {}, {}
    for uint8 in (True, False):
        loader = build_loader(SyntheticImages(10**6, 1000, 3, size, uint8=uint8), batch, True, workers=1)
        it = iter(loader)
        x, _ = next(it)  # the worker is up
        name = "uint8 -> normalize on device" if uint8 else "float32 from the loader"
        sizes[name] = x.numel() * x.element_size()
        norm = (loader.dataset.mean, loader.dataset.std)
        fns[name] = lambda it=it, norm=norm: [prepare_input(next(it)[0], torch.device("cpu"), True, norm)
                                              for _ in range(batches)]
    runs = interleave(fns, repeats, warmup=0)
    print(f"\ninput batches {batch}x3x{size}x{size} through 1 loader worker (+ normalize and channels_last on "
          f"the device), median of {repeats} x {batches} batches")
    for name, r in runs.items():
        print(f"{name:<32}{sizes[name] / 2**20:>7.2f} MiB/batch{1e3 * med(r) / batches:>9.1f} ms/batch")


def cpu_section(args: argparse.Namespace) -> None:
    print(f"CPU: {torch.backends.cpu.get_cpu_capability()}, bf16 units (AVX-512-bf16/AMX): {cpu_has_bf16()}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, torch {torch.__version__}")
    cpu = torch.device("cpu")
    fp32, bf16 = matmul_rate(cpu, torch.float32, 1024), matmul_rate(cpu, torch.bfloat16, 1024)
    print(f"matmul 1024^3: fp32 {fp32 / 1e9:.1f} GFLOP/s, bf16 {bf16 / 1e9:.1f} GFLOP/s ({bf16 / fp32:.2f}x)")
    ips = cpu_steps(args)
    if not args.quick:
        sgd_update(args.model, args.repeats + 2)
        zero_grad_cost(args.model, args.repeats + 2)
    uint8_vs_float(args.batch, args.size, args.repeats)
    best = max(ips, key=ips.get)
    print(f"\nload average now {os.getloadavg()[0]:.1f}")
    recommend(ips)
    why = "" if cpu_has_bf16() else "; this CPU has no bf16 units, so bf16 autocast is emulated"
    print(f"headline: fastest CPU setting ({best}) = {ips[best] / ips['fp32 NCHW']:.2f}x fp32 NCHW images/s on "
          f"{args.model} {args.size}px batch {args.batch} (target >= 2.5x{why})")


def recommend(ips: dict[str, float]) -> None:
    """CPU defaults from this run's numbers: a fast path is recommended only where it measured >= 5% faster."""
    best = {p: max(ips[f"{p} NCHW"], ips[f"{p} channels_last"]) for p in ("fp32", "bf16")}
    precision = "bf16" if best["bf16"] >= 1.05 * best["fp32"] else "fp32"
    cl = ips[f"{precision} channels_last"] / ips[f"{precision} NCHW"]
    line = (f"CPU defaults: {precision} (best bf16 / best fp32 = {best['bf16'] / best['fp32']:.2f}x), channels_last "
            f"{'on' if cl >= 1.05 else 'off'} ({cl:.2f}x in {precision})")
    for name in (k for k in ips if k.endswith(" compiled")):
        ratio = ips[name] / ips[name.removesuffix(" compiled")]
        line += f", torch.compile {'on' if ratio >= 1.05 else 'off'} ({ratio:.2f}x eager)"
    print(line)


def forward_macs(net: torch.nn.Module, size: int, device: torch.device) -> int:
    """Multiply-adds of one forward pass, counted from Conv2d/Linear shapes with hooks (batch 1)."""
    total = [0]

    def count(m: torch.nn.Module, inputs: tuple, out: torch.Tensor) -> None:
        per_output = m.weight[0].numel()  # Cin/groups·kh·kw for a conv, in_features for a linear layer
        total[0] += out.numel() * per_output
    hooks = [m.register_forward_hook(count) for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        net.eval()(torch.zeros(1, 3, size, size, device=device))
    for h in hooks:
        h.remove()
    return total[0]


def plain_loop(device: torch.device, batch: int, size: int, compiled: bool, steps: int, warmup: int) -> float:
    """Median step seconds of a hand-written loop over torchvision's resnet50 (bf16 autocast, channels_last), with
    the optimizer `make_step`'s Model gets: the registry's fused momentum SGD (momentum 0.9, no weight decay), so
    only the loop and the model definition differ (benchmarks/gpu_rows.py r50 also times the same model)."""
    import torchvision  # only here: torchvision is a CUDA build and cannot even be imported on CPU torch

    net = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9, fused=True)
    fwd = torch.compile(net) if compiled else net
    x = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return statistics.median(time_steps(step, steps, warmup, device))


def thor_cost(device: torch.device, opts: BenchOptions, steps: int, frequency: int = 10, profile: bool = False,
              **options: object) -> dict[str, float]:
    """Median seconds of THOR steps that reuse the inverses and of refresh steps (factors + inversions);
    `options` go to THOR (factor_samples=32, split_dim=256...). profile: print the refresh step's top ops."""
    from torchboost.optim.thor import THOR

    # A tiny lr: random labels must not drive the weights to inf (THOR then skips the non-finite refreshes).
    step, model = make_step(opts, device, lambda net: THOR(net, lr=1e-4, damping=0.03, weight_decay=5e-4,
                                                           frequency=frequency, **options))
    opt = model.optimizer
    for _ in range(frequency):  # warmup includes one refresh
        step()
    plain, refresh = [], []
    for _ in range(steps):
        due = opt.update_index % frequency == 0  # this update recomputes factors and inverses
        (refresh if due else plain).append(time_steps(step, 1, 0, device)[0])
    if profile:  # where a refresh step's time goes: the ops that decide what to make cheaper
        while opt.update_index % frequency:
            step()
        activity = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                            if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activity) as prof:
            time_steps(step, 1, 0, device)
        key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=50))
    bad = {k: v for k, v in opt.counters.items() if k in ("capture_failures", "inverse_failures") and v}
    if bad or not opt.counters["refreshes"]:  # a skipped refresh would look like a cheap one
        print(f"THOR refreshes did not all happen: {dict(opt.counters)}")
    return {"plain": statistics.median(plain), "refresh": statistics.median(refresh) if refresh else float("nan")}


def thor_options(text: str) -> dict[str, object]:
    """'factor_samples=32,split_dim=256' -> THOR keyword arguments ('' -> THOR's defaults)."""
    import yaml

    return {k.strip(): yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in text.split(",") if kv)}


def gpu_row(fn: Callable[[], float], label: str) -> float | None:
    """Median step seconds, or None (printed) when this row cannot run here: one failure (a missing
    torchvision, a compiler problem) must not cost the rest of a lent GPU's time."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 — reported, then the next row runs
        print(f"{label:<44} failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        return None


def gpu_section(device: torch.device, batch: int, size: int, steps: int, warmup: int, compile_: bool,
                thor_variants: tuple[str, ...] = ("",), thor_profile: bool = False) -> None:
    """ResNet-50 bf16 + channels_last: Model/TrainStep vs a plain torchvision loop, % of matmul peak, THOR."""
    start = time.perf_counter()
    torch.backends.cudnn.benchmark = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = matmul_rate(device, torch.bfloat16, 8192 if device.type == "cuda" else 512, reps=10)
    flops = 3 * 2 * forward_macs(create_model("resnet50").to(device), size, device)  # fwd + 2x bwd, 2 per MAC
    print(f"\nGPU section: {name}, torch {torch.__version__}; measured bf16 matmul peak {peak / 1e12:.1f} "
          f"TFLOP/s; ResNet-50 {size}px training = {flops / 1e9:.1f} GFLOP/image (3 x forward, 2 FLOPs per MAC)")
    print(f"{'ResNet-50 bf16 channels_last, fused SGD':<44}{'batch':>6}{'ms/step':>9}{'img/s':>9}{'% peak':>8}"
          f"{'vs plain':>9}")
    ours: dict[bool, float | None] = {}
    plain: dict[bool, float | None] = {}
    for compiled in (False, True) if compile_ else (False,):
        tag = " compiled" if compiled else ""
        opts = BenchOptions(model="resnet50", image_size=size, batch_size=batch, precision="bf16",
                            channels_last=True, compile=compiled)
        ours[compiled] = gpu_row(lambda: statistics.median(time_steps(make_step(opts, device)[0], steps, warmup,
                                                                      device)), f"Model/TrainStep{tag}")
        plain[compiled] = None if device.type != "cuda" else gpu_row(
            lambda: plain_loop(device, batch, size, compiled, steps, warmup), f"plain loop, torchvision{tag}")
        for label, sec in ((f"Model/TrainStep{tag}", ours[compiled]), (f"plain loop, torchvision{tag}",
                                                                       plain[compiled])):
            if sec is not None:
                vs = f"{plain[compiled] / sec:>8.2f}x" if plain[compiled] else ""
                share = 100 * batch / sec * flops / peak
                print(f"{label:<44}{batch:>6}{1e3 * sec:>9.1f}{batch / sec:>9.0f}{share:>7.1f}%{vs}")
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next row's activations need the memory
    sgd = ours[False]
    opts = BenchOptions(model="resnet50", image_size=size, batch_size=batch, precision="bf16", channels_last=True)
    for variant in thor_variants:
        label = f"THOR[{variant}]" if variant else "THOR"
        thor = gpu_row(lambda: thor_cost(device, opts, steps, profile=thor_profile and not variant,
                                         **thor_options(variant)), f"{label} (eager)")
        if thor and sgd:
            cost = {f: (thor["plain"] * (f - 1) + thor["refresh"]) / f / sgd for f in (100, 834)}
            print(f"{label}: plain step {1e3 * thor['plain']:.1f} ms, refresh step {1e3 * thor['refresh']:.1f} ms, "
                  f"SGD {1e3 * sgd:.1f} ms; amortized {cost[100]:.2f}x SGD at frequency 100, {cost[834]:.2f}x at 834")
    print(f"GPU section took {time.perf_counter() - start:.0f} s")
    measured = {c: sec for c, sec in ours.items() if sec}
    if measured:
        c = min(measured, key=measured.get)
        vs = f", {plain[c] / measured[c]:.2f}x the plain loop{' (both compiled)' if c else ''}" if plain.get(c) else ""
        print(f"headline (GPU): Model/TrainStep{' compiled' if c else ''} {batch / measured[c]:.0f} img/s on {name}{vs}"
              " (targets: >= 1.0x the plain loop, >= 3000 img/s on one H100)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50", help="resnet18 for a faster run")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=None, help="default 8 (4 with --quick)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3, 2 with --quick)")
    ap.add_argument("--quick", action="store_true", help="smaller batch, fewer repeats, no optimizer micro-benchmarks")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile on CPU (minutes to compile)")
    ap.add_argument("--gpu-only", action="store_true", help="only the CUDA section")
    ap.add_argument("--gpu-batch", type=int, default=256)
    ap.add_argument("--gpu-steps", type=int, default=30)
    ap.add_argument("--no-gpu-compile", action="store_true")
    ap.add_argument("--thor", nargs="+", default=[""], metavar="K=V,K=V",
                    help="THOR variants to cost on the GPU ('' = defaults), e.g. '' factor_samples=32")
    ap.add_argument("--thor-profile", action="store_true", help="print the default THOR refresh step's top ops")
    args = ap.parse_args()
    args.batch = args.batch or (4 if args.quick else 8)
    args.repeats = args.repeats or (2 if args.quick else 3)
    torch.manual_seed(0)
    if not args.gpu_only:
        cpu_section(args)
    if torch.cuda.is_available():
        gpu_section(torch.device("cuda"), args.gpu_batch, 224, args.gpu_steps, 10, not args.no_gpu_compile,
                    tuple(args.thor), args.thor_profile)
    else:
        print("GPU section: no CUDA device here; run `python benchmarks/throughput.py --gpu-only` on a GPU machine")


if __name__ == "__main__":
    main()
