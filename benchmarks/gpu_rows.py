"""The GPU rows of issue 32, one stage per call, for benchmarks/gpu_checks.sh. Each stage appends its rows (figure,
target, PASS/FAIL/info, device) to OUT/rows.jsonl as soon as they are measured, so a stage cut off by its
timeout keeps what it had; `table` prints them all (and each stage's exit from OUT/stages.tsv).

    python3 benchmarks/gpu_rows.py STAGE --out DIR [--device cuda|cpu] [--small] [--budget SECONDS]

  r50      ResNet-50 224 px, bf16 autocast, channels_last, batch 256, one synthetic float batch on the device,
           fused SGD (momentum 0.9, weight decay 1e-4, lr 1e-3, one param group) in EVERY loop, cuDNN benchmark
           on for all: Model/TrainStep with check_every=50 (the deferred check Model.train uses with a log
           interval) vs a plain loop over the SAME torchboost create_model("resnet50") (target >= 1.0x); reference
           rows: TrainStep with a host read per update (check_every=1) and the plain loop over torchvision's
           resnet50; then the compiled TrainStep (train.compile=default; --compile-modes adds max-autotune or
           cudagraphs; compile time printed once) vs the plain eager loop (target >= 1.2x)
  graphs   ResNet-20, batch 128, 28 px, SGD, built by the resnet20-mnist5k recipe (recipe.run.build_trainer:
           fused SGD, lr schedule, check_every = log_every = 10): eager vs train.compile=cudagraphs (>= 2x)
  thor     the resnet20-mnist5k-thor recipe's THOR vs the resnet20-mnist5k recipe's SGD, both eager as the
           recipes run: an epoch (31 updates: mnist5k's 4,000 training digits at batch 128, drop_last; THOR
           refreshing every 10) (<= 1.2x); THOR's refresh and plain updates vs SGD's over >= 5 refreshes
  syncs    host synchronisations per 100 updates (torch.cuda.set_sync_debug_mode): TrainStep check_every 1 and
           50, nonfinite=skip (max_nonfinite_steps=10), fp16 autocast + GradScaler, and the two recipes' Model
           (target <= 2 x ceil(100 / check_every); the sites are printed)
  factors  THOR's factor products (optim.thor.factors.gram: fp16 tensor cores, fp32 result) vs strict fp32,
           TF32 (set_float32_matmul_precision('high'), scoped and restored) and bf16 bmm (its fp32->bf16 cast
           included): time, and error against float64
  jpeg-rows  the rows of benchmarks/gpu_jpeg.py's output (--log FILE)
  table    the final table from OUT/rows.jsonl and OUT/stages.tsv

Every ratio comes from interleaved blocks (the variants in turn, the order rotated every round, each block
synchronised at both ends): the median of the per-round ratios [min, max]. --budget bounds a stage's rounds (a few
at least) so it ends before the shell's timeout. --small shrinks every size for a CPU smoke test (DEVICE=cpu
SMALL=1 bash benchmarks/gpu_checks.sh); CUDA-only parts then print "skipped: no CUDA".
Over 400 lines: one file per lent-GPU run keeps what a row measures next to the row.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

MNIST5K_TRAIN = 4000  # mnist5k's training split (data/builtin.py); batches of 128 with drop_last: 31 an epoch
MEASURED = ("r50", "graphs", "thor", "syncs", "factors")


class Run:
    """The stage's output folder, device, size and deadline; `emit` writes one row."""

    def __init__(self, args: argparse.Namespace, stage: str) -> None:
        self.out, self.small, self.stage, self.args = Path(args.out), args.small, stage, args
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.perf_counter() + args.budget
        self.device_name = args.device
        if stage in MEASURED:
            import torch

            from torchboost.train.device import device_name
            self.device = torch.device(args.device)
            self.cuda = self.device.type == "cuda"
            if args.device.startswith("cuda") and not torch.cuda.is_available():
                raise SystemExit("--device cuda, but this torch sees no CUDA device (DEVICE=cpu for a smoke test)")
            self.device_name = device_name(self.device) if self.cuda else \
                f"cpu ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def emit(self, key: str, row: str, figure: str, target: str = "info", ok: bool | None = None,
             value: float | None = None, verdict: str = "") -> None:
        verdict = verdict or ("info" if ok is None else ("PASS" if ok else "FAIL"))
        rec = {"key": key, "row": row, "figure": figure, "target": target, "pass": verdict,
               "device": self.device_name, "stage": self.stage, "value": value}
        with open(self.out / "rows.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"ROW {key} | {row} | {figure} | {target} | {verdict} | {self.device_name}", flush=True)

    def skip(self, key: str, row: str, why: str) -> None:
        self.emit(key, row, f"skipped: {why}", "-", verdict="skip")


@contextmanager
def guarded(run: Run, key: str, row: str) -> Iterator[None]:
    """A failing part becomes a FAIL row (its error in one line) and the stage goes on to the next part."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - reported, then the next part runs
        traceback.print_exc()
        msg = str(e).splitlines()[0][:160] if str(e) else ""
        run.emit(key, row, f"error: {type(e).__name__}: {msg}".replace("|", "/"), "runs", False)


# --- timing ---------------------------------------------------------------------------------------------------
def block(step: Callable[[], Any], n: int, device: Any) -> float:
    """Seconds per call of `n` calls of `step`, synchronised at both ends."""
    from torchboost.train.device import sync

    sync(device)
    t = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return (time.perf_counter() - t) / n


def interleave(run: Run, steps: dict[str, Callable[[], Any]], n: int, rounds: tuple[int, int],
               reserve: float = 0.0) -> dict[str, list[float]]:
    """Per-call seconds of each step, one block of `n` calls per round each, the order rotated every round;
    at least rounds[0] rounds, at most rounds[1], fewer past that when the deadline (less `reserve`) nears."""
    names, times = list(steps), {k: [] for k in steps}
    start = time.perf_counter()
    for r in range(rounds[1]):
        if r >= rounds[0] and run.left() - reserve < 1.5 * (time.perf_counter() - start) / r:
            break
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(block(steps[name], n, run.device))
    print(f"{len(times[names[0]])} interleaved rounds of {n}-call blocks: " + ", ".join(
        f"{k} {1e3 * statistics.median(v):.2f} ms" for k, v in times.items()), flush=True)
    return times


def ratio(times: dict[str, list[float]], num: str, den: str) -> tuple[float, float, float]:
    """Median, min, max over rounds of times[num] / times[den] (per-round pairs)."""
    r = [a / b for a, b in zip(times[num], times[den])]
    return statistics.median(r), min(r), max(r)


def fmt(r: tuple[float, float, float], extra: str = "") -> str:
    return f"{r[0]:.3f}x [{r[1]:.3f}, {r[2]:.3f}]" + (f"; {extra}" if extra else "")


def ms(times: dict[str, list[float]], name: str) -> float:
    return 1e3 * statistics.median(times[name])


def warm(step: Callable[[], Any], n: int, device: Any) -> list[float]:
    """Seconds of each of `n` warm-up calls (the first includes compiling, cuDNN's search, allocations)."""
    return [block(step, 1, device) for _ in range(n)]


def dynamo_stats() -> str:
    """What torch.compile did so far (graphs, recompiles): a recompiling step shows here, not only in its time."""
    try:
        from torch._dynamo.utils import counters

        return "dynamo " + ", ".join(f"{k} {v}" for k, v in {**counters["stats"], **{
            f"recompiles({k})": v for k, v in counters["recompiles"].items()}}.items())
    except Exception as e:  # noqa: BLE001 - a private counter; its absence costs only this line
        return f"dynamo counters unavailable ({type(e).__name__})"


def usable(run: Run, fns: dict[str, Callable[[], Any]], warmups: int, required: tuple[str, ...] = ()
           ) -> dict[str, Callable[[], Any]]:
    """Warm each variant up; one that raises is reported and left out (a required one ends the stage)."""
    kept = {}
    for name, fn in fns.items():
        try:
            warm(fn, warmups, run.device)
            kept[name] = fn
        except Exception as e:  # noqa: BLE001 - the other variants still run
            if name in required:
                raise
            traceback.print_exc()
            print(f"{name}: left out: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    return kept


def smoke_compile(run: Run) -> None:
    """--small on the CPU: torch.compile through aot_eager (dynamo and AOTAutograd, no code generation), so the
    smoke test runs the compiled code paths in seconds instead of minutes of C++ compiling on 2 cores."""
    import torch

    if run.cuda or not run.small or getattr(torch.compile, "smoke", False):
        return
    real = torch.compile

    def compile_(fn: Any = None, *, mode: Any = None, backend: Any = None, **kw: Any) -> Any:
        return real(fn, backend="aot_eager", **kw)
    compile_.smoke = True  # type: ignore[attr-defined]
    torch.compile = compile_  # type: ignore[assignment]
    print("torch.compile: backend aot_eager (CPU smoke test)")


# --- row 1: ResNet-50 -------------------------------------------------------------------------------------------
def stage_r50(run: Run) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from torchboost.models import create_model
    from torchboost.train.model import Model
    from torchboost.train.step import TrainStep

    dev, bf16 = run.device, torch.bfloat16
    size, batch, n, warmups, rounds = (32, 4, 2, 1, (3, 3)) if run.small else (224, 256, 10, 3, (4, 6))
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    x = torch.randn(batch, 3, size, size, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)
    tag = f"ResNet-50 {size}px b{batch} bf16 channels_last, fused SGD"
    print(f"{tag}: cudnn.benchmark on for every loop; torch {torch.__version__}", flush=True)

    def sgd(net: nn.Module) -> torch.optim.Optimizer:  # the one optimizer every loop uses
        return torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9, weight_decay=1e-4, fused=True)

    def plain(net: nn.Module) -> Callable[[], None]:
        net = net.to(dev, memory_format=torch.channels_last)
        opt = sgd(net)

        def step() -> None:
            with torch.autocast(dev.type, dtype=bf16):
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    def model_step(compile_mode: str = "none") -> Callable[[], Any]:
        net = create_model("resnet50").to(dev)
        model = Model(net, nn.CrossEntropyLoss(), sgd(net), device=dev, amp_dtype=bf16, channels_last=True,
                      check_every=50, compile=compile_mode)
        k = itertools.count()
        return lambda: model.train_step([(x, y)], next(k))

    steps: dict[str, Callable[[], Any]] = {"plain": plain(create_model("resnet50")), "step": model_step()}
    with guarded(run, "1b", "TrainStep check_every=1 (host read per update) speed / plain loop"):
        net = create_model("resnet50").to(dev, memory_format=torch.channels_last)
        per_update = TrainStep(net, nn.CrossEntropyLoss(), sgd(net), device=dev, autocast_dtype=bf16,
                               channels_last=True, check_every=1)
        k1 = itertools.count()
        steps["step1"] = lambda: per_update([(x, y)], next(k1))
    try:
        import torchvision

        steps["torchvision"] = plain(torchvision.models.resnet50())
    except Exception as e:  # noqa: BLE001 - torchvision is the GPU machine's; the CPU machine has none
        print(f"torchvision reference: skipped: {type(e).__name__}: {e}")
    steps = usable(run, steps, warmups, required=("plain", "step"))
    times = interleave(run, steps, n, rounds, reserve=0.6 * run.left())
    speed = ratio(times, "plain", "step")
    run.emit("1a", f"{tag}: Model/TrainStep (check_every=50) speed / plain loop, same torchboost resnet50",
             fmt(speed, f"{ms(times, 'step'):.1f} vs {ms(times, 'plain'):.1f} ms"), ">= 1.00x", speed[0] >= 1.0,
             speed[0])
    if "step1" in times:
        r = ratio(times, "plain", "step1")
        run.emit("1b", "TrainStep check_every=1 (host read per update) speed / plain loop",
                 fmt(r, f"{ms(times, 'step1'):.1f} ms"), "reference", None, r[0])
    if "torchvision" in times:
        r = ratio(times, "torchvision", "plain")
        run.emit("1c", "plain loop: torchboost resnet50 speed / torchvision resnet50 (model definition only)",
                 fmt(r, f"torchvision {ms(times, 'torchvision'):.1f} ms"), "reference", None, r[0])
    else:
        run.skip("1c", "plain loop: torchboost resnet50 speed / torchvision resnet50", "no torchvision")
    run.emit("1d", f"{tag}: img/s", ", ".join(f"{k} {batch / statistics.median(v):.0f}" for k, v in times.items()),
             "reference", None)
    for name in ("step", "step1", "torchvision"):
        steps.pop(name, None)
    per_update = net = None  # noqa: F841 - frees their networks before the compiled one is built
    if run.cuda:
        torch.cuda.empty_cache()
    smoke_compile(run)
    for mode in run.args.compile_modes:
        key = {"default": "1e", "max-autotune": "1f", "cudagraphs": "1g"}.get(mode, "1h")
        row = f"{tag}: compiled TrainStep (train.compile={mode}) speed / plain EAGER loop"
        if run.left() < (15 if run.small else 60):
            run.skip(key, row, f"{run.left():.0f} s left in the stage, too little to compile")
            continue
        with guarded(run, key, row):
            compiled = model_step(mode)
            first = warm(compiled, warmups + 2, dev)
            print(f"compile={mode}: first update (compiling) {first[0]:.1f} s, then "
                  + ", ".join(f"{t:.2f}" for t in first[1:]) + f" s; {dynamo_stats()}", flush=True)
            times = interleave(run, {"plain": steps["plain"], "compiled": compiled}, n, rounds)
            r = ratio(times, "plain", "compiled")
            run.emit(key, row, fmt(r, f"{ms(times, 'compiled'):.1f} ms, compile {first[0]:.0f} s"), ">= 1.20x",
                     r[0] >= 1.2, r[0])
            del compiled
            if run.cuda:
                torch.cuda.empty_cache()


# --- row 2: ResNet-20 through the recipes ------------------------------------------------------------------------
def recipe_step(run: Run, recipe: str, overrides: tuple[str, ...] = ()) -> tuple[Any, Callable[[], Any], int, int]:
    """(Model, one update on a fixed batch, updates per mnist5k epoch, batch size) as `torchboost train -c RECIPE` builds
    them (recipe.run.build_network / build_trainer), classes and channels set as the data would set them."""
    import torch

    from torchboost.dist import DistInfo
    from torchboost.recipe.load import load_config
    from torchboost.recipe.run import build_network, build_trainer

    cfg = load_config(recipe, ["model.num_classes=10", "model.in_chans=1", *overrides])
    per_epoch = MNIST5K_TRAIN // cfg.data.batch_size
    info = DistInfo(device=run.device)
    torch.manual_seed(0)
    net, hooks = build_network(cfg, None, run.device, per_epoch, info, print)
    model, _ = build_trainer(cfg, None, net, hooks, run.device, per_epoch, info)
    batch = 16 if run.small else cfg.data.batch_size
    x = torch.randn(batch, 1, 28, 28, device=run.device)
    y = torch.randint(0, 10, (batch,), device=run.device)
    k = itertools.count()
    ts = model.train_step
    print(f"{recipe}{' ' + ' '.join(overrides) if overrides else ''}: {type(model.optimizer).__name__}, batch "
          f"{batch}, check_every {ts.check_every}, compile {ts.options.compile}, undo on device "
          f"{ts.masks_on_device}", flush=True)
    return model, (lambda: ts([(x, y)], next(k))), per_epoch, batch


def stage_graphs(run: Run) -> None:
    n, rounds = (3, (3, 3)) if run.small else (50, (4, 9))
    _, eager, _, batch = recipe_step(run, "resnet20-mnist5k")
    row = f"ResNet-20 b{batch} 28px SGD step (resnet20-mnist5k recipe): eager / train.compile=cudagraphs"
    warm(eager, 5, run.device)
    smoke_compile(run)  # the CPU smoke test runs the compiled path through aot_eager
    with guarded(run, "2a", row):
        _, graphs, _, _ = recipe_step(run, "resnet20-mnist5k", ("train.compile=cudagraphs",))
        first = warm(graphs, 6, run.device)
        print(f"compile=cudagraphs: first update (compiling) {first[0]:.1f} s, then "
              + ", ".join(f"{t * 1e3:.1f}" for t in first[1:]) + f" ms; {dynamo_stats()}", flush=True)
        times = interleave(run, {"eager": eager, "cudagraphs": graphs}, n, rounds)
        r = ratio(times, "eager", "cudagraphs")
        figure = fmt(r, f"{ms(times, 'eager'):.2f} vs {ms(times, 'cudagraphs'):.2f} ms, compile {first[0]:.0f} s")
        if run.cuda:
            run.emit("2a", row, figure, ">= 2.00x", r[0] >= 2.0, r[0])
        else:
            run.skip("2a", row, f"no CUDA (aot_eager on the CPU: {figure})")


def stage_thor(run: Run) -> None:
    from torchboost.train.device import sync

    rounds = (2, 3) if run.small else (4, 10)
    mode = run.args.thor_compile
    extra = () if mode == "none" else (f"train.compile={mode}",)
    how = "eager" if mode == "none" else f"train.compile={mode}"
    if mode != "none":
        smoke_compile(run)
    sgd_model, sgd, per_epoch, batch = recipe_step(run, "resnet20-mnist5k", extra)
    thor_model, thor, _, _ = recipe_step(run, "resnet20-mnist5k-thor", extra)
    opt = thor_model.optimizer
    refresh_updates = [0]

    def thor_counted() -> None:  # counts the updates that refreshed (a host counter: no device read)
        before = opt.counters["refreshes"]
        thor()
        refresh_updates[0] += opt.counters["refreshes"] > before

    with guarded(run, "2b", f"ResNet-20 b{batch} epoch, THOR / SGD (recipes, {how})"):
        warm(sgd, per_epoch, run.device)
        warm(thor_counted, per_epoch, run.device)
        refresh_updates[0] = 0
        times = interleave(run, {"sgd": sgd, "thor": thor_counted}, per_epoch, rounds, reserve=0.25 * run.left())
        r = ratio(times, "thor", "sgd")
        epochs = len(times["thor"])
        pooled = sum(times["thor"]) / sum(times["sgd"])
        run.emit("2b", f"ResNet-20 b{batch} epoch ({per_epoch} updates), THOR / SGD (recipes, {how})",
                 fmt(r, f"{ms(times, 'thor') * per_epoch:.0f} vs {ms(times, 'sgd') * per_epoch:.0f} ms; pooled "
                        f"{pooled:.3f}x over {epochs} epochs with {refresh_updates[0]} refreshes"),
                 "<= 1.20x", r[0] <= 1.2, r[0])
    with guarded(run, "3a", "THOR refresh update / SGD update (ResNet-20, >= 5 refreshes)"):
        kinds: dict[str, list[float]] = {"refresh": [], "plain": [], "sgd": []}
        for _ in range(60 if run.small else 100):  # update by update, THOR then SGD, each synchronised
            if len(kinds["refresh"]) >= 5 and len(kinds["plain"]) >= 20 or run.left() < 3:
                break
            before = refresh_updates[0]
            sync(run.device)
            t = time.perf_counter()
            thor_counted()
            sync(run.device)
            kinds["refresh" if refresh_updates[0] > before else "plain"].append(time.perf_counter() - t)
            kinds["sgd"].append(block(sgd, 1, run.device))
        med = {k: 1e3 * statistics.median(v) if v else float("nan") for k, v in kinds.items()}
        ok = len(kinds["refresh"]) >= 5
        run.emit("3a", f"THOR refresh update / SGD update (ResNet-20 recipes, {len(kinds['refresh'])} refreshes)",
                 f"{med['refresh'] / med['sgd']:.2f}x; refresh {med['refresh']:.1f} ms, THOR plain {med['plain']:.2f} "
                 f"ms, SGD {med['sgd']:.2f} ms", ">= 5 refreshes timed", ok, med["refresh"] / med["sgd"])
        run.emit("3a'", "THOR plain (non-refresh) update / SGD update (ResNet-20 recipes)",
                 f"{med['plain'] / med['sgd']:.2f}x over {len(kinds['plain'])} updates", "info", None,
                 med["plain"] / med["sgd"])
    del sgd_model


# --- row 4: host synchronisations ---------------------------------------------------------------------------------
def count_syncs(run: Run, step: Callable[[], Any], updates: int) -> tuple[int, Counter]:
    """Host synchronisations in `updates` calls (after one untimed), and where the five most frequent come from."""
    import torch

    step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(updates):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    syncs = [w for w in seen if "synchroniz" in str(w.message)]
    return len(syncs), Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)


def stage_syncs(run: Run) -> None:
    import torch
    from torch import nn

    from torchboost.models import create_model
    from torchboost.train.step import TrainStep

    dev, batch, updates = run.device, (16 if run.small else 128), 100
    x, y = torch.randn(batch, 1, 28, 28, device=dev), torch.randint(0, 10, (batch,), device=dev)

    def train_step(**options: Any) -> tuple[TrainStep, Callable[[], Any]]:
        torch.manual_seed(0)
        net = create_model("resnet20", num_classes=10, in_chans=1).to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, fused=True)
        ts = TrainStep(net, nn.CrossEntropyLoss(), opt, device=dev, **options)
        k = itertools.count()
        return ts, lambda: ts([(x, y)], next(k))

    variants: list[tuple[str, str, Callable[[], tuple[Any, Callable[[], Any]]], int | None]] = [
        ("4a", "TrainStep check_every=1", lambda: train_step(check_every=1), None),
        ("4b", "TrainStep check_every=50", lambda: train_step(check_every=50), 50),
        ("4c", "TrainStep nonfinite=skip (max_nonfinite_steps=10), check_every=50",
         lambda: train_step(nonfinite="skip", max_nonfinite_steps=10, check_every=50), 50),
        ("4d", "TrainStep fp16 autocast + GradScaler, check_every=50",
         lambda: train_step(autocast_dtype=torch.float16, grad_scaler=torch.amp.GradScaler(dev.type),
                            check_every=50), 50),
        ("4e", "resnet20-mnist5k recipe's Model (SGD, check_every=10)", lambda: recipe(run, "resnet20-mnist5k"), 10),
        ("4f", "resnet20-mnist5k-thor recipe's Model (THOR, check_every=10)",
         lambda: recipe(run, "resnet20-mnist5k-thor"), None),
    ]
    for key, name, build, every in variants:
        row = f"host syncs per {updates} updates, ResNet-20 b{batch}: {name}"
        with guarded(run, key, row):
            ts, step = build()
            undo = getattr(ts, "masks_on_device", None)
            if not run.cuda:
                for _ in range(3):
                    step()
                run.skip(key, row, f"no CUDA (3 updates ran; undo on device {undo})")
                continue
            count, sites = count_syncs(run, step, updates)
            print(f"{name}: {count} syncs (undo on device {undo}); most frequent sites: {sites.most_common(5)}")
            target = "reference (~100)" if every is None and key == "4a" else (
                "info (refreshes)" if every is None else f"<= {2 * math.ceil(updates / every)} (O(100/{every}))")
            ok = None if every is None else count <= 2 * math.ceil(updates / every)
            run.emit(key, row, f"{count}" + (f"; top site {sites.most_common(1)[0][0]}" if count else ""), target,
                     ok, count)


