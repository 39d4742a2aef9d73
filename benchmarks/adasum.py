"""Gradient averaging (DDP) vs Adasum at large global batch on real data, plus the cost of an Adasum step.

    .venv/bin/python benchmarks/adasum.py             # 4 gloo ranks on this machine, a few minutes
    .venv/bin/python benchmarks/adasum.py --quick     # smaller grid and budget (smoke run)

Accuracy: mnist5k (4,000 train / 1,000 test real MNIST digits), the PaddlePaddle MNIST CNN, 4 ranks with
per-rank batch 128 by default (global 512 = 1/8 of the training set: 7 updates per epoch; plain SGD
diverges at lr 0.1 at this batch, so averaging cannot simply take larger steps).
Both methods get the same learning-rate grid, the same init, the same sharded batch order and momentum
SGD; averaging all-reduces gradients with DDP, Adasum steps each rank locally and combines the weight
deltas (AdasumHook). Per method the best grid point is reported: fewest epochs to the target test
top-1, then the best final accuracy.

Communication: median over repetitions of the slowest rank's time for adasum_reduce vs dist.all_reduce
(sum) of the same tensors, for the MNIST CNN's parameters and for a 16 MB list of tensors.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from torchboost.boost.adasum import AdasumHook
from torchboost.distributed import adasum_reduce
from torchboost.data import build_loader
from torchboost.data.builtin import load_builtin
from torchboost.distributed import all_reduce_sum, init_distributed, launch, wrap_ddp
from torchboost.models import create_model

WORLD, MOMENTUM = 4, 0.9


def evaluate(net: torch.nn.Module, loader: torch.utils.data.DataLoader) -> float:
    """Exact test top-1 over the sharded test set (every sample once across ranks)."""
    net.eval()
    hits = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for x, y in loader:
            hits += torch.tensor([(net(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    net.train()
    all_reduce_sum(hits)
    return (hits[0] / hits[1]).item()


def train_run(method: str, lr: float, epochs: int, batch: int, rank: int) -> dict:
    """One training run on every rank: per-epoch test top-1 and cumulative training seconds (eval excluded)."""
    train_ds, test_ds = load_builtin("mnist5k", "train"), load_builtin("mnist5k", "test")
    train = build_loader(train_ds, batch, True, seed=0, rank=rank, world_size=WORLD)
    test = build_loader(test_ds, 500, False, rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    net = create_model("mnist_cnn", num_classes=10, in_chans=1)
    hook = AdasumHook(net) if method == "adasum" else None
    model = net if hook else wrap_ddp(net, init_distributed())
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    curve, seconds, diverged = [], [], False
    for epoch in range(epochs):
        train.sampler.set_epoch(epoch)
        dist.barrier()
        start = time.perf_counter()
        for x, y in train:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            if hook:
                hook.before_optimizer(net)
            opt.step()
            if hook:
                hook.after_optimizer(net)
        seconds.append((seconds[-1] if seconds else 0.0) + time.perf_counter() - start)
        curve.append(evaluate(net, test))
        # Diverged: NaN weights (averaging), skipped non-finite updates (Adasum undoes them, but a rank
        # whose momentum went NaN never recovers), or chance accuracy two epochs running (collapsed).
        # All three signals are identical on every rank, so every rank stops together.
        nan = (hook and hook.skipped_steps) or not all(bool(torch.isfinite(p).all()) for p in net.parameters())
        if nan or (epoch >= 2 and max(curve[-2:]) < 0.12):
            diverged = True
            break
    return {"curve": curve, "seconds": seconds, "diverged": diverged}


def comm_times(reps: int) -> dict:
    """Median ms (slowest rank per repetition) of Adasum vs all-reduce on the same tensors."""
    cnn = [p.detach().clone() for p in create_model("mnist_cnn", num_classes=10, in_chans=1).parameters()]
    g = torch.Generator().manual_seed(dist.get_rank())
    big = [torch.randn(2**18, generator=g) for _ in range(16)]  # 16 × 1 MB
    out = {}
    for name, tensors in (("mnist_cnn params", cnn), ("16 MB, 16 tensors", big)):
        numel = sum(t.numel() for t in tensors)
        for op, fn in (("all_reduce", lambda ts=tensors: dist.all_reduce(torch.cat([t.reshape(-1) for t in ts]))),
                       ("adasum", lambda ts=tensors: adasum_reduce(ts))):
            times = torch.zeros(reps, dtype=torch.float64)
            fn()  # warm-up (connections, allocations)
            for i in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times[i] = time.perf_counter() - t0
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            out[(name, op)] = (statistics.median(times.tolist()) * 1e3, numel)
    return out


def worker(grid: list[float], epochs: int, batch: int, reps: int) -> dict:
    info = init_distributed(timeout_s=300)
    runs = {}
    for lr in grid:
        for method in ("average", "adasum"):  # interleaved, so machine load hits both alike
            runs[f"{method}@{lr}"] = train_run(method, lr, epochs, batch, info.rank)
    return {"runs": runs, "comm": {f"{k[0]}|{k[1]}": v for k, v in comm_times(reps).items()}}


def epochs_to(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, acc in enumerate(curve) if acc >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 learning rates, 4 epochs (smoke run)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128, help="per-rank batch")
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.0125, 0.025, 0.05, 0.1])
    args = ap.parse_args()
    grid, epochs = ([0.05, 0.1], 4) if args.quick else (args.lrs, args.epochs)
    load_builtin("mnist5k", "train")  # parse the CSV once; forked ranks inherit the cache
    start = time.perf_counter()
    res = launch(worker, WORLD, grid, epochs, args.batch, 5 if args.quick else 20,
                 timeout_s=3600)[0]
    wall = time.perf_counter() - start

    gbatch = WORLD * args.batch
    print(f"mnist5k, MNIST CNN, {WORLD} gloo ranks × batch {args.batch} (global {gbatch}, "
          f"{4000 // gbatch} updates/epoch), momentum SGD {MOMENTUM}, target top-1 {args.target:.1%}, "
          f"budget {epochs} epochs\n")
    print(f"{'':>6} | {'gradient averaging (DDP)':^31} | {'Adasum':^31}")
    print(f"{'lr':>6} | {'epochs→target':>13} {'s→target':>8} {'final':>8} | {'epochs→target':>13} "
          f"{'s→target':>8} {'final':>8}")
    best: dict = {}
    for lr in grid:
        cells = []
        for method in ("average", "adasum"):
            run = res["runs"][f"{method}@{lr}"]
            reached = epochs_to(run["curve"], args.target)
            final = "diverged" if run["diverged"] else f"{run['curve'][-1]:.2%}"
            secs = f"{run['seconds'][reached - 1]:.0f}" if reached else "—"
            key = (reached or 10**6, -run["curve"][-1] if not run["diverged"] else 1.0)
            if method not in best or key < best[method][0]:
                best[method] = (key, lr, reached, final, run["curve"])
            cells.append(f"{reached or '—':>13} {secs:>8} {final:>8}")
        print(f"{lr:>6g} | {cells[0]} | {cells[1]}")
    print("\ntest top-1 per epoch at each method's best lr:")
    for method in ("average", "adasum"):
        _, lr, _, _, curve = best[method]
        print(f"  {method:>7} lr {lr:<6g} " + " ".join(f"{a:.3f}" for a in curve))
    print("\ncommunication, median ms of the slowest rank (4 ranks):")
    print(f"{'tensors':>20} {'floats':>10} {'all_reduce':>11} {'adasum':>9} {'ratio':>6}")
    for name in ("mnist_cnn params", "16 MB, 16 tensors"):
        (ar, numel), (ad, _) = res["comm"][f"{name}|all_reduce"], res["comm"][f"{name}|adasum"]
        print(f"{name:>20} {numel:>10,} {ar:>11.2f} {ad:>9.2f} {ad / ar:>6.2f}")
    (_, lr_a, ep_a, fin_a, _), (_, lr_s, ep_s, fin_s, _) = best["average"], best["adasum"]

    def fmt(ep: int | None) -> str:
        return f"{ep} epochs" if ep else f"not within {epochs} epochs"

    print(f"\n(total {wall:.0f} s)")
    print(f"headline: to {args.target:.0%} top-1 at global batch {gbatch}, best lr of each: averaging "
          f"{fmt(ep_a)} (lr {lr_a:g}, final {fin_a}) vs Adasum {fmt(ep_s)} (lr {lr_s:g}, final {fin_s})"
          + (f"; epochs ratio averaging/Adasum {ep_a / ep_s:.2f}x" if ep_a and ep_s else ""))


if __name__ == "__main__":
    main()