def recipe(run: Run, name: str) -> tuple[Any, Callable[[], Any]]:
    model, step, _, _ = recipe_step(run, name)
    return model.train_step, step


# --- row 3: THOR's factor products --------------------------------------------------------------------------------
@contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """torch.set_float32_matmul_precision for a scope ('highest': strict fp32; 'high': TF32), restored after."""
    import torch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def stage_factors(run: Run) -> None:
    import torch

    from torchboost.optim.thor.factors import gram

    dev = run.device
    rows = 4096 if run.small else 802_816  # ResNet-50's first stage at batch 256: 256 x 56 x 56 positions
    n, rounds = (2, (3, 3)) if run.small else (10, (4, 7))
    torch.manual_seed(0)
    x = torch.randn(5, 128, rows, device=dev) * torch.logspace(-6, 3, 128, device=dev)[None, :, None]
    out_dtype = run.cuda and hasattr(torch.ops.aten.bmm, "dtype")

    def strict() -> torch.Tensor:
        with matmul_precision("highest"):
            return torch.bmm(x, x.transpose(1, 2))

    def tf32() -> torch.Tensor:
        with matmul_precision("high"):
            return torch.bmm(x, x.transpose(1, 2))

    def bf16() -> torch.Tensor:
        b = x.to(torch.bfloat16)
        if out_dtype:
            return torch.bmm(b, b.transpose(1, 2), out_dtype=torch.float32)
        return torch.bmm(b, b.transpose(1, 2)).float()

    fns = {"gram": lambda: gram(x), "fp32": strict, "tf32": tf32, "bf16": bf16}
    fns = usable(run, fns, 2, required=("gram",))
    errs: dict[str, float] = {}
    with guarded(run, "3e", "factor products: max error vs float64"):
        xd = x.double()
        ref = torch.bmm(xd, xd.transpose(1, 2))
        del xd
        d = ref.diagonal(dim1=1, dim2=2).sqrt()
        norm = d[:, :, None] * d[:, None, :]
        errs = {k: ((f().double() - ref).abs() / norm).max().item() for k, f in fns.items()}
        del ref, norm
    times = interleave(run, fns, n, rounds)
    base = f"factors.gram ({'fp16 tensor cores, fp32 result' if run.cuda else 'CPU: plain bmm'}) speed /"
    for key, other in (("3b", "fp32"), ("3c", "tf32"), ("3d", "bf16")):
        if other not in times:
            run.emit(key, f"{base} {other} bmm", "error: the comparison failed to run (see checks.log)", "runs", False)
            continue
        label = {"fp32": "strict fp32 bmm", "tf32": "TF32 bmm (precision 'high')",
                 "bf16": "bf16 bmm (cast included)"}[other]
        r = ratio(times, other, "gram")
        run.emit(key, f"{base} {label}, {rows} rows",
                 fmt(r, f"{ms(times, 'gram'):.2f} vs {ms(times, other):.2f} ms"), "info", None, r[0])
    if errs:
        run.emit("3e", f"factor products 5x128x128 over {rows} rows: max error vs float64 (/ sqrt(A_ii A_jj))",
                 ", ".join(f"{k} {v:.1e}" for k, v in errs.items()), "info", None, errs["gram"])


# --- row 5 and the table -------------------------------------------------------------------------------------------
def stage_jpeg_rows(run: Run) -> None:
    """Rows from gpu_jpeg.py's printed table: 'folder  img/s  min  max  median [min, max]' per source, or its
    headline line when the table's layout changed."""
    log = Path(run.args.log)
    text = log.read_text(errors="replace") if log.is_file() else ""
    m = re.search(r"^device: \S+ \((.*?)\);", text, re.M)
    run.device_name = m.group(1) if m else run.device_name
    m = re.search(r"^(\S+) (\d+)px batch (\d+)", text, re.M)
    what = f"{m.group(1)} {m.group(2)}px b{m.group(3)}" if m else "ResNet-50 224px b256"
    for key, name in (("5a", "folder"), ("5b", "shards")):
        row = f"JPEG training (data.decode=device) {name}/synthetic img/s, {what} (gpu_jpeg.py)"
        t = re.search(rf"^{name}\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+) \[([\d.]+), ([\d.]+)\]", text, re.M)
        h = re.search(rf"{name}/synthetic ([\d.]+)", text)
        if t:
            r = (float(t.group(1)), float(t.group(2)), float(t.group(3)))
        elif h:
            r = (float(h.group(1)),) * 3
        else:
            run.emit(key, row, f"no result in {log.name}", ">= 0.90", False)
            continue
        run.emit(key, row, fmt(r), ">= 0.90", r[0] >= 0.90, r[0])


def stage_table(run: Run) -> None:
    path, stages = run.out / "rows.jsonl", run.out / "stages.tsv"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    status = [line.split("\t") for line in stages.read_text().splitlines() if line.strip()] \
        if stages.is_file() else []
    have = {r["stage"] for r in rows} | {"jpeg" for r in rows if r["stage"] == "jpeg-rows"}
    for stage, rc, secs, limit in (s[:4] for s in status if len(s) >= 4):
        if rc != "0":
            why = f"timed out at {limit} s" if rc in ("124", "137") else f"exit {rc} after {secs} s"
            rows.append({"key": "-", "row": f"stage {stage}" + (" (rows above are what it measured)" if stage
                                                                   in have else ", no row measured"),
                         "figure": why, "target": "completes", "pass": "FAIL", "device": "-"})
    lines = ["| # | row | figure | target | pass | device |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["key"], r["row"], r["figure"], r["target"], r["pass"], r["device"]]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    count = Counter(r["pass"] for r in rows)
    spent = ", ".join(f"{s[0]} {s[2]}/{s[3]} s{'' if s[1] == '0' else ' rc ' + s[1]}" for s in status if len(s) >= 4)
    lines.append("")
    lines.append(f"PASS {count['PASS']}, FAIL {count['FAIL']}, info {count['info']}, skip {count['skip']}; stages: "
                 f"{spent}")
    text = "\n".join(lines)
    (run.out / "table.md").write_text(text + "\n")
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=[*MEASURED, "jpeg-rows", "table"])
    ap.add_argument("--out", required=True, help="folder of rows.jsonl / stages.tsv / table.md")
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--small", action="store_true", help="tiny sizes for a CPU smoke test")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds this stage may take (the deadline)")
    ap.add_argument("--compile-modes", nargs="+", default=["default"],
                    choices=["default", "max-autotune", "cudagraphs"], help="r50: train.compile modes to time")
    ap.add_argument("--thor-compile", default="none", choices=["none", "default", "cudagraphs"],
                    help="thor: build both recipes with this train.compile (default none: as the recipes run)")
    ap.add_argument("--log", help="jpeg-rows: gpu_jpeg.py's output")
    args = ap.parse_args()
    run = Run(args, args.stage)
    start = time.perf_counter()
    {"r50": stage_r50, "graphs": stage_graphs, "thor": stage_thor, "syncs": stage_syncs, "factors": stage_factors,
     "jpeg-rows": stage_jpeg_rows, "table": stage_table}[args.stage](run)
    if args.stage in MEASURED:
        print(f"stage {args.stage} took {time.perf_counter() - start:.0f} s on {run.device_name}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
